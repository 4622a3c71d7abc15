"""Reading backend ``/metrics`` text with :mod:`prometheus_client.parser`."""

from __future__ import annotations

import math
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["sample_sums"]


def sample_sums(text: str, wanted: Iterable[str]) -> dict[str, float]:
    """Sum every sample named in ``wanted`` over all its label sets.

    Summing over labels covers a backend that reports one series per engine or per model
    alias. Names are sample names (``..._sum``, ``..._count``, gauges as they are).

    Every value fairq reads is a count, a duration or a fraction, so a NaN, an infinity or a
    negative number is a broken exporter: the scrape fails (fail closed) rather than reading
    ``max(0, nan)`` as an idle backend.

    Raises:
        ValueError: the text is not valid Prometheus exposition format, or a wanted sample is
            NaN, infinite or negative.

    """
    names = set(wanted)
    # A vLLM exposition is ~50 KB, nearly all of it series fairq never reads, and it is
    # scraped many times a second; hand the parser only the lines of the wanted samples
    # (and their family's TYPE line, which tells it how to name them).
    families = {_family(n) for n in names}
    keep = tuple(names) + tuple(f"# TYPE {f} " for f in families)
    lines = [line for line in text.splitlines() if line.startswith(keep)]
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            if sample.name in names:
                value = float(sample.value)
                if not math.isfinite(value) or value < 0:
                    raise ValueError(f"{sample.name} is {value}: not a finite number >= 0")
                sums[sample.name] = sums.get(sample.name, 0.0) + value
    return sums


def _family(sample: str) -> str:
    for suffix in ("_sum", "_count", "_bucket", "_total"):
        if sample.endswith(suffix):
            return sample[: -len(suffix)]
    return sample
