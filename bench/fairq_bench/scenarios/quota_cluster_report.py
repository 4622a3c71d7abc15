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
    points = share_series(soft.done, SOFT, soft.contended_seconds / 10, soft.contended_seconds)
    share = Panel(
        f"soft quota on {SOFT}: behind {len(IN_QUOTA)} in-quota users, one per replica",
        [Series(f"{SOFT}'s share", [x for x, _ in points], [y for _, y in points], "o")],
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
    probe_rows = [
        [p.replica, f"{p.at - shared.start:.0f}", p.status, p.retry_after or "-", p.code or "-"]
        for p in shared.probes
    ]
    in_user = IN_QUOTA[0]
    ratio = soft.alone[SOFT] / soft.alone[in_user]
    share = soft_share(soft)
    sid_done = sum(1 for _, u, _ in soft.done if u == SOFT)
    soft_ok = (share <= SHARE_BOUND and not soft.errors and sid_done == soft.sent.get(SOFT)
               and all(b > 0 for b in soft.band) and ratio >= 0.7)  # fmt: skip
    bound_ok = peaks[0]["bucketed"] <= BOUND and peaks[1]["bucketed"] >= 2 * QUOTA
    soft_rows = [
        [f"{in_user} alone (in quota)", f"{soft.alone[in_user]:.0f}", "", "", ""],
        [f"{SOFT} alone (past its soft quota)", f"{soft.alone[SOFT]:.0f}", "", "", ""],
        [f"{SOFT} behind {', '.join(IN_QUOTA)}", "", f"{share:.3f}",
         f"{soft.sent.get(SOFT, 0)} / {sid_done}", " / ".join(f"{b:.0f}" for b in soft.band)],
    ]  # fmt: skip
    soft_header = [
        "run", "tokens/s (mean of 2 rounds)", f"{SOFT}'s share",
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
        f"and asked again. HTTP door probes (non-streamed, as `{HARD}`): {len(refused)} of "
        f"{len(shared.probes)} answered 429, each with `Retry-After` "
        "and `rate_limit_exceeded`:\n\n"
        + markdown_table(["replica", "at (s)", "status", "Retry-After", "code"], probe_rows)
        + f"\n\n### Soft quota of {SOFT_TPM:,} tokens/minute on `{SOFT}` across the replicas\n\n"
        f"`{SOFT}` was put past its soft quota through replica 0 only, then sent through all "
        f"three ({SOFT_OUTSTANDING} requests on each; each in-quota user {IN_OUTSTANDING} on "
        "its own replica, the backend full).\n\n"
        + markdown_table(soft_header, soft_rows)
        + f"\n\nErrors for {SOFT}: {soft.errors or 'none'}.\n"
    )
    result = (
        f"through {REPLICAS} real replicas on one Redis, at most {peaks[0]['bucketed']:,} tokens "
        f"in any minute of the book's window ({peaks[0]['exact']:,} in any exact 60 s) against a "
        f"hard quota of {QUOTA:,} (bound {BOUND:,}), {peaks[1]['bucketed']:,} "
        f"({peaks[1]['bucketed'] / QUOTA:.1f}x) through three processes alone; refusals "
        f"RESOURCE_EXHAUSTED with a retry delay ({len(shared.refusals)}) and HTTP 429 with "
        f"Retry-After ({len(refused)}); the soft-quota user {ratio:.2f}x an in-quota user's "
        f"tokens/s alone, {share:.3f} of the tokens behind in-quota users on every replica, "
        f"{len(soft.errors)} errors"
    )
    return section, result, bound_ok and http_ok and grpc_ok and soft_ok
