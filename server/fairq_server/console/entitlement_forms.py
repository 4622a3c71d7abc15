"""The console's teams view: team weights, quotas and budgets in force, and forms to change them.

The forms call :class:`~fairq_server.tenancy.managed.ManagedEntitlement`, as the Admin RPCs
do (``SetTeam``, ``SetLimit``, ...), so a change made here is checked by the configuration
file's rules, recorded in the audit log (``via console``) and in force on every replica within
one poll. Entries from the configuration file are listed with their source and cannot be
deleted here (a stored entry of the same subject overrides one).
"""

from __future__ import annotations

import logging
from html import escape

from fairq_server.config.entitlement import BudgetConfig, QuotaConfig
from fairq_server.console.text import esc as _e
from fairq_server.errors import InvalidRequestError
from fairq_server.store.entitlement import LimitEntry, subject_of
from fairq_server.tenancy.managed import STORE, ManagedEntitlement, describe_limit

__all__ = ["ACTIONS", "EntitlementForms", "limit_from_form"]

log = logging.getLogger("fairq_server.console")

#: The changes posted to ``/console/teams/{action}``.
ACTIONS = ("team", "team-delete", "limit", "limit-delete")
_QUOTA_FIELDS = ("tokens_per_minute", "tokens_per_day", "requests_per_minute")
_BUDGET_FIELDS = ("per_day", "per_month")


def _number(form: dict[str, str], kind: str, name: str) -> float | None:
    text = form.get(name, "").strip()
    if not text:
        return None
    try:
        return int(text) if kind == "quota" else float(text)
    except ValueError:
        what = "a whole number" if kind == "quota" else "a number"
        raise InvalidRequestError(f"{kind}.{name} must be {what}, not {text[:32]!r}") from None


def limit_from_form(form: dict[str, str]) -> LimitEntry:
    """Return the quota or budget the add form gives.

    Raises:
        InvalidRequestError: naming the field at fault (the rest is checked by the file's rules).

    """
    kind, scope = form.get("kind", ""), form.get("scope", "")
    if kind not in ("quota", "budget"):
        raise InvalidRequestError("kind must be quota or budget")
    if scope not in ("team", "user"):
        raise InvalidRequestError(f"{kind}: the subject must be a team or a user")
    name, model = form.get("name", "").strip(), form.get("model", "").strip()
    subject = {"team": name} if scope == "team" else {"user": name}
    mode = form.get("mode", "hard")
    other = _BUDGET_FIELDS if kind == "quota" else _QUOTA_FIELDS
    given = [f for f in other if form.get(f, "").strip()]
    if given:
        raise InvalidRequestError(f"{kind}: {', '.join(given)} is for the other kind of limit")
    if kind == "quota":
        amounts = {f: _number(form, kind, f) for f in _QUOTA_FIELDS}
        return QuotaConfig(**subject, model=model, mode=mode, **amounts)  # type: ignore[arg-type]
    budget = {f: _number(form, kind, f) for f in _BUDGET_FIELDS}
    return BudgetConfig(**subject, model=model, mode=mode, **budget)  # type: ignore[arg-type]


def _hidden(csrf: str, **fields: str) -> str:
    pairs = {"csrf": csrf, **fields}
    # Posted back as they are: a name holding a control character must still match.
    return "".join(
        f'<input type="hidden" name="{k}" value="{escape(v, quote=True)}">'
        for k, v in pairs.items()
    )


def _input(
    name: str, label: str, kind: str = "text", extra: str = "", refill: dict[str, str] | None = None
) -> str:
    # After a refusal the form shows what was typed (posted back as it is), to be corrected.
    value = (refill or {}).get(name, "")
    given = f' value="{escape(value, quote=True)}"' if value else ""
    return (
        f'<label for="{name}">{label}</label>'
        f'<input id="{name}" name="{name}" type="{kind}"{extra}{given}>'
    )


def _select(
    name: str, label: str, choices: tuple[str, ...], refill: dict[str, str] | None = None
) -> str:
    chosen = (refill or {}).get(name)
    options = "".join(
        f'<option value="{c}"{" selected" if c == chosen else ""}>{c}</option>' for c in choices
    )
    return (
        f'<label for="{name}">{label}</label><select id="{name}" name="{name}">{options}</select>'
    )


def _table(caption: str, headers: tuple[str, ...], rows: list[str], empty: str) -> str:
    head = "".join(f'<th scope="col">{h}</th>' for h in headers)
    body = "".join(rows) or f'<tr><td colspan="{len(headers)}">{empty}</td></tr>'
    return (
        f"<table><caption>{caption}</caption><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


class EntitlementForms:
    """The teams view over ``managed``; the console's routes check who is asking."""

    def __init__(self, managed: ManagedEntitlement) -> None:
        self._managed = managed

    def page(self, csrf: str, notice: str = "", refill: dict[str, str] | None = None) -> str:
        """Return the teams view's body: the forms and the entries in force.

        ``refill``: a refused form's fields, shown again in its inputs.
        """
        effective = self._managed.effective()
        team_rows = []
        for t in effective.teams:
            source = effective.team_source(t)
            delete = ""
            if source == STORE:
                delete = (
                    '<form method="post" action="/console/teams/team-delete" class="inline">'
                    + _hidden(csrf, name=t.name)
                    + f'<button type="submit" aria-label="delete the stored weight of team '
                    f'{_e(t.name)}">Delete</button></form>'
                )
            team_rows.append(
                f'<tr data-team="{_e(t.name)}"><td>{_e(t.name)}</td><td>{t.weight:g}</td>'
                f"<td>{source}</td><td>{delete}</td></tr>"
            )
        limit_rows = []
        entries: list[LimitEntry] = [*effective.quotas, *effective.budgets]
        for entry in entries:
            kind, scope, subject, model = subject_of(entry)
            source = effective.limit_source(entry)
            delete = ""
            if source == STORE:
                fields = {"kind": kind, "scope": scope, "name": subject, "model": model}
                delete = (
                    '<form method="post" action="/console/teams/limit-delete" class="inline">'
                    + _hidden(csrf, **fields)
                    + f'<button type="submit" aria-label="delete the {kind} of {scope} '
                    f'{_e(subject)}">Delete</button></form>'
                )
            limit_rows.append(
                f'<tr data-limit="{kind} {scope} {_e(subject)}"><td>{kind}</td><td>{scope} '
                f"{_e(subject)}</td><td>{_e(model or 'all')}</td><td>{_e(describe_limit(entry))}"
                f"</td><td>{source}</td><td>{delete}</td></tr>"
            )
        team_form = (
            '<form method="post" action="/console/teams/team" class="create"><fieldset>'
            "<legend>Set a team's weight</legend>"
            + _hidden(csrf)
            + _input("team-name", "Team", extra=" required", refill=refill)
            # No HTML bound says "above 0": the smallest positive step the form takes.
            + _input(
                "team-weight",
                "Weight (above 0)",
                "number",
                ' step="any" min="0.000001" required',
                refill,
            )
            + '<button type="submit">Set weight</button></fieldset></form>'
        )
        limit_form = (
            '<form method="post" action="/console/teams/limit" class="create"><fieldset>'
            "<legend>Add or replace a quota or budget</legend>"
            + _hidden(csrf)
            + _select("kind", "Kind", ("quota", "budget"), refill)
            + _select("scope", "For a", ("team", "user"), refill)
            + _input("name", "Team or user (* for every user)", extra=" required", refill=refill)
            + _input("model", "Model (empty: all models)", refill=refill)
            + "".join(
                _input(f, f.replace("_", " ").capitalize(), "number", ' min="1" step="1"', refill)
                for f in _QUOTA_FIELDS
            )
            + "".join(
                _input(f, f"Budget {f.replace('_', ' ')}", "number", ' min="0" step="any"', refill)
                for f in _BUDGET_FIELDS
            )
            + _select("mode", "Mode", ("hard", "soft"), refill)
            + '<button type="submit">Save limit</button></fieldset></form>'
        )
        teams = _table(
            "Teams in force (file, or store: overrides the file's team of the same name)",
            ("Team", "Weight", "Source", ""), team_rows, "No team: every user is its own team.",
        )  # fmt: skip
        limits = _table(
            "Quotas and budgets in force (a stored one overrides the file's of the same subject)",
            ("Kind", "Subject", "Model", "Limits", "Source", ""), limit_rows, "No quota or budget.",
        )  # fmt: skip
        return notice + team_form + teams + limit_form + limits

    async def change(self, action: str, form: dict[str, str], who: str) -> tuple[str, bool]:
        """Apply one posted change; return the notice to show and whether it was made.

        An error is said in the notice, not raised.
        """
        try:
            return await self._change(action, form, who), True
        except InvalidRequestError as exc:
            return f'<p class="error" role="alert">{_e(str(exc)[:300])}</p>', False
        except Exception as exc:  # the database down or refusing: said on the page
            text = f"The store did not answer: {_e(str(exc)[:300])}"
            return f'<p class="error" role="alert">{text}</p>', False

    async def _change(self, action: str, form: dict[str, str], who: str) -> str:
        managed = self._managed
        if action == "team":
            name = form.get("team-name", "").strip()
            try:
                weight = float(form.get("team-weight", ""))
            except ValueError:
                raise InvalidRequestError("team.weight must be a number") from None
            team = await managed.set_team(who, "console", name, weight)
            log.info("console: '%s' set team '%s' to weight %g", who, team.name, team.weight)
            return _notice(f"Team {team.name} has weight {team.weight:g} on every replica.")
        if action == "team-delete":
            name = form.get("name", "")
            if not await managed.delete_team(who, "console", name):
                raise InvalidRequestError(f"the store has no team {name[:64]!r}")
            return _notice(f"The stored weight of team {name} is deleted.")
        if action == "limit":
            entry = limit_from_form(form)
            await managed.set_limit(who, "console", entry)
            kind, scope, subject, _ = subject_of(entry)
            log.info("console: '%s' set the %s of %s '%s'", who, kind, scope, subject)
            return _notice(f"The {kind} of {scope} {subject} is in force on every replica.")
        kind, scope, name = form.get("kind", ""), form.get("scope", ""), form.get("name", "")
        if not await managed.delete_limit(who, "console", kind, scope, name, form.get("model", "")):
            raise InvalidRequestError(f"the store has no {kind[:16]} of {scope[:16]} {name[:64]!r}")
        return _notice(f"The stored {kind} of {scope} {name} is deleted.")


def _notice(text: str) -> str:
    return f'<p class="notice" role="status">{_e(text)}</p>'
