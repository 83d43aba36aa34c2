"""A headless Chromium driven over the Chrome DevTools Protocol, standard library only.

Why not Selenium or Playwright: both bring a driver binary or a browser download of their
own and many dependencies; the DevTools Protocol over ``--remote-debugging-pipe`` is a
pair of pipes carrying NUL-terminated JSON (the browser reads commands on fd 3 and
writes answers and events on fd 4), which ~150 lines drive. The browser is Debian's
``chromium`` (``.ci/run`` installs it when missing); ``PAWNQ_CHROMIUM`` names another.

Clicks are real mouse events at the element's centre (``Input.dispatchMouseEvent``), not
``element.click()``; JavaScript dialogs (``confirm``) are answered as told.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import queue
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Seconds a command, or a wait for the page, may take before the test fails.
TIMEOUT = 60.0


def chromium_path() -> str:
    """The browser to run; AssertionError naming the fix when there is none."""
    found = os.environ.get("PAWNQ_CHROMIUM") or shutil.which("chromium") or shutil.which(
        "chromium-browser")
    assert found, ("the browser tests need Debian's chromium: apt-get install -y chromium "
                   "(.ci/run installs it), or PAWNQ_CHROMIUM=/path/to/chrome")
    return found


class BrowserError(Exception):
    """The browser answered a command with an error, or a page script threw."""


class Browser:
    """One headless browser with one page (tab). ``with Browser(tmp_path) as b:``."""

    def __init__(self, profile: Path, width: int = 1280, height: int = 800) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # the child's ends above fd 4, so that putting them on 3 and 4 overwrites neither
        for name in ("to_browser_r", "from_browser_w"):
            low = locals()[name]
            high = fcntl.fcntl(low, fcntl.F_DUPFD_CLOEXEC, 100)
            os.close(low)
            if name == "to_browser_r":
                to_browser_r = high
            else:
                from_browser_w = high

        def fds() -> None:  # in the child, before exec: the pipes on fds 3 and 4
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        self.proc = subprocess.Popen(
            [chromium_path(), "--headless=new", "--remote-debugging-pipe", "--no-sandbox",
             "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--mute-audio",
             f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=False, preexec_fn=fds,  # fds 3 and 4 made by fds(); the rest CLOEXEC
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next_id = 0
        self._lock = threading.Lock()
        self._answers: dict[int, queue.Queue[dict[str, Any]]] = {}
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.accept_dialogs = True
        self.dialogs: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target,
                                 flatten=True)["sessionId"]
        for domain in ("Page.enable", "Runtime.enable"):
            self.send(domain, session=True)
        self.send("Emulation.setDeviceMetricsOverride", session=True, width=width,
                  height=height, deviceScaleFactor=1, mobile=False)

    # -- the pipe --------------------------------------------------------------------------

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._from_browser, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                for answers in list(self._answers.values()):
                    answers.put({"error": {"message": "the browser went away"}})
                return
            buffer += chunk
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                message = json.loads(raw)
                if "id" in message:
                    with self._lock:
                        answers = self._answers.get(message["id"])
                    if answers is not None:
                        answers.put(message)
                elif message.get("method") == "Page.javascriptDialogOpening":
                    self.dialogs.append(message["params"].get("message", ""))
                    self._post("Page.handleJavaScriptDialog", message.get("sessionId"),
                               {"accept": self.accept_dialogs})
                else:
                    self.events.put(message)

    def _post(self, method: str, session: str | None, params: dict[str, Any]) -> int:
        with self._lock:
            self._next_id += 1
            ident = self._next_id
            self._answers[ident] = queue.Queue()
            message: dict[str, Any] = {"id": ident, "method": method, "params": params}
            if session:
                message["sessionId"] = session
            os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        return ident

    def send(self, method: str, session: bool = False, **params: Any) -> dict[str, Any]:
        """Send one command (to the page's session with ``session``); its result."""
        ident = self._post(method, self.session if session else None, params)
        try:
            answer = self._answers[ident].get(timeout=TIMEOUT)
        except queue.Empty:
            raise BrowserError(f"{method}: no answer in {TIMEOUT} s") from None
        finally:
            with self._lock:
                self._answers.pop(ident, None)
        if "error" in answer:
            raise BrowserError(f"{method}: {answer['error'].get('message')}")
        return answer.get("result", {})

    # -- the page --------------------------------------------------------------------------

    def goto(self, url: str) -> None:
        """Open ``url`` and wait for its load event."""
        self.navigate_by(lambda: self.send("Page.navigate", session=True, url=url))

    def navigate_by(self, action: Callable[[], Any]) -> None:
        """Run ``action`` (which makes the page go elsewhere: a navigation, a form
        submitted) and wait for the new page's load event."""
        while not self.events.empty():
            self.events.get_nowait()
        action()
        while True:
            event = self.events.get(timeout=TIMEOUT)
            if event.get("method") == "Page.loadEventFired":
                return

    def eval(self, expression: str) -> Any:
        """The value of ``expression`` in the page (promises awaited)."""
        result = self.send("Runtime.evaluate", session=True, expression=expression,
                           awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise BrowserError(f"{expression[:80]!r}: {text}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = TIMEOUT) -> Any:
        """Wait until ``expression`` is truthy in the page (the page checks it after each
        of its own changes: a MutationObserver, not a sleep); its value."""
        script = """new Promise((resolve, reject) => {
          const check = () => { try { return (__EXPR__); } catch (e) { return undefined; } };
          const first = check();
          if (first) { resolve(first); return; }
          const seen = new MutationObserver(() => {
            const v = check();
            if (v) { seen.disconnect(); clearTimeout(timer); resolve(v); }
          });
          seen.observe(document, {subtree: true, childList: true, characterData: true,
                                  attributes: true});
          const timer = setTimeout(() => { seen.disconnect();
            reject(new Error("timed out waiting for: " + __TEXT__)); }, __MS__);
        })"""
        script = (script.replace("__MS__", str(int(timeout * 1000)))
                  .replace("__TEXT__", json.dumps(expression)).replace("__EXPR__", expression))
        return self.eval(script)

    def click(self, selector: str) -> None:
        """A real left click at the centre of the element ``selector`` matches."""
        box = self.eval(
            "(() => { const e = document.querySelector(" + json.dumps(selector) + ");"
            " if (!e) return null; e.scrollIntoView({block: 'center'});"
            " const r = e.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()")
        if box is None:
            raise BrowserError(f"nothing matches {selector!r}")
        x, y = box
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", session=True, type=kind, x=x, y=y,
                      button="left", clickCount=1)

    def type_text(self, selector: str, text: str) -> None:
        """Click the field ``selector`` matches and type ``text`` into it."""
        self.click(selector)
        self.send("Input.insertText", session=True, text=text)

    def screenshot(self, path: Path) -> None:
        """A PNG of the whole page at ``path``."""
        size = self.eval("[document.documentElement.scrollWidth,"
                         " document.documentElement.scrollHeight]")
        shot = self.send("Page.captureScreenshot", session=True, format="png",
                         captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1})
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        with contextlib.suppress(BrowserError):
            self.send("Browser.close")
        try:
            self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
