"""The console's rendering: the templates against the f-string code they replaced.

``uv run python -m fairq_bench.console_render --old 2f41ea8`` checks the live views' markup
and timings:

1. **Equivalence**: the old modules (``render``, ``cells``, ``trends``, ``plot`` at revision
   ``--old``, read with ``git show`` into a scratch package) and the current ones render the
   same views (names holding markup, quotes, ampersands and a U+202E override; one replica
   and two; limits, teams, preemptions, draining backends; trends; a usage plot): the
   outputs must be equal byte for byte.
2. **Cost**: the queue page (its fragment and the page around it) with ``--users`` user rows,
   rendered ``--rounds`` times by each, old and new alternating; medians and quartiles.

The templates are compiled before timing (the console does so at start).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from fairq_server.console import render as new_render
from fairq_server.console import templating
from fairq_server.console import trends as new_trends
from fairq_server.console.plot import usage_plot as new_plot
from fairq_server.observe.history import Trend
from fairq_server.observe.live import BackendRow, LiveView, ModelRow, UserRow
from fairq_server.store.series import Series
from fairq_server.tenancy.standing import LimitRow, TeamRow

_MODULES = ("text", "cells", "render", "trends", "plot")
_HOSTILE = ("<script>alert(1)</script>", "a\"b'c&d", "admin\u202egnp.", "x>y</td>")


def old_console(rev: str, into: Path) -> dict[str, ModuleType]:
    """Return the console's rendering modules as they were at ``rev`` (a scratch package)."""
    root = subprocess.run(
        ["git", "rev-parse", "--show-toplevel"], check=True, capture_output=True, text=True
    ).stdout.strip()
    package = into / "fairq_console_old"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in _MODULES:
        source = subprocess.run(
            ["git", "show", f"{rev}:server/fairq_server/console/{name}.py"],
            check=True,
            capture_output=True,
            text=True,
            cwd=root,
        ).stdout
        text = source.replace("fairq_server.console.", "fairq_console_old.")
        (package / f"{name}.py").write_text(text)
    sys.path.insert(0, str(into))
    return {name: importlib.import_module(f"fairq_console_old.{name}") for name in _MODULES}


def _limits(i: int, name: str) -> list[LimitRow]:
    if i % 3:
        return []
    hard = LimitRow("team", "ops", "tokens_per_day", "", "hard", 12.0, 10.0, "over", 1.8e9)
    soft = LimitRow("user", name, "tokens_per_minute", "m<1>", "soft", 4.5, 5.0, "warn")
    return [hard, soft] if i % 2 else [soft]


def queue_view(users: int, replica: str = "", hostile: bool = True) -> dict[str, Any]:
    """Return a live view (JSON-shaped) with ``users`` user rows over two models."""
    names = _HOSTILE if hostile else ()
    rows: list[UserRow] = []
    for i in range(users):
        name = names[i % len(names)] + str(i) if names and i % 7 == 0 else f"user-{i}"
        rows.append(
            UserRow(
                tier="batch" if i % 2 else "chat",
                user=name,
                team=("ops" if i % 5 else names[0] if names else "") if i % 4 else "",
                queued=i % 4,
                position=i if i % 4 else -1,
                waiting_seconds=i * 0.37,
                weight=1.0,
                share=(i % 10) / 10,
                entitled=0.25,
                status="over" if i % 6 == 0 else "starved" if i % 6 == 1 else "",
                preempted=2 if i % 9 == 0 else 0,
                team_weight=2.5,
                limits=_limits(i, name),
                running=i % 3,
                state="waiting" if i % 4 else "running",
            )
        )
    half = users // 2
    models = [
        ModelRow("m<1>", [("chat", half), ("batch", 3)], half, rows[:half], 4, 2),
        ModelRow("sim", [("batch", users - half)], users - half, rows[half:], 1, 1),
        ModelRow("empty", [], 0, []),
    ]
    backends = [
        BackendRow(
            "b1", ["m<1>", "sim"], "up", 3.0, 1.0, 0.42, 7, 0, 0.021,
            [("chat", "open", 0.05), ("batch", "shut", None)], False, "",
            [("kv_cache", 2), ("priority", 1)], 130, [(_HOSTILE[0], 1)],
        ),
        BackendRow(
            _HOSTILE[1], ["sim"], "down", None, None, None, 0, 0, None, [], True,
            _HOSTILE[3],
        ),
    ]  # fmt: skip
    over = LimitRow("team", "ops", "tokens_per_day", "", "hard", 12, 10, "over")
    odd = LimitRow("team", _HOSTILE[2], "cost", "sim", "soft", 0.5, 3, "")
    teams = [TeamRow("ops", 2.5, [over]), TeamRow(_HOSTILE[2], 1.0, [odd])]
    return LiveView(replica, time.time(), ["chat", "batch"], models, backends, 7, teams).to_json()


def _trends() -> tuple[list[Trend], list[float]]:
    values: list[float | None] = [1.0, None, 3.5, 2.0, None, None, 0.004, 7.0]
    trends = [
        Trend("model sim", "queued", "requests", values),
        Trend("tier chat", "queue wait", "s", [0.2, 1.5, None, 3.0, 0.01, None, 0.5, 4.0]),
        Trend("all", "tokens/s", "tokens/s", [float(i * 40) for i in range(8)]),
        Trend(f"team {_HOSTILE[0]}", "tokens/s", "tokens/s", [None] * 7 + [5.0]),
        Trend(f"user {_HOSTILE[2]}", "queued", "requests", [None, 1.0, None, 2.0] * 2),
    ]
    return trends, [1.8e9 + 5 * i for i in range(8)]


def _series() -> Series:
    starts = [1_800_000_000 + 3600 * i for i in range(24)]
    values: dict[str, dict[str | None, list[float]]] = {}
    for measure in ("output_tokens", "cost"):
        values[measure] = {
            None: [float(i % 3) for i in range(24)],
            **{
                f"{_HOSTILE[k % 4]}{k}": [float((i * k) % 7) * 1.5 for i in range(24)]
                for k in range(11)
            },
        }
    return Series(3600, starts, values)


def equivalence(old: dict[str, ModuleType]) -> list[str]:
    """Return the renderings that differ between the old code and the templates."""
    one = [queue_view(60)]
    two = [queue_view(40, "r1"), queue_view(30, "r2")]
    none: list[dict[str, Any]] = [{"replica": "", "models": "bad", "backends": [1, {}]}]
    trends, times = _trends()
    Case = Callable[[ModuleType, ModuleType, Callable[..., Any]], str]
    cases: list[tuple[str, Case]] = []

    def fragment(view: str, views: list[dict[str, Any]], here: str) -> Case:
        return lambda r, t, p: str(r.fragment(view, views, here))

    for view in ("queues", "backends", "cluster"):
        for label, views, here in (("one", one, ""), ("two", two, "r1"), ("junk", none, "x")):
            cases.append((f"fragment {view} {label}", fragment(view, views, here)))
    cases += [
        ("fragment queues empty", lambda r, t, p: r.fragment("queues", [], "")),
        ("fragment backends empty", lambda r, t, p: r.fragment("backends", [], "")),
        (
            "page queues",
            lambda r, t, p: r.page("queues", _HOSTILE[1], "c&s", r.fragment("queues", one, "")),
        ),
        ("page keys (store)", lambda r, t, p: r.page("keys", _HOSTILE[2], "t", "", True)),
        ("page trends", lambda r, t, p: r.page("trends", "admin", "t", "", True)),
        ("login", lambda r, t, p: r.login_page()),
        ("login refused", lambda r, t, p: r.login_page(f"Not logged in: {_HOSTILE[1]}")),
        ("message", lambda r, t, p: r.message_page(_HOSTILE[0], _HOSTILE[2])),
        ("trends", lambda r, t, p: t.trends_fragment(trends, times, _HOSTILE[0])),
        ("trends collecting", lambda r, t, p: t.trends_fragment([], times[:1])),
        ("plot tokens", lambda r, t, p: p(_series(), "output_tokens", "team")),
        ("plot cost", lambda r, t, p: p(_series(), "cost", _HOSTILE[0])),
        ("plot empty", lambda r, t, p: p(Series(3600, [1], {}), "requests", "team")),
    ]
    differ = []
    for label, case in cases:
        before = case(old["render"], old["trends"], old["plot"].usage_plot)
        after = case(new_render, new_trends, new_plot)
        if str(before) != str(after):
            at = next(
                (i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b),
                min(len(before), len(after)),
            )
            differ.append(
                f"{label}: at {at}: {before[at - 60 : at + 60]!r} != {after[at - 60 : at + 60]!r}"
            )
    return differ


def _queue_page(module: ModuleType, views: list[dict[str, Any]]) -> str:
    live = module.fragment("queues", views, "")
    return str(module.page("queues", "admin", "token", live))


def timing(old: dict[str, ModuleType], users: int, rounds: int) -> dict[str, list[float]]:
    """Return the seconds each rendering of the queue page with ``users`` rows took."""
    views = [queue_view(users, hostile=False)]
    times: dict[str, list[float]] = {"f-strings": [], "templates": []}
    both = (("f-strings", old["render"]), ("templates", new_render))
    for i in range(rounds):
        for label, module in both if i % 2 else both[::-1]:
            start = time.perf_counter()
            _queue_page(module, views)
            times[label].append(time.perf_counter() - start)
    return times


def main() -> None:
    """Check the equivalence, then time the queue page (see the module's docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--old", required=True, help="the revision of the f-string console")
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    start = time.perf_counter()
    count = templating.load()
    print(f"{count} templates compiled in {(time.perf_counter() - start) * 1000:.1f} ms")
    with tempfile.TemporaryDirectory() as scratch:
        old = old_console(args.old, Path(scratch))
        differ = equivalence(old)
        for line in differ:
            print("DIFFERS", line)
        print(f"equivalence: {'every rendering equal' if not differ else f'{len(differ)} differ'}")
        views = [queue_view(args.users, hostile=False)]
        sizes = {len(_queue_page(m, views)) for m in (old["render"], new_render)}
        print(f"queue page with {args.users} users: {sorted(sizes)} characters")
        for label, seconds in timing(old, args.users, args.rounds).items():
            q = statistics.quantiles(seconds, n=4)
            print(
                f"{label:>10}: median {statistics.median(seconds) * 1000:.1f} ms "
                f"(quartiles {q[0] * 1000:.1f}-{q[2] * 1000:.1f} ms, {len(seconds)} renderings)"
            )
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
