"""The console's store views: stored keys (create, rotate, revoke) and usage (table, CSV).

They call the store's own operations, the ones the Admin RPCs (``api/admin_store.py``) and the
``fairq keys`` / ``fairq usage`` commands reach, so a key revoked here is refused on every
replica as one revoked by the CLI is. Every change is logged with who made it and what it
was (``fairq_server.console``). Forms post only from a logged-in page of this origin, with
the session's CSRF token; a secret is shown once, on the page that answers its creation.
"""

from __future__ import annotations

import csv
import io
import logging
import time
from collections.abc import Callable, Sequence

from fairq_server.errors import SchedulerError
from fairq_server.http.console.plot import usage_plot
from fairq_server.http.console.text import esc as _e
from fairq_server.identity.settings import KeyConfig
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

    async def keys_page(self, csrf: str, notice: str = "") -> str:
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
            actions = ""
            if not k.revoked_at:
                actions = "".join(
                    f'<form method="post" action="/console/keys/{_e(k.id)}/{verb}" class="inline">'
                    f'<input type="hidden" name="csrf" value="{_e(csrf)}">'
                    f'<button type="submit" aria-label="{verb} the key of {_e(k.user)} '
                    f'({_e(k.id)})">{verb.capitalize()}</button></form>'
                    for verb in ("rotate", "revoke")
                )
            expires = _when(k.expires_at) if k.expires_at is not None else "never"
            rows.append(
                f'<tr data-key="{_e(k.id)}" data-state="{state}"><td>{_e(k.id)}</td>'
                f"<td>{_e(k.user)}</td><td>{_e(k.team or '—')}</td>"
                f"<td>{_e(', '.join(k.tiers) or 'all')}</td><td>{'yes' if k.admin else 'no'}</td>"
                f"<td>{_when(k.created_at)}</td><td>{expires}</td>"
                f"<td>{_last(k.last_used_at, now)}</td><td>{state}</td><td>{actions}</td></tr>"
            )
        table = _keys_table(
            "Stored keys",
            ("Id", "User", "Team", "Tiers", "Admin", "Created", "Expires", "Last used", "State",
             ""),
            rows,
        )  # fmt: skip
        file_rows = [
            f'<tr data-file-key="{_e(k.user)}"><td>{_e(k.user)}</td><td>{_e(k.team or "—")}</td>'
            f"<td>{_e(', '.join(k.tiers) or 'all')}</td><td>{'yes' if k.admin else 'no'}</td>"
            f"<td>{k.weight:g}</td><td>{_last(last.get(k.user), now)}</td></tr>"
            for k in sorted(file_keys, key=lambda k: k.user)
        ]
        from_file = _keys_table(
            "Keys from the configuration file (changed there, applied at a reload; they never "
            "expire)",
            ("User", "Team", "Tiers", "Admin", "Weight",
             f"Last request of its user ({LAST_USE_DAYS} days)"),
            file_rows,
        )  # fmt: skip
        form = (
            '<form method="post" action="/console/keys" class="create"><fieldset>'
            "<legend>New key</legend>"
            f'<input type="hidden" name="csrf" value="{_e(csrf)}">'
            '<label for="user">User</label><input id="user" name="user" required>'
            '<label for="team">Team (optional)</label><input id="team" name="team">'
            '<label for="tiers">Tiers (comma-separated; empty: all)</label>'
            '<input id="tiers" name="tiers">'
            '<label><input type="checkbox" name="admin" value="1"> Admin</label>'
            '<button type="submit">Create key</button></fieldset></form>'
        )
        return notice + form + table + (from_file if file_keys else "")

    async def record(self, who: str, action: str, target: str, detail: str = "") -> str:
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
            return (
                '<p class="error" role="alert">Done, but the audit log did not record it: '
                f"{_e(str(exc)[:200])}</p>"
            )
        return ""

    async def create(self, form: dict[str, str], who: str, *, open_mode: bool = False) -> str:
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
        return warning + (
            f'<div class="notice" role="status"><p>Key {_e(key.id)} created for '
            f"<strong>{_e(key.user)}</strong>. Its secret is shown this once; copy it now:</p>"
            f'<p><output class="secret" aria-label="the new secret">{_e(secret)}</output></p></div>'
        )

    async def revoke(self, key_id: str, who: str) -> str:
        """Revoke ``key_id``; return the notice."""
        key = await self._store.keys.revoke(key_id)
        if key is None:
            return f'<p class="error" role="alert">No stored key {_e(key_id[:64])}.</p>'
        log.info("console: '%s' revoked key %s of user '%s'", who, key.id, key.user)
        warning = await self.record(who, "key.revoke", key.id, f"user {key.user}")
        return (
            warning
            + f'<p class="notice" role="status">Key {_e(key.id)} of {_e(key.user)} revoked.</p>'
        )

    async def rotate(self, key_id: str, who: str) -> str:
        """Rotate ``key_id`` (the old one stops at once); return the notice with the secret."""
        rotated = await self._store.keys.rotate(key_id, 0.0)
        if rotated is None:
            return f'<p class="error" role="alert">No active stored key {_e(key_id[:64])}.</p>'
        key, secret = rotated
        log.info("console: '%s' rotated key %s into %s (user '%s')", who, key_id, key.id, key.user)
        detail = f"replaced by {key.id}, user {key.user}"
        warning = await self.record(who, "key.rotate", key_id, detail)
        return warning + (
            f'<div class="notice" role="status"><p>Key {_e(key_id)} replaced by {_e(key.id)}. '
            "Its secret is shown this once; copy it now:</p>"
            f'<p><output class="secret" aria-label="the new secret">{_e(secret)}</output></p></div>'
        )

    async def audit_page(self, action: str) -> str:
        """Return the audit view's body: the newest changes (of ``action`` only, if given)."""
        if action and action not in ACTIONS:
            return f'<p class="error" role="alert">No action {_e(action[:64])}.</p>' + _audit_form(
                ""
            )
        entries = await self._store.audit.recent(AUDIT_ROWS, action)
        rows = "".join(
            "<tr>"
            + f"<td>{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(a.at))} UTC</td>"
            + "".join(f"<td>{_e(c)}</td>" for c in (a.actor, a.via, a.action, a.target, a.detail))
            + f"<td>{_e(a.replica)}</td></tr>"
            for a in entries
        )
        retention = self._store.config.audit_retention_days
        caption = (
            f"The newest {AUDIT_ROWS} changes{f' ({_e(action)})' if action else ''}; "
            f"kept {retention:g} days, at most {self._store.config.audit_max_rows} rows"
        )
        headers = ("When", "Who", "Through", "Action", "Target", "Detail", "Replica")
        return (
            _audit_form(action)
            + f"<table><caption>{caption}</caption><thead><tr>"
            + "".join(f'<th scope="col">{h}</th>' for h in headers)
            + f"</tr></thead><tbody>{rows}</tbody></table>"
            + ("" if entries else '<p class="empty">No change recorded.</p>')
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
    ) -> str:
        """Return the usage view's body: the range form, the plot over time and the report.

        The report lists :data:`USAGE_ROWS` rows from ``start`` (by output tokens, largest
        first), says how many of how many it shows and links the next and previous ones: by
        user it could be every user's (10,000 rows made 839 KB and 70,000 DOM nodes). The CSV
        has them all.
        """
        now = time.time()
        try:
            rows = await self.usage_rows(by, since)
            if measure not in MEASURES:
                raise ValueError(f"measure must be one of {', '.join(MEASURES)}")
            if not start.isdigit():
                raise ValueError(f"from must be a row number, not {start[:20]!r}")
            step, series = await self._series(by, since, step, now)
        except ValueError as exc:
            return f'<p class="error" role="alert">{_e(exc)}</p>' + _usage_form(
                "team", "7d", "auto", "output_tokens"
            )
        first = min(int(start), max(0, len(rows) - 1))
        shown = rows[first : first + USAGE_ROWS]
        body = "".join(
            "<tr>"
            + "".join(f"<td>{_e(c if i != 5 else f'{c:.4f}')}</td>" for i, c in enumerate(r))
            + "</tr>"
            for r in shown
        )
        query = f"by={_e(by)}&amp;since={_e(since)}"
        csv_link = f"/console/usage.csv?{query}"
        series_link = f"/console/usage-series.csv?{query}&amp;step={step}"
        page_link = f"/console/usage?{query}&amp;step={_e(step)}&amp;measure={_e(measure)}"
        pages = []
        if first > 0:
            back = max(0, first - USAGE_ROWS)
            pages.append(
                f'<a href="{page_link}&amp;from={back}" rel="prev">Previous {USAGE_ROWS}</a>'
            )
        if first + len(shown) < len(rows):
            pages.append(
                f'<a href="{page_link}&amp;from={first + len(shown)}" rel="next">'
                f"Next {min(USAGE_ROWS, len(rows) - first - len(shown))}</a>"
            )
        count = (
            f'<p class="shown" data-shown="{len(shown)}" data-total="{len(rows)}">'
            f"{len(shown)} of {len(rows)} shown"
            + (f" (rows {first + 1} to {first + len(shown)})" if len(shown) < len(rows) else "")
            + (" · " + " · ".join(pages) if pages else "")
            + "</p>"
        )
        return (
            _usage_form(by, since, step, measure)
            + usage_plot(series, measure, by)
            + "<table><caption>Usage by "
            + _e(by)
            + " over the last "
            + _e(since)
            + "</caption><thead><tr>"
            + "".join(f'<th scope="col">{h}</th>' for h in _CSV_HEADER)
            + f"</tr></thead><tbody>{body}</tbody></table>"
            + count
            + f'<p><a href="{csv_link}" download>Download as CSV</a> · '
            + f'<a href="{series_link}" download>Download per {step} as CSV</a></p>'
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


def _last(epoch: float | None, now: float) -> str:
    """Write a last use for a person: how long ago, and when (a dash: none in the range)."""
    if epoch is None:
        return "—"
    ago = max(0.0, now - epoch)
    if ago < 120:
        text = f"{ago:.0f} s ago"
    elif ago < 7200:
        text = f"{ago / 60:.0f} min ago"
    elif ago < 172800:
        text = f"{ago / 3600:.0f} h ago"
    else:
        text = f"{ago / 86400:.0f} days ago"
    return (
        f'<time datetime="{time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))}">{text}</time>'
    )


def _keys_table(caption: str, headers: tuple[str, ...], rows: list[str]) -> str:
    head = "".join(f'<th scope="col">{h}</th>' for h in headers)
    body = "".join(rows) or f'<tr><td colspan="{len(headers)}">None.</td></tr>'
    return (
        f"<table><caption>{caption}</caption><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


def _csv_number(measure: str, value: float) -> str:
    return repr(value) if measure == "cost" else str(int(value))


_CSV_HEADER = ["name", "requests", "finished", "input_tokens", "output_tokens", "cost"]


def _select(name: str, label: str, choices: list[str], chosen: str) -> str:
    options = "".join(
        f'<option value="{c}"{" selected" if c == chosen else ""}>{c.replace("_", " ")}</option>'
        for c in choices
    )
    return (
        f'<label for="{name}">{label}</label><select id="{name}" name="{name}">{options}</select>'
    )


def _usage_form(by: str, since: str, step: str, measure: str) -> str:
    return (
        '<form method="get" action="/console/usage" class="range">'
        + _select("by", "By", sorted(GROUPINGS), by)
        + _select("measure", "Plot", list(MEASURES), measure)
        + '<label for="since">Over the last (30m, 24h, 7d)</label>'
        + f'<input id="since" name="since" value="{_e(since)}" size="6">'
        + _select("step", "Per", ["auto", *STEPS], step)
        + '<button type="submit">Show</button></form>'
    )


def _audit_form(action: str) -> str:
    return (
        '<form method="get" action="/console/audit" class="range">'
        + _select("action", "Action", ["", *ACTIONS], action).replace(
            '<option value=""', '<option value="" label="every action"'
        )
        + '<button type="submit">Show</button></form>'
    )


def store_error(exc: Exception, where: str = "") -> tuple[str, int]:
    """Return the notice for an operation the store refused or could not do, and the status.

    The database down (``where`` names it) is 503, as the Admin API's ``UNAVAILABLE``; a
    refusal of the input is said on the page as before.
    """
    if not unreachable(exc) and isinstance(exc, SchedulerError | ValueError):
        return f'<p class="error" role="alert">{_e(str(exc)[:300])}</p>', 200
    how = "is unavailable" if unreachable(exc) else "did not answer"
    named = f"The store ({where})" if where else "The store"
    return f'<p class="error" role="alert">{named} {how}: {_e(short_error(exc))}</p>', 503
