"""Console sessions: an HttpOnly, SameSite=Strict cookie after logging in with an admin key.

The cookie holds a random session id only. The credential the operator logged in with (an
API key or a JWT) stays in this process's memory, and is authenticated again on every request
and every push of a live view: a revoked key or an expired token ends its sessions at once.
Forms that change something carry a per-session CSRF token, and every POST must come from
the console's own origin (``Origin``, else ``Referer``), so another site can neither post to
the console nor log a browser in under its own key. The cookie is ``Secure`` when the browser
used HTTPS (the connection's TLS, or a trusted proxy's ``X-Forwarded-Proto``).
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web

from fairq_server.doors.http.origin import Asked

__all__ = ["COOKIE", "Session", "Sessions", "same_origin"]

COOKIE = "fairq_console"
_MAX_SESSIONS = 1000


@dataclass
class Session:
    """One logged-in browser.

    Attributes:
        id: the cookie's value.
        credential: the bearer credential it logged in with (kept in memory only).
        user: who logged in (for the log).
        csrf: the token its forms carry.
        expires: monotonic time it ends.

    """

    id: str
    credential: str
    user: str
    csrf: str
    expires: float


class Sessions:
    """The sessions of this process (bounded: the oldest goes first past the bound)."""

    def __init__(self, lifetime: float) -> None:
        self.lifetime = lifetime
        self._by_id: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_id)

    def open(self, credential: str, user: str) -> Session:
        """Start a session for ``credential``."""
        session = Session(
            secrets.token_urlsafe(32),
            credential,
            user,
            secrets.token_urlsafe(32),
            time.monotonic() + self.lifetime,
        )
        self._by_id[session.id] = session
        while len(self._by_id) > _MAX_SESSIONS:
            self._by_id.popitem(last=False)
        return session

    def get(self, request: web.Request) -> Session | None:
        """Return the live session the request's cookie names, if any."""
        sid = request.cookies.get(COOKIE, "")
        session = self._by_id.get(sid) if sid else None
        if session is None:
            return None
        if time.monotonic() >= session.expires:
            del self._by_id[sid]
            return None
        return session

    def close(self, session: Session) -> None:
        """End ``session``."""
        self._by_id.pop(session.id, None)

    def live(self, session: Session) -> bool:
        """Whether ``session`` still holds: not logged out, not expired, not pushed out.

        A live stream holds its session object from the request that opened it; this is how
        it learns that the session ended since (in this tab, another one, or by expiry).
        """
        if self._by_id.get(session.id) is not session:
            return False
        if time.monotonic() >= session.expires:
            del self._by_id[session.id]
            return False
        return True

    def set_cookie(self, response: web.StreamResponse, session: Session, secure: bool) -> None:
        """Give the browser ``session``'s cookie (unreadable to scripts, this site only)."""
        response.set_cookie(
            COOKIE,
            session.id,
            max_age=int(self.lifetime),
            path="/console",
            httponly=True,
            samesite="Strict",
            secure=secure,
        )

    @staticmethod
    def clear_cookie(response: web.StreamResponse, secure: bool) -> None:
        """Make the browser forget its session cookie (with the flags it was set with)."""
        response.del_cookie(
            COOKIE, path="/console", secure=secure, httponly=True, samesite="Strict"
        )


def csrf_ok(session: Session, presented: str) -> bool:
    """Whether ``presented`` is ``session``'s CSRF token (compared in constant time)."""
    return hmac.compare_digest(session.csrf.encode(), presented.encode())


def same_origin(request: web.Request, asked: Asked) -> bool:
    """Whether a POST comes from a page of the host the browser asked for.

    The page is named by ``Origin``, else ``Referer``; its host and port are compared with
    what the browser asked for (``Host``, or a trusted proxy's ``X-Forwarded-Host``). The
    scheme is compared only when it is known: behind a proxy that terminates TLS and is not
    trusted, the browser's origin is ``https`` while fairq sees plain HTTP. A request with
    neither header is refused: browsers send ``Origin`` with every form POST, so only a
    non-browser client lacks both, and it has no reason to use the forms.
    """
    source = request.headers.get("Origin") or request.headers.get("Referer") or ""
    if not source or source == "null":
        return False
    parts = urlsplit(source)
    if parts.scheme not in ("http", "https") or parts.netloc.lower() != asked.host:
        return False
    return not asked.scheme_known or parts.scheme == asked.scheme
