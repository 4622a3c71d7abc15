"""Print a Dockerfile stage's ENTRYPOINT + CMD, HEALTHCHECK command and USER, as JSON.

Usage: ``python dockerfile_commands.py Dockerfile STAGE``. Follows ``FROM <stage>``
inheritance as Docker does (a stage's own CMD, HEALTHCHECK and USER win; ENTRYPOINT is
inherited), so CI runs exactly the commands the image would, outside a container.
"""

from __future__ import annotations

import json
import re
import sys


def parse(text: str) -> dict[str, dict[str, object]]:
    """Map stage name to its base (``from``) and its exec-form instructions."""
    text = re.sub(r"\\\n\s*", " ", text)
    stages: dict[str, dict[str, object]] = {}
    current: dict[str, object] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            match = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.IGNORECASE)
            assert match, line
            current = {"from": match.group(1)}
            stages[match.group(2) or f"#{len(stages)}"] = current
        elif current is not None and word in ("ENTRYPOINT", "CMD", "USER"):
            current[word] = json.loads(rest) if word != "USER" else rest.strip()
        elif current is not None and word == "HEALTHCHECK":
            command = rest[rest.index("CMD") + 3 :].strip()
            current[word] = json.loads(command)
    return stages


def resolve(stages: dict[str, dict[str, object]], name: str) -> dict[str, object]:
    """Walk the stage chain: the nearest definition of each instruction wins."""
    found: dict[str, object] = {}
    while name in stages:
        stage = stages[name]
        for key in ("ENTRYPOINT", "CMD", "HEALTHCHECK", "USER"):
            if key in stage and key not in found:
                found[key] = stage[key]
        name = str(stage["from"])
    return found


def main() -> None:
    """Print the resolved commands of the stage named on the command line."""
    path, stage = sys.argv[1], sys.argv[2]
    with open(path) as f:
        found = resolve(parse(f.read()), stage)
    entry = list(found.get("ENTRYPOINT", [])) + list(found.get("CMD", []))  # type: ignore[call-overload]
    print(json.dumps({"command": entry, "healthcheck": found.get("HEALTHCHECK"),
                      "user": found.get("USER")}))  # fmt: skip


if __name__ == "__main__":
    main()
