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
4. API reads come from the page: `Sec-Fetch-Site`, where the browser sends it, is `same-origin`
   (the page's fetch) or `none` (the user typed the URL); without it, the request carries
   `X-Attrgraph-Page: 1`, a header no cross-site simple request (`<img>`, `<script>`, a form) can
   set and a cross-origin fetch may only send after a CORS preflight this server never grants.
   So another site cannot make the server load a model or build a payload (issue 31, attack 3).
5. Framing: every response forbids it (`X-Frame-Options: DENY`, CSP `frame-ancestors 'none'`),
   and the page runs under `CSP` (its own files only, no inline script), so no other site can
   lay the page under a decoy and have the user's clicks write the file (clickjacking).
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
PAGE_HEADER = "X-Attrgraph-Page"
SAME_ORIGIN = ("same-origin", "none")
"""`Sec-Fetch-Site` values of a read the page (or the user) made (step 4)."""
CSP = (
    "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
"""Step 5: scripts, styles and fetches from this origin only (no inline script or style
attribute), never framed."""


def read_from_page(sec_fetch_site: str | None, page_header: str | None) -> bool:
    """Step 4: whether an API read with these headers comes from the page."""
    if sec_fetch_site is not None:
        return sec_fetch_site.strip().lower() in SAME_ORIGIN
    return page_header is not None and page_header.strip() == "1"


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
