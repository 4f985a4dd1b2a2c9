"""Open a page in headless Chromium and report what it loaded, over the DevTools protocol.

No extra packages: Chromium's ``--remote-debugging-pipe`` speaks CDP as
NUL-separated JSON on file descriptors 3 (commands in) and 4 (replies out).
`inspect_page` records every network request the page makes (blocked ones
included: they show up with ``blockedReason``), every console/CSP message, and
then asks the page how its images decoded; it can also save a screenshot.

    python -m tests.report.browser reports/demo/index.html docs/report-example.png
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--hide-scrollbars", "--mute-audio")

# Evaluated in the page after the load event: per image, whether it decoded.
_IMAGES_JS = """JSON.stringify({
  images: [...document.images].map(i => ({src: i.currentSrc.slice(0, 40), complete: i.complete,
                                          width: i.naturalWidth, height: i.naturalHeight})),
  scripts: document.scripts.length,
  title: document.title,
  h1: (document.querySelector('h1') || {}).textContent || '',
  height: document.documentElement.scrollHeight
})"""


def find_chromium() -> str | None:
    for path in CHROMIUM_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("chromium")


@dataclass
class PageReport:
    """What one page load did."""

    requests: list[str] = field(default_factory=list)        # every URL requested, in order
    blocked: list[tuple[str, str]] = field(default_factory=list)  # (url, reason)
    failed: list[tuple[str, str]] = field(default_factory=list)   # (url, error text)
    console: list[str] = field(default_factory=list)         # log entries (CSP violations land here)
    images: list[dict[str, Any]] = field(default_factory=list)
    scripts: int = 0
    title: str = ""
    h1: str = ""
    screenshot: Path | None = None

    @property
    def external_requests(self) -> list[str]:
        """Requests for anything but the page file itself and data: URIs."""
        return [u for u in self.requests if not u.startswith("data:") and not u.startswith("file://")]

    @property
    def decoded_images(self) -> int:
        return sum(1 for i in self.images if i["complete"] and i["width"] > 0 and i["height"] > 0)


class _Pipe:
    def __init__(self, proc: subprocess.Popen, to_browser: int, from_browser: int) -> None:
        self.proc, self.wfd, self.rfd = proc, to_browser, from_browser
        self.buf = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> int:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.wfd, json.dumps(msg).encode() + b"\0")
        return self.next_id

    def until(self, pred: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self.buf:
                raw, self.buf = self.buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" not in msg:
                    self.events.append(msg)
                if pred(msg):
                    return msg
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from Chromium")
            import select

            ready, _, _ = select.select([self.rfd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                continue
            chunk = os.read(self.rfd, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium closed the pipe (exit code {self.proc.poll()})")
            self.buf += chunk

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict[str, Any]:
        i = self.send(method, params, session)
        msg = self.until(lambda m: m.get("id") == i, timeout)
        if "error" in msg:
            raise RuntimeError(f"{method}: {msg['error']}")
        return msg.get("result", {})


def inspect_page(page: Path, *, screenshot: Path | None = None, chromium: str | None = None,
                 width: int = 1280, height: int = 900, full_page: bool = False,
                 timeout: float = 60.0) -> PageReport:
    """Load `page` (a local file) in headless Chromium; return what it requested and decoded."""
    exe = chromium or find_chromium()
    if exe is None:
        raise FileNotFoundError("Chromium not found (apt-get install chromium)")
    profile = tempfile.mkdtemp(prefix="report-chromium-")
    to_r, to_w = os.pipe()      # we write commands -> fd 3 of Chromium
    from_r, from_w = os.pipe()  # Chromium writes replies on fd 4 -> we read

    def child_fds() -> None:
        a, b = os.dup(to_r), os.dup(from_w)  # dup first: the pipe ends may already sit on 3 or 4
        os.dup2(a, 3)
        os.dup2(b, 4)

    args = [exe, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
            "--remote-debugging-pipe", "about:blank"]
    log = open(Path(profile) / "chromium.log", "wb")
    proc = subprocess.Popen(args, preexec_fn=child_fds, close_fds=False, stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT)
    os.close(to_r)
    os.close(from_w)
    pipe = _Pipe(proc, to_w, from_r)
    report = PageReport()
    try:
        target = pipe.call("Target.createTarget", {"url": "about:blank"}, timeout=timeout)["targetId"]
        sid = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Network.enable", "Page.enable", "Log.enable", "Runtime.enable"):
            pipe.call(domain, session=sid)
        pipe.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=sid)
        pipe.call("Page.navigate", {"url": page.resolve().as_uri()}, session=sid)
        pipe.until(lambda m: m.get("method") == "Page.loadEventFired" and m.get("sessionId") == sid, timeout)
        result = pipe.call("Runtime.evaluate", {"expression": _IMAGES_JS, "returnByValue": True}, session=sid)
        info = json.loads(result["result"]["value"])
        report.images, report.scripts = info["images"], info["scripts"]
        report.title, report.h1 = info["title"], info["h1"]
        if screenshot is not None:
            params: dict[str, Any] = {"format": "png"}
            if full_page:
                params["captureBeyondViewport"] = True
                params["clip"] = {"x": 0, "y": 0, "width": width, "height": info["height"], "scale": 1}
            shot = pipe.call("Page.captureScreenshot", params, session=sid, timeout=timeout)
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            tmp = screenshot.with_name(f".{screenshot.name}.tmp")
            tmp.write_bytes(base64.b64decode(shot["data"]))
            os.replace(tmp, screenshot)
            report.screenshot = screenshot
        try:
            pipe.call("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError):
            pass
    except (RuntimeError, TimeoutError) as exc:
        log.flush()
        tail = (Path(profile) / "chromium.log").read_text(errors="replace").strip().splitlines()[-5:]
        raise RuntimeError(f"{exc}; Chromium said: {' | '.join(tail) or '(nothing)'}") from None
    finally:
        log.close()
        for fd in (to_w, from_r):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)
    failed_ids: dict[str, str] = {}
    for m in pipe.events:
        method, params = m.get("method"), m.get("params", {})
        if method == "Network.requestWillBeSent":
            report.requests.append(params["request"]["url"])
            failed_ids[params["requestId"]] = params["request"]["url"]
        elif method == "Network.loadingFailed":
            url = failed_ids.get(params.get("requestId"), "?")
            if params.get("blockedReason"):
                report.blocked.append((url, params["blockedReason"]))
            else:
                report.failed.append((url, params.get("errorText", "")))
        elif method == "Log.entryAdded":
            entry = params.get("entry", {})
            report.console.append(f"{entry.get('source')}/{entry.get('level')}: {entry.get('text')}")
        elif method == "Runtime.consoleAPICalled":
            report.console.append("console: " + " ".join(str(a.get("value")) for a in params.get("args", [])))
    return report


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: python -m tests.report.browser PAGE.html SCREENSHOT.png [HEIGHT]", file=sys.stderr)
        return 2
    height = int(argv[2]) if len(argv) == 3 else 900
    report = inspect_page(Path(argv[0]), screenshot=Path(argv[1]), height=height)
    print(json.dumps({"requests": [u[:80] for u in report.requests], "external": report.external_requests,
                      "blocked": report.blocked, "images": len(report.images),
                      "decoded": report.decoded_images, "console": report.console}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
