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
* **Reads of the API from another site are refused** too (``Sec-Fetch-Site:
  cross-site`` or ``same-site``, or a foreign ``Origin``): another site's page cannot
  see the answer anyway (no CORS), but an ``<img src=.../api/...>`` would make the
  server read the bucket. A client that sends no ``Sec-Fetch-*`` header (curl, a
  script; every current browser sends it) is answered.
* **The token is visible ASCII** (no space, no accent): a browser's ``fetch()`` cannot
  send anything else in a header, and the server reads headers as Latin-1.
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
import traceback
from collections.abc import Iterable, Mapping

import attrs

from ..errors import (
    InvalidArgument,
    NotStartedError,
    PawnQueueError,
    StorageError,
    TopicNotFoundError,
)

__all__ = ["TOKEN_HEADER", "Guard", "check_token", "is_loopback", "logged_error",
           "new_token", "public_error"]

TOKEN_HEADER = "X-Pawnq-Token"
#: The shortest token a user may set.
MIN_TOKEN_CHARS = 16


def new_token() -> str:
    """A fresh token: 256 random bits, URL-safe."""
    return secrets.token_urlsafe(32)


def check_token(token: str) -> str:
    """``token`` if it is visible ASCII (``!`` to ``~``), else InvalidArgument (which
    does not repeat it): nothing else can be sent in a header by the page."""
    if not token or not all("!" <= c <= "~" for c in token):
        raise InvalidArgument("the token must be visible ASCII characters only (letters, "
                              "digits, punctuation: no space, no accented letter)")
    return token


#: What the page says of a failure, by kind (never the exception's own text).
_KINDS: tuple[tuple[type[BaseException], str], ...] = (
    (TopicNotFoundError, "no such topic"),
    (NotStartedError, "the queue is closed"),
    (StorageError, "the store failed or could not be reached"),
    (PawnQueueError, "the queue refused the operation"),
)


def public_error(exc: BaseException) -> str:
    """What the page may show of ``exc``: its type and a fixed message of its kind,
    never its text (a third-party exception's text may hold a credential or a URL)."""
    said = next((text for kind, text in _KINDS if isinstance(exc, kind)), "unexpected error")
    return f"{type(exc).__name__}: {said} (the server's log says more)"


def logged_error(exc: BaseException) -> str:
    """What the server's log says of ``exc``: the library's own text for its errors
    (they mask credentials), else the type and where it was raised, not the text."""
    if isinstance(exc, PawnQueueError):
        return f"{type(exc).__name__}: {exc}"
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" raised at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}{where} (its text is not logged: it may hold a secret)"


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
              allowed_hosts: Iterable[str] = (), private: bool = False) -> Guard:
        """``private``: reads need the token on loopback too (else only beyond it)."""
        extra = {h.lower() for h in allowed_hosts}
        if is_loopback(host):
            bare = host.strip("[]").lower()
            names = {f"[{bare}]" if ":" in bare else bare, "localhost", "127.0.0.1", "[::1]"}
            hosts = frozenset({f"{n}:{port}" for n in names} | extra)
            return cls(token, actions, private, hosts)
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
        """Why a GET of the API (the bucket's data) is refused, or None: the Host, a
        request from another site, a missing token where reads need it."""
        refused = self.read_refusal(headers) or _cross_site(headers)
        if refused is None and self.reads_need_token and not self.token_ok(headers):
            return 401, f"the {TOKEN_HEADER} header must carry the dashboard's token"
        return refused

    def action_refusal(self, headers: Mapping[str, str]) -> tuple[int, str] | None:
        """Why a POST is refused, or None: read-only, the Host, a cross-site request,
        a body that is not JSON, or a missing or wrong token."""
        if not self.actions:
            return 403, "read-only dashboard: start it with --allow-actions to act"
        refused = self.read_refusal(headers) or _cross_site(headers)
        if refused is not None:
            return refused
        content = (headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if content != "application/json":
            return 415, "actions take a JSON body (Content-Type: application/json)"
        if not self.token_ok(headers):
            return 403, f"the {TOKEN_HEADER} header must carry the dashboard's token"
        return None


def _cross_site(headers: Mapping[str, str]) -> tuple[int, str] | None:
    """A browser's request made by another site's page (Sec-Fetch-Site, else Origin),
    or None. A request without either header (curl, a script) is not refused here."""
    if (headers.get("Sec-Fetch-Site") or "same-origin") not in ("same-origin", "none"):
        return 403, "cross-site request refused"
    origin = headers.get("Origin")
    host = headers.get("Host") or ""
    if origin is not None and origin.lower() not in (f"http://{host}".lower(),
                                                     f"https://{host}".lower()):
        return 403, "cross-origin request refused"
    return None
