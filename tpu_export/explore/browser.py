"""Headless Chromium driven over the DevTools protocol (a small client on the standard library: no driver to
install), for ``--png`` and the tests: open a page, wait for it, evaluate JavaScript, take a screenshot."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request

__all__ = ["find_chromium", "Browser"]

_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")


def find_chromium() -> str | None:
    """The Chromium to run: $CHROMIUM, else Debian's /usr/bin/chromium (apt-get install chromium), else None."""
    env = os.environ.get("CHROMIUM")
    if env and os.path.exists(env):
        return env
    for c in _CANDIDATES:
        if os.path.exists(c):
            return c
    return shutil.which("chromium")


def _no_proxy_open(url: str, timeout: float = 5.0) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as r:
        return r.read()


class _Socket:
    """One client WebSocket (RFC 6455): text frames out (masked), frames in."""

    def __init__(self, url: str, timeout: float):
        m = re.match(r"ws://([^/:]+):(\d+)(/.*)", url)
        self.sock = socket.create_connection((m.group(1), int(m.group(2))), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {m.group(3)} HTTP/1.1\r\nHost: {m.group(1)}:{m.group(2)}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                          .encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("Chromium closed the DevTools connection during the handshake")
            head += chunk
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"DevTools handshake refused: {head[:200]!r}")
        self.buf = head.split(b"\r\n\r\n", 1)[1]

    def send(self, text: str) -> None:
        data = text.encode()
        head = bytes([0x81])
        n = len(data)
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("Chromium closed the DevTools connection")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv(self) -> str:
        parts = []
        while True:
            b0, b1 = self._take(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._take(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._take(8))[0]
            payload = self._take(n)
            if b0 & 0x0F == 0x8:
                raise ConnectionError("Chromium closed the DevTools connection")
            if b0 & 0x0F in (0x1, 0x2, 0x0):
                parts.append(payload)
            if b0 & 0x80:
                return b"".join(parts).decode()

    def close(self) -> None:
        self.sock.close()


class Browser:
    """A headless Chromium with one page, closed on exit (``with Browser(url) as b: ...``)."""

    def __init__(self, url: str, *, width: int = 1400, height: int = 900, timeout: float = 60.0):
        exe = find_chromium()
        if exe is None:
            raise FileNotFoundError("Chromium is not installed (Debian: apt-get install -y chromium; or set $CHROMIUM)")
        self.profile = tempfile.mkdtemp(prefix="tpu-export-chromium-")
        # every background service off: the page is local and the machine may have no network
        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--enable-unsafe-swiftshader", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--remote-debugging-port=0", f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.timeout = timeout
        self._id = 0
        self.ws = None
        try:
            port = self._devtools_port()
            deadline = time.monotonic() + timeout
            page = None
            while page is None and time.monotonic() < deadline:
                targets = json.loads(_no_proxy_open(f"http://127.0.0.1:{port}/json/list"))
                page = next((t for t in targets if t.get("type") == "page"), None)
                time.sleep(0.1)
            if page is None:
                raise TimeoutError("Chromium opened no page")
            self.ws = _Socket(page["webSocketDebuggerUrl"], timeout)
            self.call("Page.enable")
            self.call("Page.navigate", url=url)
        except BaseException:
            self.close()
            raise

    def _devtools_port(self) -> int:
        path = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if os.path.exists(path):
                first = open(path).read().split("\n", 1)[0].strip()
                if first.isdigit():
                    return int(first)
            if self.proc.poll() is not None:
                raise RuntimeError(f"Chromium exited with code {self.proc.returncode} before opening DevTools")
            time.sleep(0.1)
        raise TimeoutError("Chromium did not open its DevTools port")

    def call(self, method: str, **params) -> dict:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"DevTools {method}: {msg['error']}")
                return msg.get("result", {})

    def evaluate(self, expression: str):
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return res.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float | None = None):
        """Poll ``expression`` until it is truthy; its value. TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while time.monotonic() < deadline:
            v = self.evaluate(expression)
            if v:
                return v
            time.sleep(0.25)
        raise TimeoutError(f"the page never satisfied {expression[:80]!r}")

    def screenshot(self, path: str) -> int:
        data = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        with open(path, "wb") as f:
            f.write(data)
        return len(data)

    def close(self) -> None:
        if self.ws is not None:
            self.ws.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
