"""Fetching a backend's ``/metrics`` and reading it with :mod:`prometheus_client.parser`."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import aiohttp
import yarl
from prometheus_client.parser import text_string_to_metric_families

from fairq_server.backends.http_reading import (
    ReadLimits,
    describe_failure,
    http_error,
    read_at_most,
)
from fairq_server.errors import BackendError, BackendFailure
from fairq_server.names import escape

__all__ = ["MetricsScraper", "fetch_metrics", "filtered_url", "sample_sums"]

log = logging.getLogger(__name__)

S = TypeVar("S")


class MetricsScraper:
    """Reads one backend's ``/metrics``: only the samples wanted, where the exporter can filter.

    Args:
        backend_id: names the backend in errors and logs.
        base_url: the backend's URL (no trailing slash).
        names: the sample names the adapter reads; empty: always the whole exposition.
        filtered_path: where the exporter applies ``name[]`` (vLLM's ``/metrics`` route
            renders everything; its prometheus_client app behind ``/metrics/`` filters).

    """

    def __init__(
        self, backend_id: str, base_url: str, names: Sequence[str], filtered_path: str
    ) -> None:
        self.backend_id = backend_id
        self.whole = yarl.URL(f"{base_url}/metrics")
        #: The filtered URL, until the backend proves it cannot answer it.
        self.filtered = (
            filtered_url(yarl.URL(f"{base_url}{filtered_path}"), names) if names else None
        )

    async def sample(
        self,
        session: aiohttp.ClientSession,
        parse: Callable[[str], S],
        timeout: float,
        limits: ReadLimits,
    ) -> S:
        """Fetch the metrics and return what ``parse`` reads of them.

        If the filtered answer is refused or ``parse`` finds it short while the whole
        exposition reads well (an exporter that ignores or cannot apply the filter), the
        backend is read whole from then on (logged once).

        Raises:
            BackendError: the endpoint failed, took too long, sent more than
                ``limits.metrics_bytes``, or ``parse`` raised :class:`ValueError`.

        """
        if self.filtered is not None:
            text = await self._fetch(session, self.filtered, timeout, limits)
            if isinstance(text, str):
                with contextlib.suppress(ValueError):
                    return parse(text)
            refused = text if isinstance(text, BackendError) else "an answer without them"
            whole = self._parse(await self._fetch(session, self.whole, timeout, limits), parse)
            log.warning(
                "backend %s: asked for its metrics by name, got %s; reading the whole "
                "/metrics from now on", self.backend_id, escape(str(refused), 300),
            )  # fmt: skip
            self.filtered = None
            return whole
        return self._parse(await self._fetch(session, self.whole, timeout, limits), parse)

    async def _fetch(
        self, session: aiohttp.ClientSession, url: yarl.URL, timeout: float, limits: ReadLimits
    ) -> str | BackendError:
        return await fetch_metrics(
            session,
            url,
            backend_id=self.backend_id,
            timeout=timeout,
            limit=limits.metrics_bytes,
            error_bytes=limits.error_bytes,
        )

    def _parse(self, text: str | BackendError, parse: Callable[[str], S]) -> S:
        if isinstance(text, BackendError):
            raise text
        try:
            return parse(text)
        except ValueError as exc:
            raise BackendError(
                f"backend {self.backend_id}: unreadable metrics: {escape(str(exc), 300)}",
                BackendFailure.UNAVAILABLE,
            ) from exc


def filtered_url(url: yarl.URL, names: Sequence[str]) -> yarl.URL:
    """Return ``url`` asking for only the samples ``names`` (prometheus_client's ``name[]``).

    An exporter built on prometheus_client renders only the collectors behind those names:
    vLLM's exposition is ~50 kB and costs the engine's own core 6-19 ms per scrape in full
    (docs/design/scraping.md).
    """
    return url.with_query([("name[]", n) for n in names])


async def fetch_metrics(
    session: aiohttp.ClientSession,
    url: yarl.URL,
    *,
    backend_id: str,
    timeout: float,
    limit: int,
    error_bytes: int,
) -> str | BackendError:
    """GET ``url`` within ``timeout`` seconds, headers to last byte; return its text.

    A non-200 answer is returned as its :class:`BackendError`, not raised: the caller decides
    whether it is a failure or a reason to ask differently.

    Raises:
        BackendError: the endpoint was unreachable, took too long, or sent more than
            ``limit`` bytes (``scheduler.max_metrics_bytes``).

    """
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            if resp.status != 200:
                body, complete = await read_at_most(resp, error_bytes)
                if not complete:
                    resp.close()  # the rest is never read; the connection goes with it
                return http_error(backend_id, resp.status, body)
            body, complete = await read_at_most(resp, limit)
            if not complete:
                # Do not read the rest: closing drops the connection with it.
                resp.close()
                raise BackendError(
                    f"backend {backend_id}: metrics larger than {limit} bytes "
                    "(scheduler.max_metrics_bytes)",
                    BackendFailure.UNAVAILABLE,
                )
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise BackendError(
            f"backend {backend_id}: metrics unreachable at {escape(str(url), 300)}: "
            f"{describe_failure(exc)}",
            BackendFailure.UNAVAILABLE,
        ) from exc
    return body.decode("utf-8", "replace")


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
