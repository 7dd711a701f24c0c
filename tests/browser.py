"""Open an HTML file in headless Chromium and report what rendered: title, visible text, images.

How Python drives Chromium: the DevTools protocol over a WebSocket, with the `websockets` package
the venv already pins (Airflow's server needs it). That adds no package and no driver binary:
Selenium would need chromium-driver, whose version must match the browser's, and a pip package
with its own dependency tree. The `--dump-dom` / `--screenshot` flags need nothing at all but
cannot tell whether an <img> actually loaded (the DOM looks the same when the file is missing),
which is the one thing a report test must check. The protocol exchange used here is small:
create a page, navigate, wait for its load event (fired once every image has loaded or failed),
evaluate one expression. https://chromedevtools.github.io/devtools-protocol/

    page = render(report_dir / "index.html")  # skips (or fails under CI) without Chromium
    assert page.title == "..." and all(img.loaded for img in page.images)
"""

from __future__ import annotations

import html.parser
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import connect

# Debian and Ubuntu name the binary chromium (or chromium-browser); Google's build google-chrome.
BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# The page's state as JSON: images are loaded when complete with a decoded width (a missing or
# corrupt file is complete too, but with naturalWidth 0).
_PROBE = """JSON.stringify({
  title: document.title,
  text: document.body ? document.body.innerText : "",
  images: Array.from(document.images, img => ({
    src: img.getAttribute("src"), loaded: img.complete && img.naturalWidth > 0})),
})"""


@dataclass(frozen=True)
class RenderedImage:
    src: str  # the src attribute as written in the page
    loaded: bool  # complete and naturalWidth > 0


@dataclass(frozen=True)
class RenderedPage:
    title: str
    text: str  # document.body.innerText: what a reader sees, without markup or hidden elements
    images: list[RenderedImage]


class LinkParser(html.parser.HTMLParser):
    """The href of every link (<a>) of an HTML page fed to it, in order (no browser needed)."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs += [v for k, v in attrs if k == "href" and v]


def in_ci() -> bool:
    """True when the CI variable is set to a true value (CI=true, as CI services set it)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def find_chromium() -> str | None:
    """The first of BINARIES on PATH (infra/chromium.sh asks too, before installing one)."""
    return next((path for path in map(shutil.which, BINARIES) if path), None)


def chromium_binary() -> str:
    """The Chromium executable; skips the calling test without one, fails it under CI."""
    path = find_chromium()
    if path:
        return path
    reason = f"no Chromium on PATH (looked for {', '.join(BINARIES)}); install Debian's chromium package"
    if in_ci():
        pytest.fail(f"{reason}: CI must run the browser tests (`make test` installs it: infra/chromium.sh)",
                    pytrace=False)
    pytest.skip(reason)


class _DevTools:
    """A minimal DevTools protocol client: numbered calls, events kept until asked for."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self._ws = connect(url, max_size=None, open_timeout=timeout_s)
        self._timeout_s = timeout_s
        self._next_id = 0
        self._events: list[dict[str, Any]] = []

    def close(self) -> None:
        self._ws.close()

    def _receive(self, deadline: float) -> dict[str, Any]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"Chromium did not answer within {self._timeout_s} s")
        return json.loads(self._ws.recv(timeout=remaining))

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        self._ws.send(json.dumps(message))
        deadline = time.monotonic() + self._timeout_s
        while True:
            reply = self._receive(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"DevTools {method} failed: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self._events.append(reply)

    def wait_event(self, method: str, session: str) -> dict[str, Any]:
        deadline = time.monotonic() + self._timeout_s
        while True:
            for i, event in enumerate(self._events):
                if event["method"] == method and event.get("sessionId") == session:
                    return self._events.pop(i)
            reply = self._receive(deadline)
            if "method" in reply:
                self._events.append(reply)


def _start(binary: str, profile: Path, timeout_s: float) -> tuple[subprocess.Popen[bytes], str]:
    """Start headless Chromium; returns the process and its browser-level DevTools WebSocket URL."""
    args = [
        binary,
        "--headless",
        # Chromium's sandbox needs user namespaces that containers and root (CI runs as root) lack;
        # the only page opened is a local file the test itself wrote.
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",  # containers often mount a tiny /dev/shm
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--remote-debugging-port=0",  # any free port, written to DevToolsActivePort
        f"--user-data-dir={profile}",
        "about:blank",
    ]
    # A new session: the browser's helper processes share its process group, ended together.
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"Chromium exited with {proc.returncode} before it listened:\n{stderr[-2000:]}")
        lines = port_file.read_text().split("\n") if port_file.exists() else []
        if len(lines) >= 2 and lines[0].strip() and lines[1].strip():
            return proc, f"ws://127.0.0.1:{lines[0].strip()}{lines[1].strip()}"
        time.sleep(0.05)
    _stop(proc)
    raise TimeoutError(f"Chromium did not open its DevTools port within {timeout_s} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # the group this function's Popen created, nothing else
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.stderr:
        proc.stderr.close()


def render(html_file: Path, timeout_s: float = 30.0) -> RenderedPage:
    """Load `html_file` in headless Chromium and return what rendered once its load event fired.

    Skips the calling test when Chromium is absent (fails it when CI is set).
    """
    html_file = Path(html_file).absolute()
    if not html_file.is_file():
        raise FileNotFoundError(html_file)
    binary = chromium_binary()
    with tempfile.TemporaryDirectory(prefix="gem-chromium-") as profile:
        proc, browser_url = _start(binary, Path(profile), timeout_s)
        try:
            devtools = _DevTools(browser_url, timeout_s)
            try:
                target = devtools.call("Target.createTarget", url="about:blank")["targetId"]
                session = devtools.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
                devtools.call("Page.enable", session)
                navigation = devtools.call("Page.navigate", session, url=html_file.as_uri())
                if navigation.get("errorText"):
                    raise RuntimeError(f"Chromium could not open {html_file}: {navigation['errorText']}")
                devtools.wait_event("Page.loadEventFired", session)
                result = devtools.call("Runtime.evaluate", session, expression=_PROBE, returnByValue=True)
            finally:
                devtools.close()
        finally:
            _stop(proc)
    if "exceptionDetails" in result:
        raise RuntimeError(f"page probe failed: {result['exceptionDetails']}")
    state = json.loads(result["result"]["value"])
    return RenderedPage(
        title=state["title"],
        text=state["text"],
        images=[RenderedImage(src=i["src"], loaded=bool(i["loaded"])) for i in state["images"]],
    )
