"""The page section and plot of :mod:`.quota_cluster`: tables, checks and the figure."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from fairq_bench.report import markdown_table
from fairq_bench.scenarios import quota_cluster
from fairq_bench.scenarios.plots import Panel, Series, plot_panels
from fairq_bench.scenarios.quota_cluster import (
    HARD,
    IN_OUTSTANDING,
    IN_QUOTA,
    MAX_TOKENS,
    QUOTA,
    REPLICAS,
    SHARE_BOUND,
    SLOTS,
    SOFT,
    SOFT_OUTSTANDING,
    SOFT_TPM,
    ClusterRun,
    SoftRun,
    minute_peaks,
    soft_share,
)
from fairq_bench.scenarios.soft_quota import share_series

__all__ = ["cluster_plot", "cluster_section"]

BOUND = QUOTA + MAX_TOKENS  # the words: the quota plus one request's max_tokens


def _delays(run: ClusterRun) -> str:
    delays = [d for d in run.refusals if d is not None]
    if not delays:
        return "-"
    return f"{min(delays):.2f} / {statistics.median(delays):.2f} / {max(delays):.2f}"


def cluster_plot(runs: Sequence[ClusterRun], soft: SoftRun, path: Path) -> None:
    """Tokens in the last minute for both groups; the soft user's share behind others."""
    lines = []
    for run in runs:
        rolling = minute_peaks(run.granted, run.start, run.start + run.seconds)["rolling"]
        lines.append(Series(run.name, list(range(len(rolling))), rolling))
    tokens = Panel(
        f"hard quota on ann, {REPLICAS} replicas x {SLOTS} requests",
        lines,
        xlabel="seconds",
        ylabel="tokens granted in the last 60 whole seconds",
        hlines=((QUOTA, f"quota {QUOTA:,}"), (BOUND, "quota + max_tokens")),
    )
    series = []
    for contended in soft.contended:
        points = share_series(
            contended.traffic.done, SOFT, contended.seconds / 10, contended.seconds
        )
        label = f"{SOFT}'s share, in-quota users {contended.outstanding} each"
        series.append(Series(label, [x for x, _ in points], [y for _, y in points], "o"))
    share = Panel(
        f"soft quota on {SOFT}: behind {len(IN_QUOTA)} in-quota users, one per replica",
        series,
        xlabel="seconds",
        ylabel=f"{SOFT}'s share of tokens completed",
        hlines=((SHARE_BOUND, f"bound {SHARE_BOUND:g}"),),
    )
    plot_panels(path, [tokens, share], "Quotas through three real fairq replicas on one Redis")


def cluster_section(runs: Sequence[ClusterRun], soft: SoftRun) -> tuple[str, str, bool]:
    """Return the page's section, the result line's part, and whether it points right."""
    peaks = [minute_peaks(r.granted, r.start, r.start + r.seconds) for r in runs]
    rows = [
        [run.name, *(f"{v:,}" for v in p["minutes"]), f"{p['bucketed']:,}", f"{p['exact']:,}",
         f"{p['bucketed'] / QUOTA:.2f}x", len(run.granted), len(run.refusals), _delays(run),
         sum(run.errors.values()) or "none"]
        for run, p in zip(runs, peaks, strict=True)
    ]  # fmt: skip
    header = [
        "replicas", *(f"minute {m + 1}" for m in range(len(peaks[0]["minutes"]))),
        "most in 60 whole seconds", "most in any 60 s", "of the quota", "granted",
        "refused (gRPC)", "retry delay min / median / max (s)", "errors",
    ]  # fmt: skip
    shared = runs[0]
    codes = sorted(shared.refusal_codes)
    refused = [p for p in shared.probes if p.status == 429]
    http_ok = bool(refused) and all(
        p.retry_after is not None and p.code == "rate_limit_exceeded" for p in refused
    )
    grpc_ok = codes == ["RESOURCE_EXHAUSTED"] and all(
        d is not None and d > 0 for d in shared.refusals
    )
    delays = sorted({int(p.retry_after) for p in refused if p.retry_after is not None})
    probes = (
        f"{len(refused)} of {len(shared.probes)} answered 429 with `rate_limit_exceeded` and "
        f"`Retry-After` ({', '.join(map(str, delays))} s), the others 200"
    )
    in_user = IN_QUOTA[0]
    alone = soft.alone
    ratio = alone[SOFT] / alone[in_user]
    shares = [soft_share(run) for run in soft.contended]
    errors = sum(sum(run.traffic.errors.values()) for run in soft.contended)
    served = all(
        sum(1 for _, u, _ in run.traffic.done if u == SOFT) == run.traffic.sent.get(SOFT)
        for run in soft.contended
    )
    # The condition: in-quota users backlogged (the first run: on every replica).
    soft_ok = (shares[0] <= SHARE_BOUND and not errors and served
               and all(b > 0 for b in soft.contended[0].band) and ratio >= 0.7)  # fmt: skip
    bound_ok = peaks[0]["bucketed"] <= BOUND and peaks[1]["bucketed"] >= 2 * QUOTA
    soft_rows = [
        [f"{user} alone ({'past its soft quota' if user == SOFT else 'in quota'})",
         " / ".join(f"{v:.0f}" for v in soft.rounds[user]), f"{alone[user]:.0f}", "", "", ""]
        for user in (in_user, SOFT)
    ]  # fmt: skip
    for run, share in zip(soft.contended, shares, strict=True):
        done = sum(1 for _, u, _ in run.traffic.done if u == SOFT)
        soft_rows.append(
            [f"{SOFT} behind {', '.join(IN_QUOTA)} ({run.outstanding} each)", "", "",
             f"{share:.3f}", f"{run.traffic.sent.get(SOFT, 0)} / {done}",
             " / ".join(f"{b:.0f}" for b in run.band)]
        )  # fmt: skip
    soft_header = [
        "run", "tokens/s per round", "mean", f"{SOFT}'s share",
        f"{SOFT}'s requests sent / completed", "band dispatches, replica 0 / 1 / 2",
    ]  # fmt: skip
    section = (
        f"## Through real processes: {REPLICAS} `fairq serve` replicas on one `redis-server`\n\n"
        + (quota_cluster.__doc__ or "").split("\n\n", 1)[1]
        + f"\nHere: {REPLICAS} replicas x {SLOTS} requests per group, hard quota {QUOTA:,} "
        f"tokens/minute, max_tokens {MAX_TOKENS}, soft quota {SOFT_TPM:,} tokens/minute.\n\n"
        + markdown_table(header, rows)
        + f"\n\nBound (the issue's words): the quota plus one request's `max_tokens` = "
        f"{BOUND:,}. The book's window is the 60 whole seconds of Redis's clock ending at the "
        'grant, so "60 whole seconds" is what it promises; "any 60 s" slides over exact '
        "times and may catch two whole-second windows' edges.\n\n"
        f"gRPC refusals: {len(shared.refusals)}, status {', '.join(codes) or '-'}, every one with "
        "a `grpc-retry-pushback-ms` delay; the client waited it (plus up to 50 ms of jitter) "
        f"and asked again. HTTP door probes (non-streamed, as `{HARD}`, every 4 s): {probes}. "
        "A delay of 1 s is a replica's admission check finding the limit reached in the amounts "
        "Redis last returned to it but holding no refusal from Redis that says until when; a "
        "refusal at dispatch (Redis's) names the second the window frees.\n\n"
        + f"### Soft quota of {SOFT_TPM:,} tokens/minute on `{SOFT}` across the replicas\n\n"
        f"`{SOFT}` was put past its soft quota through replica 0 only, then sent through all "
        f"three ({SOFT_OUTSTANDING} requests on each), first alone (rounds of "
        f"{SOFT_OUTSTANDING} requests on each replica by `{in_user}` and by `{SOFT}`, in the "
        "order A B B A), then behind three in-quota users, one per replica, with "
        f"{' and then '.join(str(n) for n in IN_OUTSTANDING)} requests each. The backend "
        "holds 16 running and fairq lets 3 wait there: with 12 each, in-quota work waits in "
        "every replica's queue all the time; with 8 each it waits, but not always on every "
        "replica. The band is each replica's: a replica serves the band when none of *its* "
        "in-quota requests waits, whatever waits on the others.\n\n"
        + markdown_table(soft_header, soft_rows)
        + f"\n\nErrors for {SOFT}: {errors or 'none'}.\n"
    )
    result = (
        f"through {REPLICAS} real replicas on one Redis, at most {peaks[0]['bucketed']:,} tokens "
        f"in any minute of the book's window ({peaks[0]['exact']:,} in any exact 60 s) against a "
        f"hard quota of {QUOTA:,} (bound {BOUND:,}), {peaks[1]['bucketed']:,} "
        f"({peaks[1]['bucketed'] / QUOTA:.1f}x) through three processes alone; refusals "
        f"RESOURCE_EXHAUSTED with a retry delay ({len(shared.refusals)}) and HTTP 429 with "
        f"Retry-After ({len(refused)}); the soft-quota user {ratio:.2f}x an in-quota user's "
        f"tokens/s alone, "
        + ", ".join(
            f"{share:.3f} of the tokens behind in-quota users with {run.outstanding} each"
            for run, share in zip(soft.contended, shares, strict=True)
        )
        + f" (bound {SHARE_BOUND:g}), {errors} errors"
    )
    return section, result, bound_ok and http_ok and grpc_ok and soft_ok
