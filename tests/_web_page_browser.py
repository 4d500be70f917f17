"""Headless Chromium driven over the Chrome DevTools Protocol (websocket), for the web page tests.

One browser process per `Browser`; every wait is bounded; `close()` ends the process it started.
"""

from __future__ import annotations

import base64
import json
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import websocket

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
)


class BrowserError(AssertionError):
    """The browser failed to start, a command failed, or a wait ran out."""


class Browser:
    def __init__(self, executable: str, profile_dir: Path, *, timeout_s: float = 30.0) -> None:
        profile_dir.mkdir(parents=True, exist_ok=True)
        self.timeout_s = timeout_s
        self.events: list[dict[str, Any]] = []
        self._next_id = 0
        self._proc = subprocess.Popen(
            [
                executable,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile_dir}",
                "--remote-debugging-port=0",
                "--window-size=1366,900",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            port = self._devtools_port(profile_dir / "DevToolsActivePort")
            self._ws = websocket.create_connection(
                self._page_ws_url(port), timeout=timeout_s, suppress_origin=True, enable_multithread=False
            )
            self.send("Page.enable")
            self.send("Runtime.enable")
        except BaseException:
            self.close()
            raise

    def _devtools_port(self, marker: Path) -> int:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise BrowserError(f"chromium exited with {self._proc.returncode} before DevTools came up")
            if marker.exists() and marker.read_text().strip():
                return int(marker.read_text().split()[0])
            time.sleep(0.05)
        raise BrowserError("chromium did not open its DevTools port in time")

    def _page_ws_url(self, port: int) -> str:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as resp:
                pages = [t for t in json.load(resp) if t.get("type") == "page"]
            if pages:
                return str(pages[0]["webSocketDebuggerUrl"])
            time.sleep(0.05)
        raise BrowserError("chromium has no page target")

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        msg_id = self._next_id
        self._ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            msg = json.loads(self._ws.recv())
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise BrowserError(f"{method}: {msg['error']}")
                return dict(msg.get("result", {}))
            if "method" in msg:
                self.events.append(msg)
        raise BrowserError(f"{method}: no answer in {self.timeout_s}s")

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"JS error in {expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, *, timeout_s: float = 30.0, what: str = "") -> Any:
        """Poll a JS expression until it is truthy; return its value."""
        deadline = time.monotonic() + timeout_s
        guarded = f"(() => {{ try {{ return ({expression}); }} catch (e) {{ return false; }} }})()"  # page may be loading
        while time.monotonic() < deadline:
            value = self.evaluate(guarded)
            if value:
                return value
            time.sleep(0.1)
        banner = self.evaluate("document.getElementById('connection')?.textContent || ''")
        raise BrowserError(
            f"timed out after {timeout_s}s waiting for {what or expression}; "
            f"page banner: {banner!r}; page errors: {self.page_errors()[:3]}"
        )

    def navigate(self, url: str, *, width: int = 1366, height: int = 900) -> None:
        self.send(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=width < 600,
        )
        self.send("Page.navigate", url=url)

    def click(self, selector: str) -> None:
        """A real mouse click at the centre of the element (scrolled into view first)."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return {x: r.x + r.width / 2, y: r.y + r.height / 2, w: r.width}; })()"
        )
        if not box or not box["w"]:
            raise BrowserError(f"nothing visible to click at {selector}")
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent", type=kind, x=box["x"], y=box["y"], button="left", clickCount=1
            )

    def visible(self, selector: str) -> bool:
        """Rendered with a box (not display:none, not inside a hidden ancestor)."""
        return bool(self.evaluate(
            f"(e => !!e && e.getClientRects().length > 0)(document.querySelector({json.dumps(selector)}))"
        ))  # fmt: skip

    def type_text(self, text: str) -> None:
        self.send("Input.insertText", text=text)

    def screenshot(self, path: Path) -> bytes:
        data = base64.b64decode(
            self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        )
        path.write_bytes(data)
        return data

    def page_errors(self) -> list[str]:
        """Uncaught exceptions and console.error calls seen so far."""
        out = []
        for e in self.events:
            if e["method"] == "Runtime.exceptionThrown":
                out.append(json.dumps(e["params"]["exceptionDetails"])[:300])
            elif e["method"] == "Runtime.consoleAPICalled" and e["params"]["type"] == "error":
                out.append(json.dumps(e["params"]["args"])[:300])
        return out

    def close(self) -> None:
        ws = getattr(self, "_ws", None)
        if ws is not None:
            ws.close()
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)


@contextmanager
def serve(app: Any, port: int) -> Iterator[str]:
    """Run an ASGI app under uvicorn on 127.0.0.1:port in a thread; yields its base URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="web-page-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        if not server.started:
            raise BrowserError("the page's server did not start")
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
