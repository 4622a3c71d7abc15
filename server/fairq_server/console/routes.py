"""The console's routes under ``/console`` on the HTTP door: login, pages, live data.

Only admins get anything: an API key marked ``admin`` or a token with the identity
provider's admin claim, presented once at the login form (the browser then holds an
HttpOnly session cookie, :mod:`.session`) or as ``Authorization: Bearer`` on every request
(scripts). A page asked for without either redirects to the login form; a data endpoint
answers 401; a caller who is not an admin gets 403 from both.

Routes:

* ``GET /console/login``, ``POST /console/login``, ``POST /console/logout``;
* ``GET /console/{queues,trends,backends,cluster}``: a page, its live part rendered at once;
* ``GET /console/{usage,keys,teams,audit}`` (with a store): usage plots and reports, stored
  keys, team weights, quotas and budgets (``POST /console/teams/{action}`` changes them), the
  audit log of admins' changes; ``GET /console/usage.csv`` (totals) and
  ``GET /console/usage-series.csv`` (per hour or day);
* ``GET /console/events?view=NAME``: server-sent events, one ``data:`` frame per refresh
  carrying the view's HTML fragment (``event: logout`` when the credential stops working);
* ``GET /console/api/live``: every replica's live view as JSON;
* ``GET /console/static/{console.js,console.css}``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from urllib.parse import parse_qsl

from aiohttp import web
from markupsafe import Markup

from fairq_server.config.console import LOOPBACK_HOSTS
from fairq_server.console import render, templating
from fairq_server.console.entitlement_forms import ACTIONS, EntitlementForms
from fairq_server.console.feed import LiveFeed
from fairq_server.console.manage import ManageRoutes, store_error
from fairq_server.console.session import Session, Sessions, csrf_ok, same_origin
from fairq_server.doors.http.origin import Asked, asked_for, host_allowed
from fairq_server.errors import SchedulerError
from fairq_server.identity.auth import Authenticator, Principal
from fairq_server.store.engine import short_error, unreachable

__all__ = ["ConsoleRoutes"]

log = logging.getLogger("fairq_server.console")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_STATIC = Path(__file__).parent / "static"
_STATIC_TYPES = {"console.js": "text/javascript", "console.css": "text/css"}
_MAX_FORM_BYTES = 16_384
# Pages and data are the console's own: no other origin may frame, script or read them.
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    # "no-referrer" would make browsers send "Origin: null" with the forms' own POSTs.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}


class ConsoleRoutes:
    """The console's handlers over the shared authenticator and a live feed.

    Args:
        auth: the authenticator both doors share (keys, JWTs).
        feed: the live views.
        session_seconds: how long a login lasts.
        manage: the store's keys and usage views (None: no store).
        forms: the teams, quotas and budgets forms (None: no store).
        allowed_hosts: returns the host names the console answers to now
            (``console.allowed_hosts``).
        trusted_proxies: returns the proxies whose forwarded headers are believed now
            (``http.trusted_proxies``).

    """

    def __init__(
        self,
        auth: Authenticator,
        feed: LiveFeed,
        session_seconds: float,
        manage: ManageRoutes | None = None,
        forms: EntitlementForms | None = None,
        allowed_hosts: Callable[[], Sequence[str]] = lambda: LOOPBACK_HOSTS,
        trusted_proxies: Callable[[], Sequence[str]] = lambda: (),
    ) -> None:
        self._auth = auth
        self._allowed_hosts = allowed_hosts
        self._trusted_proxies = trusted_proxies
        self._manage = manage
        self._forms = forms
        self._feed = feed
        self._sessions = Sessions(session_seconds)
        self._static = {name: (_STATIC / name).read_bytes() for name in _STATIC_TYPES}
        templating.load()  # every template compiled now: a broken one fails the start

    def add_to(self, router: web.UrlDispatcher) -> None:
        """Add the console's routes to ``router`` (each answers only the allowed hosts)."""
        routes: list[tuple[str, str, Handler]] = [
            ("GET", "/console", self._index),
            ("GET", "/console/", self._index),
            ("GET", "/console/login", self._login_form),
            ("POST", "/console/login", self._login),
            ("POST", "/console/logout", self._logout),
            ("GET", "/console/events", self._events),
            ("GET", "/console/api/live", self._live_json),
            ("GET", "/console/static/{name}", self._static_file),
        ]
        routes += [("GET", f"/console/{view}", self._page) for view in render.VIEWS]
        if self._manage is not None:
            routes += [
                ("GET", "/console/keys", self._keys),
                ("POST", "/console/keys", self._keys_change),
                ("POST", "/console/keys/{id}/{verb:rotate|revoke}", self._keys_change),
                ("GET", "/console/usage", self._usage),
                ("GET", "/console/usage.csv", self._usage_csv),
                ("GET", "/console/usage-series.csv", self._usage_csv),
                ("GET", "/console/audit", self._audit),
            ]
        if self._forms is not None:
            actions = "|".join(ACTIONS)
            routes += [
                ("GET", "/console/teams", self._teams),
                ("POST", f"/console/teams/{{action:{actions}}}", self._teams),
            ]
        for method, path, handler in routes:
            router.add_route(method, path, self._for_allowed_hosts(handler))

    async def start(self) -> None:
        """Start the live feed."""
        self._feed.start()

    async def stop(self) -> None:
        """Stop the live feed."""
        await self._feed.stop()

    # -- who is asking --------------------------------------------------------------------

    def _asked(self, request: web.Request) -> Asked:
        """Return what the browser asked for (a trusted proxy's forwarded headers believed)."""
        return asked_for(request, self._trusted_proxies())

    def _form_ok(self, request: web.Request, session: Session, form: dict[str, str] | None) -> bool:
        """Whether a form was posted from this console's page of ``session``."""
        return (
            same_origin(request, self._asked(request))
            and form is not None
            and csrf_ok(session, form.get("csrf", ""))
        )

    def _for_allowed_hosts(self, handler: Handler) -> Handler:
        """Wrap ``handler``: a request for a host the console does not answer to gets 421.

        Checked before anything else (a login, a session), in every mode: in open mode a
        page of another name resolving to this address could otherwise log in and post.
        """

        async def checked(request: web.Request) -> web.StreamResponse:
            host = self._asked(request).host
            allowed = self._allowed_hosts()
            if host_allowed(host, allowed):
                return await handler(request)
            text = (
                f"This console does not answer to the host {host[:200]!r}; it answers to "
                f"{', '.join(allowed)} (console.allowed_hosts)."
            )
            if request.path.startswith(("/console/api/", "/console/events")) or (
                request.path.endswith(".csv")
            ):
                return web.json_response({"error": text}, status=421, headers=_HEADERS)
            return _html(render.message_page("Wrong host", text), 421)

        return checked

    async def _admin(self, credential: str) -> Principal | None:
        """Return the admin behind ``credential``; None if it is not one (or not valid)."""
        try:
            principal = await self._auth.authenticate([("authorization", f"Bearer {credential}")])
        except SchedulerError:
            return None
        return principal if principal.admin else None

    async def _caller(self, request: web.Request) -> tuple[Principal | None, Session | None, int]:
        """Return the admin calling, its session, or the status to refuse with (401, 403)."""
        session = self._sessions.get(request)
        header = request.headers.get("Authorization")
        if session is None and header is None:
            return None, None, 401
        if session is not None:
            principal = await self._admin(session.credential)
            if principal is None:  # revoked, expired, or no longer an admin
                self._sessions.close(session)
                return None, None, 401
            return principal, session, 200
        try:
            principal = await self._auth.authenticate([("authorization", header or "")])
        except SchedulerError:
            return None, None, 401
        return (principal, None, 200) if principal.admin else (None, None, 403)

    # -- login ----------------------------------------------------------------------------

    async def _login_form(self, request: web.Request) -> web.StreamResponse:
        return _html(render.login_page())

    async def _login(self, request: web.Request) -> web.StreamResponse:
        asked = self._asked(request)
        if not same_origin(request, asked):
            return _html(render.message_page("Refused", "The form came from another site."), 403)
        form = await _form(request)
        if form is None:
            return _html(render.login_page("The form is too large."), 413)
        credential = form.get("key", "").strip()
        try:
            principal = await self._auth.authenticate([("authorization", f"Bearer {credential}")])
        except SchedulerError as exc:
            log.warning("console: login refused from %s: %s", request.remote, exc)
            return _html(render.login_page(f"Not logged in: {exc}"), 401)
        if not principal.admin:
            log.warning("console: login refused, '%s' is not an admin", principal.user)
            text = f"'{principal.user}' is not an admin: the console is for admins only."
            return _html(render.message_page("Not an admin", text), 403)
        session = self._sessions.open(credential, principal.user)
        log.info("console: '%s' logged in from %s", principal.user, request.remote)
        if self._manage is not None:
            await self._manage.record(
                principal.user, "console.login", "console", str(request.remote)
            )
        response = _redirect("/console/queues")
        self._sessions.set_cookie(response, session, secure=asked.scheme == "https")
        return response

    async def _logout(self, request: web.Request) -> web.StreamResponse:
        session = self._sessions.get(request)
        form = await _form(request)
        if session is None:
            return _redirect("/console/login")
        if not self._form_ok(request, session, form):
            return _html(render.message_page("Refused", "The form came from another site."), 403)
        self._sessions.close(session)
        log.info("console: '%s' logged out", session.user)
        response = _redirect("/console/login")
        Sessions.clear_cookie(response, secure=self._asked(request).scheme == "https")
        return response

    # -- pages and data -------------------------------------------------------------------

    async def _index(self, request: web.Request) -> web.StreamResponse:
        return _redirect("/console/queues")

    async def _page(self, request: web.Request) -> web.StreamResponse:
        principal, session, status = await self._caller(request)
        if principal is None:
            if status == 401:
                return _redirect("/console/login")
            return _html(render.message_page("Not an admin", "The console is for admins."), 403)
        view = request.path.rsplit("/", 1)[-1]
        if view == "trends":  # the samples taken, not a reading of now
            live = self._feed.html(view)
        else:
            live = render.fragment(view, await self._feed.current(), self._feed.here)
        csrf = session.csrf if session is not None else ""
        return _html(render.page(view, principal.user, csrf, live, self._manage is not None))

    # -- the store's views ----------------------------------------------------------------

    async def _store_page(
        self, request: web.Request, view: str, body: Markup, code: int = 200
    ) -> web.Response:
        principal, session, status = await self._caller(request)
        if principal is None:
            return _redirect("/console/login") if status == 401 else _refusal(status)
        csrf = session.csrf if session is not None else ""
        return _html(render.page(view, principal.user, csrf, body, store=True), code)

    def _store_error(self, exc: Exception) -> tuple[Markup, int]:
        """Return the notice and status of a failed store operation (503: the store is down)."""
        assert self._manage is not None
        return store_error(exc, self._manage.where)

    async def _keys(self, request: web.Request) -> web.StreamResponse:
        principal, session, status = await self._caller(request)
        if principal is None:
            return _redirect("/console/login") if status == 401 else _refusal(status)
        assert self._manage is not None
        csrf = session.csrf if session is not None else ""
        code = 200
        try:
            body = await self._manage.keys_page(csrf)
        except Exception as exc:  # the database down or refusing: said on the page
            body, code = self._store_error(exc)
        return await self._store_page(request, "keys", body, code)

    async def _posted(
        self, request: web.Request
    ) -> tuple[Principal, Session, dict[str, str]] | web.Response:
        """Return who posted a form and the form, or the refusal: a logged-in page only."""
        session = self._sessions.get(request)
        form = await _form(request)
        principal = await self._admin(session.credential) if session is not None else None
        if session is None or principal is None:
            return _refusal(401)
        if form is None or not self._form_ok(request, session, form):
            return _html(render.message_page("Refused", "The form came from another site."), 403)
        return principal, session, form

    async def _keys_change(self, request: web.Request) -> web.StreamResponse:
        """Create, rotate or revoke a key: from a logged-in page of this origin only."""
        posted = await self._posted(request)
        if isinstance(posted, web.Response):
            return posted
        principal, session, form = posted
        assert self._manage is not None
        key_id, verb = request.match_info.get("id", ""), request.match_info.get("verb", "")
        try:
            if verb == "revoke":
                notice = await self._manage.revoke(key_id, principal.user)
            elif verb == "rotate":
                notice = await self._manage.rotate(key_id, principal.user)
            else:
                notice = await self._manage.create(
                    form, principal.user, open_mode=self._auth.open_mode
                )
        except Exception as exc:  # a refusal or the database down: said on the page
            notice, _ = self._store_error(exc)
        code = 200
        try:
            body = await self._manage.keys_page(session.csrf, notice)
        except Exception as exc:  # the keys cannot be listed either (the database down)
            body, code = self._store_error(exc)
            body = notice + body if notice != body else body
        return _html(render.page("keys", principal.user, session.csrf, body, store=True), code)

    async def _teams(self, request: web.Request) -> web.StreamResponse:
        """Show team weights, quotas and budgets; apply a change posted from this page."""
        assert self._forms is not None
        if request.method == "GET":
            principal, session, status = await self._caller(request)
            if principal is None:
                return _redirect("/console/login") if status == 401 else _refusal(status)
            csrf, notice, refill = session.csrf if session is not None else "", Markup(), None
        else:
            posted = await self._posted(request)
            if isinstance(posted, web.Response):
                return posted
            principal, session, form = posted
            csrf = session.csrf
            action = request.match_info["action"]
            notice, done = await self._forms.change(action, form, principal.user)
            # A refused change keeps what was typed, to correct rather than type again.
            refill = None if done or action.endswith("-delete") else form
        body = self._forms.page(csrf, notice, refill)
        return _html(render.page("teams", principal.user, csrf, body, store=True))

    async def _usage(self, request: web.Request) -> web.StreamResponse:
        assert self._manage is not None
        by, since = request.query.get("by", "team"), request.query.get("since", "7d")
        principal, _, status = await self._caller(request)
        if principal is None:
            return _redirect("/console/login") if status == 401 else _refusal(status)
        step, measure = request.query.get("step", "auto"), request.query.get("measure", "")
        code = 200
        try:
            body = await self._manage.usage_page(
                by, since, step, measure or "output_tokens", request.query.get("from", "0")
            )
        except Exception as exc:  # the database down or refusing: said on the page
            body, code = self._store_error(exc)
        return await self._store_page(request, "usage", body, code)

    async def _audit(self, request: web.Request) -> web.StreamResponse:
        principal, _, status = await self._caller(request)
        if principal is None:
            return _redirect("/console/login") if status == 401 else _refusal(status)
        assert self._manage is not None
        code = 200
        try:
            body = await self._manage.audit_page(request.query.get("action", ""))
        except Exception as exc:  # the database down or refusing: said on the page
            body, code = self._store_error(exc)
        return await self._store_page(request, "audit", body, code)

    async def _usage_csv(self, request: web.Request) -> web.StreamResponse:
        principal, _, status = await self._caller(request)
        if principal is None:
            return _refusal(status)
        assert self._manage is not None
        by, since = request.query.get("by", "team"), request.query.get("since", "7d")
        per_bucket = request.path.endswith("/usage-series.csv")
        try:
            if per_bucket:
                text = await self._manage.usage_series_csv(
                    by, since, request.query.get("step", "auto")
                )
            else:
                text = await self._manage.usage_csv(by, since)
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400, headers=_HEADERS)
        except Exception as exc:  # the database down or refusing: said, not a 500
            how = "is unavailable" if unreachable(exc) else "did not answer"
            error = f"the store ({self._manage.where}) {how}: {short_error(exc)}"
            return web.json_response({"error": error}, status=503, headers=_HEADERS)
        name = f"usage-{by}{'-series' if per_bucket else ''}.csv"
        headers = {**_HEADERS, "Content-Disposition": f'attachment; filename="{name}"'}
        return web.Response(text=text, content_type="text/csv", headers=headers)

    async def _live_json(self, request: web.Request) -> web.StreamResponse:
        principal, _, status = await self._caller(request)
        if principal is None:
            return _refusal(status)
        body = json.dumps({"replicas": await self._feed.current()}, separators=(",", ":"))
        return web.Response(text=body, content_type="application/json", headers=_HEADERS)

    async def _events(self, request: web.Request) -> web.StreamResponse:
        principal, session, status = await self._caller(request)
        if principal is None:
            return _refusal(status)
        view = request.query.get("view", "queues")
        if view not in render.VIEWS:
            return web.json_response({"error": f"no view {view[:40]!r}"}, status=404)
        response = web.StreamResponse(
            headers={**_HEADERS, "Content-Type": "text/event-stream", "X-Accel-Buffering": "no"}
        )
        await response.prepare(request)
        credential = request.headers.get("Authorization", "")
        self._feed.watchers += 1
        sent = ""
        try:
            seq = self._feed.seq
            while True:
                last, seq = seq, await self._feed.wait(seq, self._feed.period)
                # Checked at every refresh, and at least once a period without one: a stream
                # ends with its session (logged out in any tab, expired) and its credential.
                if not await self._still_admin(session, credential):
                    await response.write(b"event: logout\ndata: {}\n\n")
                    break
                if seq == last:
                    continue  # no new view in this period
                html = self._feed.html(view)
                if html == sent:  # nothing changed (trends between samples): a comment only
                    await response.write(b": unchanged\n\n")
                    continue
                sent = html
                frame = json.dumps({"html": html}, separators=(",", ":"))
                await response.write(f"data: {frame}\n\n".encode())
        except ConnectionResetError:
            pass  # the page was closed
        finally:
            self._feed.watchers -= 1
        return response

    async def _still_admin(self, session: Session | None, header: str) -> bool:
        """Whether a live stream's caller is still an admin: its session, else its header."""
        if session is not None:
            if not self._sessions.live(session):
                return False
            if await self._admin(session.credential) is None:  # revoked, expired, demoted
                self._sessions.close(session)
                return False
            return True
        try:
            principal = await self._auth.authenticate([("authorization", header)])
        except SchedulerError:
            return False
        return principal.admin

    async def _static_file(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in self._static:
            raise web.HTTPNotFound()
        headers = {**_HEADERS, "Cache-Control": "no-cache"}
        return web.Response(
            body=self._static[name], content_type=_STATIC_TYPES[name], headers=headers
        )


async def _form(request: web.Request) -> dict[str, str] | None:
    """Read a small urlencoded form (None: larger than a form of the console's can be)."""
    if request.content_length is not None and request.content_length > _MAX_FORM_BYTES:
        return None
    body = await request.content.read(_MAX_FORM_BYTES + 1)
    if len(body) > _MAX_FORM_BYTES:
        return None
    try:
        return dict(parse_qsl(body.decode(errors="replace"), max_num_fields=20))
    except ValueError:  # more fields than any of the console's forms has
        return None


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", headers=_HEADERS)


def _redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={**_HEADERS, "Location": location})


def _refusal(status: int) -> web.Response:
    text = "log in at /console/login" if status == 401 else "the console is for admins only"
    return web.json_response({"error": text}, status=status, headers=_HEADERS)
