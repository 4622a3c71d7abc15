"""The console's store views: stored keys (create, rotate, revoke) and usage (table, CSV).

They call the store's own operations, the ones the Admin RPCs
(``doors/grpc/admin_store.py``) and the ``fairq keys`` / ``fairq usage`` commands reach, so a
key revoked here is refused on every replica as one revoked by the CLI is. Every change is
logged with who made it and what it was (``fairq_server.console``). Forms post only from a
logged-in page of this origin, with the session's CSRF token; a secret is shown once, on the
page that answers its creation.
"""

from __future__ import annotations

import csv
import io
import logging
import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace

from markupsafe import Markup

from fairq_server.config.identity import KeyConfig
from fairq_server.console.plot import usage_plot
from fairq_server.console.templating import render
from fairq_server.errors import SchedulerError
from fairq_server.store.audit import ACTIONS
from fairq_server.store.engine import short_error, unreachable
from fairq_server.store.reports import GROUPINGS
from fairq_server.store.series import MEASURES, STEPS, Series
from fairq_server.store.service import Store

__all__ = ["ManageRoutes", "csv_text", "parse_since", "store_error"]

log = logging.getLogger("fairq_server.console")

AUDIT_ROWS = 200
#: Days of the ledger searched for a key's user's last request.
LAST_USE_DAYS = 30
#: Rows of the usage report per page (the CSV has them all).
USAGE_ROWS = 50
_UNITS = {"m": 60, "h": 3600, "d": 86400}
_NO_NOTICE = Markup()


def parse_since(text: str, now: float) -> float:
    """Return the start of a range given as ``30m``, ``24h`` or ``7d`` before ``now``.

    Raises:
        ValueError: not a positive number of minutes, hours or days.

    """
    unit = _UNITS.get(text[-1:])
    if unit is None or not text[:-1].isdigit() or int(text[:-1]) <= 0:
        raise ValueError(f"since must be like 30m, 24h or 7d, not {text[:20]!r}")
    return now - int(text[:-1]) * unit


class ManageRoutes:
    """Keys and usage pages over ``store``; the console's routes check who is asking.

    Args:
        store: fairq's store.
        file_keys: returns the configuration file's keys (listed beside the stored ones).

    """

    def __init__(self, store: Store, file_keys: Callable[[], Sequence[KeyConfig]] = tuple) -> None:
        self._store = store
        self._file_keys = file_keys  # the configuration's keys now (a reload changes them)

    @property
    def where(self) -> str:
        """The store's database, fit for a message (the password hidden)."""
        return self._store.described

    async def keys_page(self, csrf: str, notice: Markup = _NO_NOTICE) -> Markup:
        """Return the keys view's body: the create form, every stored key, the file's keys.

        Each key says when it expires and when it was last used: a stored key its own last
        use (recorded by the replicas, written a minute at a time), a file key its user's
        last request over the last :data:`LAST_USE_DAYS` days (the ledger records users, not
        keys: a user with two file keys shows the same moment on both).
        """
        now = time.time()
        keys = await self._store.keys.list(include_revoked=True)
        file_keys = list(self._file_keys())
        users = {k.user for k in file_keys}
        last = await self._store.last_requests(users, now - LAST_USE_DAYS * 86400) if users else {}
        rows = []
        for k in keys:
            if k.revoked_at:
                state = "revoked"
            elif k.expires_at is not None and k.expires_at <= now:
                state = "expired"
            else:
                state = "active"
            rows.append(
                SimpleNamespace(
                    key=k,
                    state=state,
                    created=_when(k.created_at),
                    expires=_when(k.expires_at) if k.expires_at is not None else "never",
                    last=_last(k.last_used_at, now),
                )
            )
        file_rows = [
            SimpleNamespace(key=k, weight=f"{k.weight:g}", last=_last(last.get(k.user), now))
            for k in sorted(file_keys, key=lambda k: k.user)
        ]
        return render(
            "keys.html", notice=notice, csrf=csrf, keys=rows, file_keys=file_rows,
            days=LAST_USE_DAYS,
        )  # fmt: skip

    async def record(self, who: str, action: str, target: str, detail: str = "") -> Markup:
        """Write the change to the audit log; return a warning to show if that failed.

        The change is made by then: a failed audit write is said on the page and logged, and
        does not undo it.
        """
        try:
            await self._store.audit.record(who, "console", action, target, detail)
        except Exception as exc:
            log.error(
                "console: the audit log did not take %s %s by '%s': %s", action, target, who, exc
            )
            return _error(f"Done, but the audit log did not record it: {str(exc)[:200]}")
        return _NO_NOTICE

    async def create(self, form: dict[str, str], who: str, *, open_mode: bool = False) -> Markup:
        """Create a key from ``form``; return the notice showing its secret (once).

        ``open_mode``: no key exists yet, so this one must be an admin's (see
        :meth:`~fairq_server.store.keys.KeyStore.create`).
        """
        tiers = tuple(t.strip() for t in form.get("tiers", "").split(",") if t.strip())
        key, secret = await self._store.keys.create(
            form.get("user", "").strip(),
            team=form.get("team", "").strip() or None,
            tiers=tiers,
            admin=form.get("admin") == "1",
            open_mode=open_mode,
        )
        log.info("console: '%s' created key %s for user '%s'", who, key.id, key.user)
        detail = f"user {key.user}, team {key.team or '-'}, tiers {','.join(key.tiers) or 'all'}"
        warning = await self.record(who, "key.create", key.id, detail + (", admin" * key.admin))
        return warning + render(
            "notice.html", kind="created", key=key.id, user=key.user, secret=secret
        )

    async def revoke(self, key_id: str, who: str) -> Markup:
        """Revoke ``key_id``; return the notice."""
        key = await self._store.keys.revoke(key_id)
        if key is None:
            return _error(f"No stored key {key_id[:64]}.")
        log.info("console: '%s' revoked key %s of user '%s'", who, key.id, key.user)
        warning = await self.record(who, "key.revoke", key.id, f"user {key.user}")
        text = f"Key {key.id} of {key.user} revoked."
        return warning + render("notice.html", kind="done", text=text)

    async def rotate(self, key_id: str, who: str) -> Markup:
        """Rotate ``key_id`` (the old one stops at once); return the notice with the secret."""
        rotated = await self._store.keys.rotate(key_id, 0.0)
        if rotated is None:
            return _error(f"No active stored key {key_id[:64]}.")
        key, secret = rotated
        log.info("console: '%s' rotated key %s into %s (user '%s')", who, key_id, key.id, key.user)
        detail = f"replaced by {key.id}, user {key.user}"
        warning = await self.record(who, "key.rotate", key_id, detail)
        return warning + render(
            "notice.html", kind="rotated", key=key_id, new_key=key.id, secret=secret
        )

    async def audit_page(self, action: str) -> Markup:
        """Return the audit view's body: the newest changes (of ``action`` only, if given)."""
        entries = None
        if not action or action in ACTIONS:
            entries = [
                SimpleNamespace(
                    when=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(a.at)),
                    actor=a.actor,
                    via=a.via,
                    action=a.action,
                    target=a.target,
                    detail=a.detail,
                    replica=a.replica,
                )
                for a in await self._store.audit.recent(AUDIT_ROWS, action)
            ]
        return render(
            "audit.html",
            entries=entries,
            action=action,
            actions=["", *ACTIONS],
            rows=AUDIT_ROWS,
            retention=f"{self._store.config.audit_retention_days:g}",
            max_rows=self._store.config.audit_max_rows,
        )

    async def usage_rows(self, by: str, since: str) -> list[list[object]]:
        """Return the usage report as rows (name first), most output tokens first.

        Raises:
            ValueError: ``by`` or ``since`` is not valid.

        """
        if by not in GROUPINGS:
            raise ValueError(f"by must be one of {', '.join(sorted(GROUPINGS))}")
        report = await self._store.report(by, parse_since(since, time.time()))
        return [
            [r.name or "", r.requests, r.finished, r.input_tokens, r.output_tokens, r.cost]
            for r in report
        ]

    async def usage_page(
        self,
        by: str,
        since: str,
        step: str = "auto",
        measure: str = "output_tokens",
        start: str = "0",
    ) -> Markup:
        """Return the usage view's body: the range form, the plot over time and the report.

        The report lists :data:`USAGE_ROWS` rows from ``start`` (by output tokens, largest
        first), says how many of how many it shows and links the next and previous ones: by
        user it could be every user's (10,000 rows made 839 KB and 70,000 DOM nodes). The CSV
        has them all.
        """
        now = time.time()
        form = {"groupings": sorted(GROUPINGS), "measures": list(MEASURES)}
        form["steps"] = ["auto", *STEPS]
        try:
            rows = await self.usage_rows(by, since)
            if measure not in MEASURES:
                raise ValueError(f"measure must be one of {', '.join(MEASURES)}")
            if not start.isdigit():
                raise ValueError(f"from must be a row number, not {start[:20]!r}")
            step, series = await self._series(by, since, step, now)
        except ValueError as exc:
            return render(
                "usage.html", error=str(exc), by="team", since="7d", step="auto",
                measure="output_tokens", **form,
            )  # fmt: skip
        first = min(int(start), max(0, len(rows) - 1))
        shown = rows[first : first + USAGE_ROWS]
        after = first + len(shown)
        return render(
            "usage.html",
            error="",
            by=by,
            since=since,
            step=step,
            measure=measure,
            **form,
            plot=usage_plot(series, measure, by),
            header=_CSV_HEADER,
            shown=[[c if i != 5 else f"{c:.4f}" for i, c in enumerate(r)] for r in shown],
            total=len(rows),
            first=first,
            previous=max(0, first - USAGE_ROWS) if first > 0 else None,
            next=min(USAGE_ROWS, len(rows) - after) if after < len(rows) else None,
            page_rows=USAGE_ROWS,
        )

    async def _series(self, by: str, since: str, step: str, now: float) -> tuple[str, Series]:
        """Return the step taken (``auto``: hours up to two days, else days) and the series.

        Raises:
            ValueError: ``by``, ``since`` or ``step`` is not valid, or too many buckets.

        """
        start = parse_since(since, now)
        if step == "auto":
            step = "hour" if now - start <= 2 * 86400 else "day"
        return step, await self._store.series(by, step, start, now)

    async def usage_series_csv(self, by: str, since: str, step: str) -> str:
        """Return usage per bucket and group as CSV (the plot's numbers, every measure).

        One row per group and bucket with some usage, oldest first; ``bucket_start`` in UTC.

        Raises:
            ValueError: ``by``, ``since`` or ``step`` is not valid, or too many buckets.

        """
        _, series = await self._series(by, since, step, time.time())
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["bucket_start", "name", *MEASURES])
        groups = sorted(series.values["requests"], key=lambda g: (g is not None, g or ""))
        for i, start in enumerate(series.starts):
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))
            for g in groups:
                values = [series.values[m][g][i] for m in MEASURES]
                if any(values):
                    writer.writerow(
                        [
                            when,
                            csv_text(g or ""),
                            *(_csv_number(m, v) for m, v in zip(MEASURES, values, strict=True)),
                        ]
                    )
        return out.getvalue()

    async def usage_csv(self, by: str, since: str) -> str:
        """Return the usage report as CSV text.

        Raises:
            ValueError: ``by`` or ``since`` is not valid.

        """
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(_CSV_HEADER)
        writer.writerows([csv_text(r[0]), *r[1:]] for r in await self.usage_rows(by, since))
        return out.getvalue()


# A cell starting with one of these is a formula to a spreadsheet (OWASP "CSV injection").
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_text(value: object) -> str:
    """Return a name for a CSV cell: one a spreadsheet would run as a formula gets a ``'``.

    A user named ``=HYPERLINK("http://...","x")`` opens as a live link (or worse) in the
    spreadsheet an operator loads the usage into; the apostrophe makes it text, and shows.
    """
    text = str(value)
    return "'" + text if text.startswith(_FORMULA_START) else text


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(epoch))


def _last(epoch: float | None, now: float) -> SimpleNamespace | None:
    """Return a last use for a person: how long ago, and when (None: none in the range)."""
    if epoch is None:
        return None
    ago = max(0.0, now - epoch)
    if ago < 120:
        text = f"{ago:.0f} s ago"
    elif ago < 7200:
        text = f"{ago / 60:.0f} min ago"
    elif ago < 172800:
        text = f"{ago / 3600:.0f} h ago"
    else:
        text = f"{ago / 86400:.0f} days ago"
    return SimpleNamespace(iso=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch)), ago=text)


def _csv_number(measure: str, value: float) -> str:
    return repr(value) if measure == "cost" else str(int(value))


_CSV_HEADER = ["name", "requests", "finished", "input_tokens", "output_tokens", "cost"]


def _error(text: str) -> Markup:
    """Return a refusal or a failure, said on the page."""
    return render("notice.html", kind="error", text=text)


def store_error(exc: Exception, where: str = "") -> tuple[Markup, int]:
    """Return the notice for an operation the store refused or could not do, and the status.

    The database down (``where`` names it) is 503, as the Admin API's ``UNAVAILABLE``; a
    refusal of the input is said on the page as before.
    """
    if not unreachable(exc) and isinstance(exc, SchedulerError | ValueError):
        return _error(str(exc)[:300]), 200
    how = "is unavailable" if unreachable(exc) else "did not answer"
    named = f"The store ({where})" if where else "The store"
    return _error(f"{named} {how}: {short_error(exc)}"), 503
