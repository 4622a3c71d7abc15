"""The console's teams view: team weights, quotas and budgets in force, and forms to change them.

The forms call :class:`~fairq_server.tenancy.managed.ManagedEntitlement`, as the Admin RPCs
do (``SetTeam``, ``SetLimit``, ...), so a change made here is checked by the configuration
file's rules, recorded in the audit log (``via console``) and in force on every replica within
one poll. Entries from the configuration file are listed with their source and cannot be
deleted here (a stored entry of the same subject overrides one).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

from markupsafe import Markup

from fairq_server.config.entitlement import BudgetConfig, QuotaConfig
from fairq_server.console.templating import render
from fairq_server.errors import InvalidRequestError
from fairq_server.store.entitlement import LimitEntry, subject_of
from fairq_server.tenancy.managed import STORE, ManagedEntitlement, describe_limit

__all__ = ["ACTIONS", "EntitlementForms", "limit_from_form"]

log = logging.getLogger("fairq_server.console")

#: The changes posted to ``/console/teams/{action}``.
ACTIONS = ("team", "team-delete", "limit", "limit-delete")
_QUOTA_FIELDS = ("tokens_per_minute", "tokens_per_day", "requests_per_minute")
_BUDGET_FIELDS = ("per_day", "per_month")
_NO_NOTICE = Markup()


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


class EntitlementForms:
    """The teams view over ``managed``; the console's routes check who is asking."""

    def __init__(self, managed: ManagedEntitlement) -> None:
        self._managed = managed

    def page(
        self, csrf: str, notice: Markup = _NO_NOTICE, refill: dict[str, str] | None = None
    ) -> Markup:
        """Return the teams view's body: the forms and the entries in force.

        ``refill``: a refused form's fields, shown again in its inputs.
        """
        effective = self._managed.effective()
        teams = []
        for t in effective.teams:
            source = effective.team_source(t)
            teams.append(
                SimpleNamespace(
                    name=t.name, weight=f"{t.weight:g}", source=source, stored=source == STORE
                )
            )
        limits = []
        entries: list[LimitEntry] = [*effective.quotas, *effective.budgets]
        for entry in entries:
            kind, scope, subject, model = subject_of(entry)
            source = effective.limit_source(entry)
            limits.append(
                SimpleNamespace(
                    kind=kind,
                    scope=scope,
                    subject=subject,
                    model=model,
                    limits=describe_limit(entry),
                    source=source,
                    stored=source == STORE,
                )
            )
        return render(
            "teams.html",
            notice=notice,
            csrf=csrf,
            refill=refill or {},
            teams=teams,
            limits=limits,
            quota_fields=_QUOTA_FIELDS,
            budget_fields=_BUDGET_FIELDS,
        )

    async def change(self, action: str, form: dict[str, str], who: str) -> tuple[Markup, bool]:
        """Apply one posted change; return the notice to show and whether it was made.

        An error is said in the notice, not raised.
        """
        try:
            return await self._change(action, form, who), True
        except InvalidRequestError as exc:
            return render("notice.html", kind="error", text=str(exc)[:300]), False
        except Exception as exc:  # the database down or refusing: said on the page
            text = f"The store did not answer: {str(exc)[:300]}"
            return render("notice.html", kind="error", text=text), False

    async def _change(self, action: str, form: dict[str, str], who: str) -> Markup:
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


def _notice(text: str) -> Markup:
    return render("notice.html", kind="done", text=text)
