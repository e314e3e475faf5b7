"""What one connection may make the viewer's server hold, bounded before anything is parsed.

http.server reads a request's head with `readline(65537)` per line and up to 100 header lines,
each `recv` resetting the socket timeout: one client could make the server hold ~6.5 MB for as
long as it sent a byte every few seconds (issue 31, attack 2). Here:

1. A connection waits at most `idle_timeout` seconds for the first byte of a request (a
   kept-alive connection between requests).
2. From that byte, the whole head (request line and headers, through the blank line) must arrive
   within `head_timeout` seconds and `max_head` bytes; `recv` never asks for more than the bound,
   so a head past it costs the server at most `max_head` bytes before the refusal (`TooLarge`:
   414 when the request line alone is too long, 431 otherwise), and a late one is cut off
   (`TimeoutError`) however often its bytes arrive.
3. A body is read from the same buffer, within `head_timeout` seconds again.
4. The server caps concurrent connections (server.ViewerServer); this module only reads.
"""

from __future__ import annotations

import re
import socket
import time
from typing import NamedTuple

MAX_HEAD = 16 * 1024
"""Bytes a request's line and headers may take (browsers send 1-3 KB; nginx's default is 8 KB a line)."""
HEAD_TIMEOUT = 10.0
"""Seconds from a request's first byte to the end of its head (and again for its body)."""
_END = re.compile(rb"\r?\n\r?\n")


class TooLarge(NamedTuple):
    """What `read_head` gives for a head past `max_head` bytes."""

    line: bool
    """Whether the request line itself passed it (414; else 431)."""


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
            raise TimeoutError("the request did not arrive in time")
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(n)
        finally:  # the reply is written under the idle timeout, not what was left of a deadline
            self.sock.settimeout(self.idle_timeout)

    def read_head(self) -> bytes | TooLarge | None:
        """The next request's head through its blank line (steps 1-2), `TooLarge` past `max_head`
        bytes, None when the client closed the connection first; `TimeoutError` when it is late."""
        deadline = time.monotonic() + self.head_timeout if self.buf else None
        while True:
            end = _END.search(self.buf)
            if end is not None and end.end() <= self.max_head:
                head = bytes(self.buf[: end.end()])
                del self.buf[: end.end()]
                return head
            if len(self.buf) >= self.max_head:
                return TooLarge(line=b"\n" not in self.buf[: self.max_head])
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
