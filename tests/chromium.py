"""A headless Chromium for tests, driven over the DevTools protocol on a pipe.

``--remote-debugging-pipe`` makes Chromium read protocol commands on fd 3 and write replies and
events on fd 4, each a JSON object ended by a NUL byte: no port, no websocket library. ``load``
opens a page, waits for its load event and returns what a test needs: every console message,
uncaught exception and browser log entry (CSP violations and failed loads land there), values of
JavaScript expressions evaluated in the page, and a full-page PNG screenshot.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


@dataclass
class Page:
    errors: list[str] = field(default_factory=list)  # console errors, exceptions, log errors
    messages: list[str] = field(default_factory=list)  # every console message and log entry
    values: dict[str, object] = field(default_factory=dict)  # expression → its value
    png: bytes = b""


class _Pipe:
    def __init__(self, proc: subprocess.Popen, to_browser: int, from_browser: int):
        self.proc, self.wfd, self.rfd = proc, to_browser, from_browser
        self.buf = b""
        self.next_id = 0
        self.events: list[dict] = []

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.rfd], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self.rfd, 1 << 16)
            if not chunk:
                raise RuntimeError(f"Chromium closed its pipe (exit {self.proc.poll()})")
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict | None = None, session: str = "", timeout=30.0):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.wfd, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._read_message(deadline))


def _collect(events: list[dict], page: Page) -> None:
    for e in events:
        method, params = e.get("method"), e.get("params", {})
        if method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            page.messages.append(f"console.{params['type']}: {text}")
            if params["type"] in ("error", "assert"):
                page.errors.append(f"console.{params['type']}: {text}")
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text", "")
            page.errors.append(f"exception: {text}")
        elif method == "Log.entryAdded":
            entry = params["entry"]
            page.messages.append(f"log {entry['level']} ({entry['source']}): {entry['text']}")
            if entry["level"] == "error":
                page.errors.append(f"log ({entry['source']}): {entry['text']}")


def load(url: str, expressions: list[str] = (), width: int = 1280, timeout: float = 60) -> Page:
    """Open ``url`` in a fresh headless Chromium and report on it (see the module docstring)."""
    binary = find_chromium()
    if binary is None:
        raise FileNotFoundError(
            "no Chromium: scripts/setup.sh installs it (apt-get install chromium)"
        )
    to_r, to_w = os.pipe()  # test → browser (its fd 3)
    from_r, from_w = os.pipe()  # browser (its fd 4) → test
    profile = tempfile.mkdtemp(prefix="brorl-chromium-")

    log = open(Path(profile) / "stderr.log", "wb")

    def child_fds():  # in the child, before exec: the pipe ends become its fds 3 and 4
        # via copies above 10 first: dup2(to_r, 3) could otherwise clobber from_w if it is 3
        a = fcntl.fcntl(to_r, fcntl.F_DUPFD_CLOEXEC, 10)
        b = fcntl.fcntl(from_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.dup2(a, 3)  # dup2's copy is inheritable: it survives exec, a and b do not
        os.dup2(b, 4)

    proc = subprocess.Popen(
        [
            binary,
            "--headless",
            "--no-sandbox",  # tests run as root in containers, where the sandbox cannot start
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            "--remote-debugging-pipe",
            "about:blank",
        ],
        close_fds=False,  # subprocess would close fds 3 and 4 after child_fds made them
        preexec_fn=child_fds,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    os.close(to_r)
    os.close(from_w)
    pipe = _Pipe(proc, to_w, from_r)
    page = Page()
    try:
        deadline = time.monotonic() + timeout
        target = ""
        while not target:  # the about:blank tab appears shortly after start
            infos = pipe.call("Target.getTargets")["targetInfos"]
            target = next((t["targetId"] for t in infos if t["type"] == "page"), "")
            if time.monotonic() > deadline:
                raise TimeoutError("Chromium opened no page")
        session = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log"):
            pipe.call(f"{domain}.enable", session=session)
        pipe.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False},
            session=session,
        )
        pipe.events.clear()  # about:blank's own events
        pipe.call("Page.navigate", {"url": url}, session=session)
        pipe.wait_event("Page.loadEventFired", timeout=timeout)
        for expr in expressions:
            result = pipe.call(
                "Runtime.evaluate", {"expression": expr, "returnByValue": True}, session=session
            )["result"]
            page.values[expr] = result.get("value")
        size = pipe.call("Page.getLayoutMetrics", session=session)["cssContentSize"]
        shot = pipe.call(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width, "height": size["height"], "scale": 1},
            },
            session=session,
        )
        page.png = base64.b64decode(shot["data"])
        pipe.call("Runtime.evaluate", {"expression": "0"}, session=session)  # flush late events
        _collect(pipe.events, page)
    except (RuntimeError, TimeoutError) as exc:
        log.flush()
        tail = (Path(profile) / "stderr.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{exc}; Chromium's stderr ends:\n{tail}") from exc
    finally:
        log.close()
        proc.kill()
        proc.wait()
        os.close(to_w)
        os.close(from_r)
        shutil.rmtree(profile, ignore_errors=True)
    return page
