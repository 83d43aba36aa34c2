"""Who may read the dashboard and who may act through it.

The model (docs/operations.md, "The dashboard"):

* **Read-only unless ``--allow-actions``.** Without it the server has no route that
  writes: every POST is refused.
* **Actions need the token**, in the ``X-Pawnq-Token`` header of a POST with a JSON
  body: a token printed at start (256 random bits) or one the user sets
  (``PAWNQ_DASHBOARD_TOKEN``, ``--token-file``). No cookie is ever set, so a browser
  never sends the token by itself: another site's page (a form, an image, a fetch)
  cannot make an action happen, and a cross-site fetch with that header needs a CORS
  preflight that the server never grants. On top, a POST whose ``Origin`` is not the
  page's own origin (or whose ``Sec-Fetch-Site`` says cross-site) is refused.
* **Host check** (DNS rebinding): on a loopback address, a request whose ``Host`` is
  not that address, ``localhost`` or an ``--allowed-host`` is refused, so a hostile
  site that points its own name at 127.0.0.1 cannot read the page's data.
* **Beyond loopback** (``--host 0.0.0.0`` or an interface's address), a token the user
  set is required to start, and every API request, reads included, must carry it.
  The server speaks plain HTTP: put it behind TLS (a reverse proxy) or an SSH tunnel.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from collections.abc import Iterable, Mapping

import attrs

__all__ = ["TOKEN_HEADER", "Guard", "is_loopback", "new_token"]

TOKEN_HEADER = "X-Pawnq-Token"
#: The shortest token a user may set.
MIN_TOKEN_CHARS = 16


def new_token() -> str:
    """A fresh token: 256 random bits, URL-safe."""
    return secrets.token_urlsafe(32)


def is_loopback(host: str) -> bool:
    """``host`` (a bind address) only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@attrs.frozen
class Guard:
    """The checks every request passes. ``token`` None: no action possible (and reads
    need none). ``hosts``: the ``Host`` values accepted (empty: any, beyond loopback,
    where the token guards reads)."""

    token: str | None = attrs.field(repr=False)
    actions: bool
    reads_need_token: bool
    hosts: frozenset[str]

    @classmethod
    def build(cls, host: str, port: int, token: str | None, actions: bool,
              allowed_hosts: Iterable[str] = ()) -> Guard:
        extra = {h.lower() for h in allowed_hosts}
        if is_loopback(host):
            bare = host.strip("[]").lower()
            names = {f"[{bare}]" if ":" in bare else bare, "localhost", "127.0.0.1", "[::1]"}
            hosts = frozenset({f"{n}:{port}" for n in names} | extra)
            return cls(token, actions, False, hosts)
        return cls(token, actions, True, frozenset(extra))

    def host_ok(self, headers: Mapping[str, str]) -> bool:
        """The ``Host`` header names this server (always true when ``hosts`` is empty)."""
        if not self.hosts:
            return True
        return (headers.get("Host") or "").lower() in self.hosts

    def token_ok(self, headers: Mapping[str, str]) -> bool:
        """The request carries the token (compared in constant time)."""
        given = headers.get(TOKEN_HEADER) or ""
        return self.token is not None and hmac.compare_digest(
            given.encode("utf-8", "replace"), self.token.encode())

    def read_refusal(self, headers: Mapping[str, str]) -> tuple[int, str] | None:
        """Why a GET is refused (status, text), or None."""
        if not self.host_ok(headers):
            return 421, "this server does not answer to that Host (DNS rebinding?)"
        return None

    def api_read_refusal(self, headers: Mapping[str, str]) -> tuple[int, str] | None:
        """Why a GET of the API (the bucket's data) is refused, or None."""
        refused = self.read_refusal(headers)
        if refused is None and self.reads_need_token and not self.token_ok(headers):
            return 401, f"the {TOKEN_HEADER} header must carry the dashboard's token"
        return refused

    def action_refusal(self, headers: Mapping[str, str]) -> tuple[int, str] | None:
        """Why a POST is refused, or None: read-only, the Host, a cross-site request,
        a body that is not JSON, or a missing or wrong token."""
        if not self.actions:
            return 403, "read-only dashboard: start it with --allow-actions to act"
        refused = self.read_refusal(headers)
        if refused is not None:
            return refused
        if (headers.get("Sec-Fetch-Site") or "same-origin") not in ("same-origin", "none"):
            return 403, "cross-site request refused"
        origin = headers.get("Origin")
        host = headers.get("Host") or ""
        if origin is not None and origin.lower() not in (f"http://{host}".lower(),
                                                         f"https://{host}".lower()):
            return 403, "cross-origin request refused"
        content = (headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if content != "application/json":
            return 415, "actions take a JSON body (Content-Type: application/json)"
        if not self.token_ok(headers):
            return 403, f"the {TOKEN_HEADER} header must carry the dashboard's token"
        return None
