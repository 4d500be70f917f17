"""Where the built-in web page's static assets live, for the service to mount."""

from __future__ import annotations

from pathlib import Path

__all__ = ["web_assets_dir"]


def web_assets_dir() -> Path:
    """The directory holding index.html, app.js and style.css (served as-is, no build step).

    The page uses only relative URLs (`app.js`, `api/v1/overview`), so it works wherever
    the directory is mounted, as long as index.html is served at the mount's root.
    """
    return Path(__file__).resolve().parent / "web"
