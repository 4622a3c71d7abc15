"""Which tier a request runs in: the one asked for, checked against the caller's ceiling."""

from __future__ import annotations

from collections.abc import Sequence

from fairq_server.errors import InvalidRequestError, PermissionDeniedError
from fairq_server.identity.auth import Principal

__all__ = ["resolve_tier"]


def resolve_tier(requested: str, principal: Principal, tiers: Sequence[str]) -> int:
    """Return the index of the tier the request runs in.

    Empty means the principal's ceiling (its highest allowed tier). A lower tier than the
    ceiling may always be asked for; a higher one never.

    Raises:
        InvalidRequestError: unknown tier name.
        PermissionDeniedError: the tier is above the principal's ceiling.

    """
    ceiling = min((i for i, t in enumerate(tiers) if t in principal.tiers), default=None)
    if ceiling is None:
        raise PermissionDeniedError(f"user '{principal.user}' may not use any tier")
    if not requested:
        return ceiling
    try:
        index = tiers.index(requested)
    except ValueError:
        raise InvalidRequestError(
            f"unknown tier '{requested[:64]}'; valid: {', '.join(tiers)}"
        ) from None
    if index < ceiling:
        raise PermissionDeniedError(
            f"tier '{requested}' is above the ceiling '{tiers[ceiling]}' of user '{principal.user}'"
        )
    return index
