"""Upload the dashboard to a running Grafana through grafana-client (POST /api/dashboards/db)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ._dashboard import build_dashboard
from .errors import GrafanaPushFailed, GrafanaRejected, GrafanaUnreachable, InvalidGrafanaURL

__all__ = ["PushResult", "push_dashboard"]


@dataclass(frozen=True)
class PushResult:
    uid: str
    url: str  # Grafana's path of the dashboard, e.g. /d/infersight-overview/infersight-llm-serving
    version: int
    folder_uid: str | None


def _check_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidGrafanaURL(f"not an http(s) URL with a host: {url!r}")
    try:
        _ = parts.port
    except ValueError as exc:
        raise InvalidGrafanaURL(f"bad port in {url!r}") from exc


def _connect(url: str, token: str, timeout_s: float) -> Any:
    from grafana_client import GrafanaApi

    return GrafanaApi.from_url(url, credential=token, timeout=timeout_s)


def _folder_uid(api: Any, folder: str) -> str:
    """The uid of the folder whose title or uid is `folder`; created when there is none."""
    for item in api.folder.get_all_folders():
        if folder in (item.get("uid"), item.get("title")):
            return str(item["uid"])
    return str(api.folder.create_folder(folder)["uid"])


def push_dashboard(
    url: str,
    token: str,
    *,
    folder: str | None = None,
    message: str = "infersight dashboards push",
    timeout_s: float = 10.0,
    connect: Callable[[str, str, float], Any] = _connect,
) -> PushResult:
    """Create or overwrite the infersight dashboard in Grafana at `url` with a bearer `token`.

    `folder` is a folder title or uid (created when missing); None puts it in General.
    """
    _check_url(url)
    if not token:
        raise InvalidGrafanaURL("an API token is required (a Grafana service-account token)")
    from grafana_client.client import GrafanaClientError, GrafanaException, GrafanaServerError

    api = connect(url, token, timeout_s)
    try:
        folder_uid = _folder_uid(api, folder) if folder else None
        body: dict[str, Any] = {"dashboard": build_dashboard(), "overwrite": True, "message": message}
        if folder_uid is not None:
            body["folderUid"] = folder_uid
        answer = api.dashboard.update_dashboard(body)
    except (GrafanaClientError, GrafanaServerError) as exc:
        raise GrafanaRejected(int(exc.status_code), _reason(exc.response, exc.message)) from exc
    except GrafanaException as exc:  # timeouts and transport errors that grafana-client wraps
        raise GrafanaUnreachable(f"no answer from Grafana at {url}: {exc.message}") from exc
    except OSError as exc:  # connection refused, unknown host (niquests' errors are OSErrors)
        raise GrafanaUnreachable(f"cannot reach Grafana at {url}: {_root_cause(exc)}") from exc
    except ValueError as exc:  # a 2xx answer whose body is not JSON: not Grafana's API
        raise GrafanaPushFailed(f"{url} did not answer like Grafana's HTTP API: {exc}") from exc
    if not isinstance(answer, dict) or "uid" not in answer:
        raise GrafanaPushFailed(f"unexpected answer from Grafana: {str(answer)[:200]}")
    return PushResult(
        uid=str(answer["uid"]),
        url=str(answer.get("url", "")),
        version=int(answer.get("version", 0)),
        folder_uid=folder_uid,
    )


def _root_cause(exc: BaseException) -> str:
    """The innermost OS-level reason ("Connection refused") instead of a transport's wrapped chain."""
    reason = str(exc)
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            break
        if isinstance(seen, OSError) and seen.strerror:
            reason = seen.strerror
        seen = seen.__cause__ or seen.__context__
    return reason[:200]


def _reason(response: object, fallback: str) -> str:
    if isinstance(response, dict) and response.get("message"):
        return str(response["message"])
    return str(response or fallback)[:200]
