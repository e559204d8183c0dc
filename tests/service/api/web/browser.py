"""What the pages' browser test drives Chromium with: Debian's executable and its flags, a page
that records every URL it asks for and every error it logs, screenshots, and a TCP proxy whose
connections the test can cut."""

from __future__ import annotations

import contextlib
import shutil
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.server_process import ServerProcess

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOTS = Path(__file__).resolve().parents[4] / "build" / "screenshots"
# NOTE: as root, in a sandbox with no network: no sandboxing, no GPU, no calls home.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
]
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


class Watched:
    """A page of a fresh browser context, with every URL it asked for and every error it logged."""

    def __init__(self, browser: Any, base_url: str, viewport: dict[str, int] = DESKTOP) -> None:
        self.base_url = base_url
        self.context = browser.new_context(viewport=viewport, base_url=base_url)
        self.urls: list[str] = []
        self.errors: list[str] = []
        self.context.on("request", lambda request: self.urls.append(request.url))
        self.page = self.context.new_page()
        self.page.on("console", lambda message: message.type == "error" and self.errors.append(message.text))
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))

    def check_and_close(self, expected_errors: Callable[[str], bool] = lambda _: False) -> None:
        self.context.close()
        elsewhere = [url for url in self.urls if not url.startswith(self.base_url + "/") and not url.startswith("data:")]
        assert elsewhere == [], f"the page asked other origins: {elsewhere}"
        assert [e for e in self.errors if not expected_errors(e)] == []


def screenshot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / name))


class CuttableProxy:
    """A TCP proxy to a server whose open connections the test can cut, as a dropped network
    would (a reset, which the browser sees mid-stream)."""

    def __init__(self, target: ServerProcess) -> None:
        self.target_port = int(target.base_url.rsplit(":", 1)[1])
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self.sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass

    def cut(self) -> None:
        for sock in self.sockets:
            # NOTE: shutdown first: it wakes the pump blocked on the socket, which close alone would not.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.sockets.clear()

    def close(self) -> None:
        self.listener.close()
        self.cut()
