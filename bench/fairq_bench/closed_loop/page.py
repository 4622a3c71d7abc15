"""The closed-loop page: every engine's results (``closed-loop-*.json``), tables and plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fairq_bench.closed_loop.runner import DIRECT, ENGINE_QUEUE
from fairq_bench.report import markdown_table
from fairq_bench.scenarios.docs import RESULT_PREFIX

__all__ = ["write_page"]

_INTRO = """# Closed-loop callers: fair shares at any concurrency

Most callers keep a few requests in flight and send the next as soon as one ends: a chat app
one per person, an agent two to eight. fairq's shares between users, users' weights and teams'
weights used to hold only for callers that keep more requests queued than the engine holds.
Here every caller is a closed loop: it keeps its `in flight` requests outstanding (exact
output lengths, `ignore_eos`), and each figure is its share of the output tokens over the run
(after a {warmup:g} s warm-up) divided by what it is **owed**: its weighted max-min share of the
engine's slots with its concurrency as its demand, teams first, then each team's users
(`fairq_bench.closed_loop.mixes.fair_shares`). 1.00 is exactly fair; the target is at least
0.90 for every caller in every mix.

Modes, each a fresh fairq process, with `fairness = "vtc"`, tier threshold 3:

* **direct**: the engine's own FIFO queue;
* **fairq, engine queue**: fairq as a new user configures it, without `max_in_flight`: the
  engine's queue holds three requests and orders them;
* **fairq**: the backend's slots given (`max_in_flight` = the engine's `max-num-seqs`), so
  fairq decides at the slot: slots shared max-min, a slot freed by a caller below its share held
  for its next request (`scheduler.anticipation_seconds`), a slot about to free filled ahead
  of its end (`docs/design/fairness.md`);
* **fairq + preemption**: the same with `preempt_after_seconds = 0`;
* **fairq, 3 replicas**: three replicas on Redis, caller *i* sending to replica *i* mod 3.

Throughput is reported two ways (`fairq_bench.closed_loop.efficiency`): **tokens/s** against
direct's, and **engine efficiency** against direct's: the engine-seconds the tokens served
would take at the engine's own full-slot rate for requests of each length (measured in the same
run), over the seconds elapsed. A fair share moves slots from long answers to short ones, which
cost the engine a prefill and a round trip for fewer tokens: tokens/s falls with the
composition even when no slot idles, and efficiency shows what fairq itself costs.
"""


def _f(x: float) -> str:
    return f"{x:.2f}"


def _section(rec: dict[str, Any]) -> tuple[str, list[str]]:
    modes: list[str] = []
    for mix in rec["mixes"]:
        modes += [m for m in mix["runs"] if m != DIRECT and m not in modes]
    lines = [f"## {rec['describe']}", ""]
    quick = " (reduced `--quick` run)" if rec["quick"] else ""
    lines.append(
        f"{rec['slots']} slots, {rec['seconds']:g} s per run{quick}, "
        f"{rec['minutes']:.0f} min in all. Engine rates with every slot busy (tokens/s by "
        "output length): "
        + ", ".join(f"{k}: {v:.0f}" for k, v in rec["rates"].items())
        + f". Reproduce: `{rec['reproduce']}`."
    )
    lines.append("")
    header = ("mix", "caller (in flight)", "owed", "direct", *modes)
    rows = []
    verdicts = []
    for mix in rec["mixes"]:
        first = True
        for name, owed in mix["fair"].items():
            row = [mix["key"] if first else "", f"{name} ({mix['callers'][name]})", _f(owed)]
            row.append(_f(mix["runs"][DIRECT]["ratio"][name]))
            row += [_f(mix["runs"][m]["ratio"][name]) if m in mix["runs"] else "" for m in modes]
            rows.append(tuple(row))
            first = False
        d = mix["runs"][DIRECT]
        runs = mix["runs"]
        tput = [
            f"{runs[m]['tokens_per_second'] / d['tokens_per_second']:.3f}" if m in runs else ""
            for m in modes
        ]
        eff = [f"{runs[m]['efficiency'] / d['efficiency']:.3f}" if m in runs else "" for m in modes]
        rows.append(("", "*tokens/s vs direct*", "", "1", *tput))
        rows.append(("", "*efficiency vs direct*", "", "1", *eff))
        for m in modes:
            if m == ENGINE_QUEUE or m not in runs:
                continue
            worst = min(mix["runs"][m]["ratio"].values())
            verdicts.append((worst, mix["runs"][m]["efficiency"] / d["efficiency"], m, mix["key"]))
    lines.append(
        "Each caller's share of the tokens over its owed share (1.00 = fair), and the run's "
        "throughput against direct:"
    )
    lines.append("")
    lines.append(markdown_table(header, rows))
    lines.append("")
    lines.append(f"![share of each caller over time]({_plot_name(rec)})")
    lines.append("")
    join = "; ".join(
        f"{'on Redis, ' if j['cluster'] else ''}{j['replicas']} replica(s): A "
        f"{j['share']:.2f} (quarters {', '.join(_f(q) for q in j['quarters'])})"
        for j in rec["join"]
    )
    lines.append(
        "**Join** (A alone with 12 in flight, then B joins with 12; A's share of the tokens in "
        f"the time after B joined, owed 0.50): {join}."
    )
    if rec.get("later"):
        later = rec["later"]
        lines.append(
            f" {later['seconds']:.0f} s later, fresh replicas on the same Redis, A and B from the "
            f"start: A {later['share']:.2f}."
        )
    lines.append("")
    worst_share = min(v[0] for v in verdicts)
    worst_eff = min(v[1] for v in verdicts)
    direct = min(min(m["runs"][DIRECT]["ratio"].values()) for m in rec["mixes"])
    summary = (
        f"{rec['describe']}: least share/owed of any caller in any mix through fairq "
        f"{worst_share:.2f} (direct {direct:.2f}), "
        f"engine efficiency at least {worst_eff:.3f}x direct's, "
        f"join: A {min(j['share'] for j in rec['join']):.2f} of the tokens after B joined"
    )
    return "\n".join(lines), [summary]


def _plot_name(rec: dict[str, Any]) -> str:
    return f"closed-loop-{rec['label']}.png"


def _plot(rec: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in ("chat", "short-long-4", "teams-2", "weights-4") if any(
        m["key"] == k for m in rec["mixes"])]  # fmt: skip
    mixes = {m["key"]: m for m in rec["mixes"]}
    modes = [m for m in (DIRECT, "fairq") if m in rec["mixes"][0]["runs"]]
    fig, axes = plt.subplots(len(modes), len(keys), figsize=(4 * len(keys), 3.2 * len(modes)),
                             squeeze=False)  # fmt: skip
    for r, mode in enumerate(modes):
        for c, key in enumerate(keys):
            ax = axes[r][c]
            mix = mixes[key]
            series = mix["runs"][mode]["series"]
            for name, values in series.items():
                times = [rec["warmup"] + 2.0 * (i + 0.5) for i in range(len(values))]
                line = ax.plot(times, values, label=name)[0]
                ax.axhline(mix["fair"][name], color=line.get_color(), linestyle="--",
                           linewidth=0.8)  # fmt: skip
            ax.set_title(f"{key}: {mode}", fontsize=9)
            ax.set_ylim(0, 1)
            ax.grid(True, alpha=0.3)
            if c == 0:
                ax.set_ylabel("share of tokens (2 s windows)")
            if r == len(modes) - 1:
                ax.set_xlabel("seconds")
            ax.legend(fontsize=7)
    fig.suptitle(f"{rec['describe']}: each caller's share over time (dashed: owed)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_page(out: Path) -> Path:
    """Rebuild ``closed-loop.md`` (and each engine's plot) from the results in ``out``."""
    records = [json.loads(p.read_text()) for p in sorted(out.glob("closed-loop-*.json"))]
    sections, summaries = [], []
    for rec in records:
        _plot(rec, out / _plot_name(rec))
        text, summary = _section(rec)
        sections.append(text)
        summaries += summary
    page = _INTRO.format(warmup=records[0]["warmup"] if records else 3.0)
    page += "\n" + f"{RESULT_PREFIX} " + "; ".join(summaries) + ".\n\n" + "\n\n".join(sections)
    page += "\n"
    path = out / "closed-loop.md"
    path.write_text(page)
    return path
