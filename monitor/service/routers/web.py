"""`/`: the built-in web page (assets written by infersight.dashboards under web/)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["mount", "web_root"]


def web_root() -> Path | None:
    try:
        root = Path(str(resources.files("infersight.dashboards").joinpath("web")))
    except ModuleNotFoundError:
        return None
    return root if (root / "index.html").is_file() else None


def mount(app: FastAPI) -> None:
    root = web_root()
    if root is not None:
        app.mount("/", StaticFiles(directory=root, html=True), name="web")
        return

    @app.get("/", include_in_schema=False)
    async def no_page() -> HTMLResponse:
        return HTMLResponse(
            "<!doctype html><title>infersight</title><p>The web page assets are not installed; "
            "the API is at <a href='/docs'>/docs</a>.</p>",
            status_code=200,
        )
