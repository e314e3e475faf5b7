"""Who may talk to the viewer's server (DESIGN.md, "The viewer's security model").

1. Host: every request's `Host` header must be exactly one of the allowed authorities
   `NAME:PORT` (or `NAME` alone on port 80), NAME from an allowlist: the bound address, and the
   loopback names when it is loopback; bound to a wildcard (`0.0.0.0`, `::`), the loopback names,
   this machine's host name and addresses; plus names the user adds (`--allow-host`). An exact
   string comparison, so `localhost.evil.example` and a DNS-rebinding name never pass.
2. Origin (writes): absent (a same-origin request from an old browser or curl) or exactly
   `http://` + an allowed authority; `null` (sandboxed frames, `file:` pages, some redirects)
   and every other origin, another local port included, are refused.
3. Token: bound beyond loopback, a random secret (`secrets.token_urlsafe`, 192 bits) is made at
   start, printed once in the URL (`?token=...`, as Jupyter does) and required on every API call
   and write, in the `X-Attrgraph-Token` header or a `token` query parameter; compared in
   constant time. Loopback needs none (other local users are trusted as with Jupyter's default).
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import socket
from collections.abc import Iterable
from dataclasses import dataclass

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
WILDCARDS = ("0.0.0.0", "::", "")
TOKEN_HEADER = "X-Attrgraph-Token"


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or name the server binds) reaches this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def machine_names() -> set[str]:
    """This machine's host name, fully qualified name and their addresses (for a wildcard bind)."""
    names = {socket.gethostname(), socket.getfqdn()}
    for name in list(names):
        try:
            names |= {str(info[4][0]).split("%")[0] for info in socket.getaddrinfo(name, None)}
        except OSError:
            pass
    return {n.lower() for n in names if n}


def allowed_names(host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """Step 1's allowlist of names for a server bound to `host`."""
    names = {n.lower().strip("[]") for n in extra}
    if host in WILDCARDS:
        names |= set(LOOPBACK_NAMES) | machine_names()
    else:
        names.add(host.lower().strip("[]"))
        if is_loopback(host):
            names |= set(LOOPBACK_NAMES)
    return frozenset(names)


@dataclass(frozen=True)
class Access:
    """The checks of steps 1-3 for one server."""

    names: frozenset[str]
    """Host names (lower case, IPv6 without brackets) a request may address."""
    port: int
    token: str | None = None
    """The secret every API call must carry; None: none needed (loopback)."""

    @classmethod
    def for_server(cls, host: str, port: int, extra: Iterable[str] = (), token: str | None = None) -> Access:
        """The access rules of a server bound to (`host`, `port`); a token is made when `host` is
        not loopback (or `token` given)."""
        if token is None and not is_loopback(host):
            token = secrets.token_urlsafe(24)
        return cls(allowed_names(host, extra), port, token)

    def authorities(self) -> set[str]:
        out = set()
        for n in self.names:
            a = f"[{n}]" if ":" in n else n
            out.add(f"{a}:{self.port}")
            if self.port == 80:
                out.add(a)
        return out

    def host_ok(self, host: str | None) -> bool:
        return host is not None and host.strip().lower() in self.authorities()

    def origin_ok(self, origin: str | None) -> bool:
        if origin is None:
            return True
        return origin.strip().lower() in {f"http://{a}" for a in self.authorities()}

    def token_ok(self, given: str | None) -> bool:
        if self.token is None:
            return True
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())
