"""What the quotas and budgets read of the configuration (the file's, or with the store's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from fairq_server.config.entitlement import BudgetConfig, QuotaConfig
from fairq_server.config.prices import PriceConfig

__all__ = ["LimitSettings"]


class LimitSettings(Protocol):
    """What the entitlement reads of the configuration."""

    @property
    def quotas(self) -> Sequence[QuotaConfig]:
        """Token and request limits per team and user."""

    @property
    def budgets(self) -> Sequence[BudgetConfig]:
        """Cost limits per team and user."""

    @property
    def prices(self) -> Mapping[str, PriceConfig]:
        """Per-model token prices (the budgets' units)."""
