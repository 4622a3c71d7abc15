"""Writing a scenario's markdown report and the benchmarks README that summarises them all."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Report", "write_readme"]

RESULT_PREFIX = "**Result:**"
NOTES_MARKER = "<!-- notes: kept when the table above is regenerated -->"


@dataclass
class Report:
    """A scenario report: title, one-line result, then sections in order.

    The result line is what the README quotes, so it states the headline figures.
    """

    name: str
    title: str
    result: str = ""
    sections: list[tuple[str, str]] = field(default_factory=list)

    def add(self, heading: str, body: str) -> None:
        """Append a section."""
        self.sections.append((heading, body.strip()))

    def write(self, out: Path, quick: bool) -> Path:
        """Write ``<out>/<name>.md`` and return its path."""
        parts = [f"# {self.title}", ""]
        if quick:
            parts += ["*Reduced (`--quick`) run: fewer and shorter runs than the full one.*", ""]
        parts += [f"{RESULT_PREFIX} {self.result}", ""]
        for heading, body in self.sections:
            parts += [f"## {heading}", "", body, ""]
        path = out / f"{self.name}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(parts))
        return path


_INTRO = """# fairq benchmarks

Each scenario compares scheduling choices side by side in one run, on the simulated vLLM
backend (`fairq sim`) unless stated otherwise, and writes its own page with a table, plots,
what it shows and how to reproduce it. Times are *simulated* seconds: the simulator runs
faster than real time (`--speed`), and arrival times, fairq's polling interval and its
time-based limits are scaled with it. The machine is a shared 2-core box, so every figure is
compared with its baseline from the same run; ratios matter, absolute values less.

Run everything: `uv run fairq bench all --backend sim` (add `--quick` for the reduced CI
version, which checks that each result points the right way and exits 1 if one does not).
Results go to `bench-results/` (or `--out DIR`); `--write-docs` writes these pages instead.

| scenario | page | result |
|---|---|---|
"""


def _result_line(path: Path) -> str:
    text = path.read_text()
    for line in text.splitlines():
        if line.startswith(RESULT_PREFIX):
            return line[len(RESULT_PREFIX) :].strip()
    # Pages written by other code (the flood scenario): quote their table's headline rows
    # (not a table's header row, the one above its |---| line).
    lines = text.splitlines()
    rows = [
        line
        for line, below in zip(lines, [*lines[1:], ""], strict=True)
        if line.startswith("|")
        and not below.startswith("|---")
        and re.search(r"TTFT p50|makespan|throughput", line)
    ]
    cells = []
    for row in rows:
        parts = [c.strip() for c in row.strip("|").split("|")]
        if len(parts) >= 4:
            cells.append(f"{parts[0]}: {parts[1]} direct vs {parts[2]} fairq ({parts[3]})")
    return "; ".join(cells) or "see page"


def write_readme(out: Path, order: list[tuple[str, str]]) -> Path:
    """Write ``<out>/README.md`` listing each page in ``order`` that exists.

    Args:
        out: the benchmarks folder.
        order: ``(scenario title, page file name)`` pairs; missing pages are skipped, and any
            other ``*.md`` page in the folder is listed after them.

    """
    rows = []
    listed = set()
    for title, page in order:
        path = out / page
        if path.exists():
            rows.append(f"| {title} | [{page}]({page}) | {_result_line(path)} |")
            listed.add(page)
    for path in sorted(out.glob("*.md")):
        if path.name not in listed and path.name != "README.md":
            rows.append(f"| {path.stem} | [{path.name}]({path.name}) | {_result_line(path)} |")
    readme = out / "README.md"
    # Hand-written notes (findings, caveats) below the marker survive regeneration.
    notes = ""
    if readme.exists() and NOTES_MARKER in (old := readme.read_text()):
        notes = "\n" + old[old.index(NOTES_MARKER) :]
    readme.write_text(_INTRO + "\n".join(rows) + "\n" + notes)
    return readme
