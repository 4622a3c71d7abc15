"""The ``[prices]`` section: what one model's tokens cost, for the ledger and the budgets.

Example::

    [prices.llama-70b]                  # cost units per million tokens
    input_per_million = 0.5
    output_per_million = 1.5
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

from fairq_server.config.fields import Float, doc, section

__all__ = ["PriceConfig", "PriceError", "check_prices"]


class PriceError(ValueError):
    """A ``[prices]`` entry is not usable."""


@section
@dataclass(frozen=True)
class PriceConfig:
    """What one model's tokens cost, in the operator's units per million tokens."""

    input_per_million: Annotated[Float, doc("cost of a million input tokens", ge=0)] = 0.0
    output_per_million: Annotated[Float, doc("cost of a million output tokens", ge=0)] = 0.0

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        """Return the cost of ``input_tokens`` in and ``output_tokens`` out."""
        return (
            input_tokens * self.input_per_million + output_tokens * self.output_per_million
        ) / 1e6


def check_prices(prices: Mapping[str, PriceConfig], served: set[str]) -> None:
    """Refuse a negative or non-finite price, or a price for a model no backend serves.

    Raises:
        StoreError: naming the ``prices.<model>`` key.

    """
    for model, price in prices.items():
        for name in ("input_per_million", "output_per_million"):
            value = getattr(price, name)
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if not ok or not math.isfinite(value) or value < 0:
                raise PriceError(
                    f"prices.{model}.{name} must be a finite number >= 0, not {value!r}"
                )
        if model not in served:
            raise PriceError(
                f"prices.{model}: no configured backend serves model {model!r} "
                f"(served: {sorted(served)})"
            )
