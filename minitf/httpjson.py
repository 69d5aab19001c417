"""What minitf's two local web servers (the explorer, the OpenAI-compatible server) do the same
way: JSON bodies with their length, headers that keep browsers from caching or sniffing them, and
telling a loopback address (served to this machine only) from any other."""

from __future__ import annotations

import ipaddress
import json
from http.server import BaseHTTPRequestHandler

# the Host header a request to a loopback-bound server carries, unless a page on some other site
# made the browser send it (DNS rebinding): such requests are refused
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to any address
        return False


class JSONHandler(BaseHTTPRequestHandler):
    """A request handler that answers in JSON and logs through its server's `log`."""

    def _json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self._head(status, "application/json", len(data))
        self.wfile.write(data)

    def _head(self, status: int, kind: str, length: int | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Cache-Control", "no-store")  # every answer is computed for this request
        self.send_header("X-Content-Type-Options", "nosniff")
        if length is not None:
            self.send_header("Content-Length", str(length))
        self.end_headers()

    def log_message(self, format: str, *args) -> None:
        self.server.log(f"{self.address_string()} {format % args}")
