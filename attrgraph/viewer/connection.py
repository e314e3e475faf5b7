"""What one connection may make the viewer's server hold, bounded before anything is parsed.

http.server reads a request's head with `readline(65537)` per line and up to 100 header lines,
each `recv` resetting the socket timeout: one client could make the server hold ~6.5 MB for as
long as it sent a byte every few seconds (issue 31, attack 2). Here:

1. A connection waits at most `idle_timeout` seconds for the first byte of a request (a
   kept-alive connection between requests).
2. From that byte, the whole head (request line and headers, through the blank line) must arrive
   within `head_timeout` seconds and `max_head` bytes; `recv` never asks for more than the bound,
   so a head past it costs the server at most `max_head` bytes before the refusal (414 when the
   request line alone is too long, 431 otherwise; `HeadTooLarge`), and a late one is cut off
   (`HeadTimeout`) however often its bytes arrive.
3. A body is read from the same buffer, within `head_timeout` seconds again.
4. The server caps concurrent connections (server.ViewerServer); this module only reads.
"""

from __future__ import annotations

import re
import socket
import time

MAX_HEAD = 16 * 1024
"""Bytes a request's line and headers may take (browsers send 1-3 KB; nginx's default is 8 KB a line)."""
HEAD_TIMEOUT = 10.0
"""Seconds from a request's first byte to the end of its head (and again for its body)."""
_END = re.compile(rb"\r?\n\r?\n")


class HeadTooLarge(Exception):
    """The head passed `max_head` bytes; `line` says whether the request line itself did."""

    def __init__(self, line: bool):
        super().__init__("request line too long" if line else "request headers too large")
        self.line = line


class HeadTimeout(TimeoutError):
    """The head (or body) did not arrive within `head_timeout` seconds of its first byte."""


class ConnectionReader:
    """The bytes of one connection: `read_head` for each request, then `read(n)` for its body.
    Stands in for the handler's `rfile` (`read`, `close`, `closed`)."""

    def __init__(self, sock: socket.socket, idle_timeout: float, head_timeout: float, max_head: int):
        self.sock, self.idle_timeout, self.head_timeout, self.max_head = (
            sock,
            idle_timeout,
            head_timeout,
            max_head,
        )
        self.buf = bytearray()
        self.closed = False

    def _recv(self, n: int, deadline: float | None) -> bytes:
        timeout = self.idle_timeout if deadline is None else deadline - time.monotonic()
        if timeout <= 0:
            raise HeadTimeout("the request did not arrive in time")
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(n)
        except TimeoutError:
            if deadline is None:
                raise
            raise HeadTimeout("the request did not arrive in time") from None

    def read_head(self) -> bytes | None:
        """The next request's head through its blank line (steps 1-2); None when the client closed
        the connection before a whole head."""
        deadline = time.monotonic() + self.head_timeout if self.buf else None
        while True:
            end = _END.search(self.buf)
            if end is not None and end.end() <= self.max_head:
                head = bytes(self.buf[: end.end()])
                del self.buf[: end.end()]
                return head
            if len(self.buf) >= self.max_head:
                raise HeadTooLarge(line=b"\n" not in self.buf[: self.max_head])
            chunk = self._recv(self.max_head - len(self.buf), deadline)
            if not chunk:
                return None
            self.buf += chunk
            if deadline is None:
                deadline = time.monotonic() + self.head_timeout

    def read(self, n: int) -> bytes:
        """Up to `n` body bytes (fewer when the client closes first), within `head_timeout` (step 3)."""
        deadline = time.monotonic() + self.head_timeout
        while len(self.buf) < n:
            chunk = self._recv(min(n - len(self.buf), 1 << 16), deadline)
            if not chunk:
                break
            self.buf += chunk
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def close(self) -> None:
        self.closed = True
