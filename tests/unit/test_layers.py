"""The service's layers point one way: the doors do not import each other, nor what is above them.

Read from the code's own imports (with the ``ast`` module), so a new import that runs back up
fails here before a reviewer has to spot it; and checked at run time for the one dependency
that matters most: below the gRPC door nothing loads gRPC.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import fairq_server

PACKAGE = Path(fairq_server.__file__).parent

# The service's layers, top to bottom (docs/design/architecture.md draws them): a folder or
# top-level module may import only what stands in a layer below its own; side by side, units
# of one layer never import each other.
_LAYERS = (
    ("__main__.py",),
    ("cli.py",),
    ("app.py",),
    ("console",),
    ("doors",),
    ("observe", "tools"),
    ("core.py",),
    ("cluster", "port.py"),
    ("scheduling",),
    ("telemetry.py",),
    ("tenancy",),
    ("store",),
    ("identity", "backends"),
    ("config",),
    ("runtime", "logs.py"),
    ("errors.py", "names.py"),
)  # fmt: skip

# Folder (or module) -> packages of fairq_server it must never import.
_FORBIDDEN = {
    "doors/grpc": ("doors.http", "doors.extproc", "console", "app", "cli"),
    "doors/http": ("doors.grpc", "doors.extproc", "console", "app", "cli"),
    # The ext_proc door reads OpenAI bodies and answers errors as the HTTP door does.
    "doors/extproc": ("doors.grpc", "console", "app", "cli"),
    "doors": ("console", "app", "cli"),
    "observe": ("doors", "console", "app", "cli"),
    "scheduling": ("doors", "console", "store", "identity", "app", "cli"),
    "backends": ("doors", "scheduling", "cluster", "app", "cli"),
    "errors.py": ("doors", "scheduling", "cluster", "app", "cli"),
    "config": ("doors", "store", "identity", "tenancy", "console", "app", "cli"),
    "core.py": ("doors", "console", "app", "cli"),
    "port.py": ("doors", "console", "core", "app", "cli"),
}


def _imports(path: Path) -> set[str]:
    """Return the ``fairq_server`` modules a file imports (relative imports resolved)."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found.add(base)
    return {name for name in found if name.startswith("fairq_server")}


@pytest.mark.parametrize("where", sorted(_FORBIDDEN))
def test_no_arrow_runs_back_up(where: str) -> None:
    root = PACKAGE / where
    files = [root] if root.suffix == ".py" else sorted(root.rglob("*.py"))
    assert files
    wrong = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in files
        for name in sorted(_imports(path))
        for banned in _FORBIDDEN[where]
        if name == f"fairq_server.{banned.removesuffix('.py')}"
        or name.startswith(f"fairq_server.{banned}.")
    ]
    assert wrong == []


def _unit(module: str) -> str:
    """The folder or top-level module of ``fairq_server`` that ``module`` belongs to."""
    first = module.split(".")[1]
    return first if (PACKAGE / first).is_dir() else f"{first}.py"


def test_every_unit_has_a_layer() -> None:
    units = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    units |= {p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    placed = [u for layer in _LAYERS for u in layer]
    assert sorted(placed) == sorted(units), "place a new folder or module in _LAYERS"


def test_every_import_points_down_the_layers() -> None:
    layer_of = {unit: i for i, layer in enumerate(_LAYERS) for unit in layer}
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent == PACKAGE and path.name == "__init__.py":
            continue
        here = _unit(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
        for name in sorted(_imports(path)):
            if name == "fairq_server":
                continue
            there = _unit(name)
            if there != here and layer_of[there] <= layer_of[here]:
                wrong.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert wrong == []


def test_below_the_grpc_door_nothing_loads_grpc() -> None:
    """Errors, scheduling, the shared request handling and the HTTP door are transport-free."""
    code = (
        "import sys, fairq_server.errors, fairq_server.core, fairq_server.config.loader, "
        "fairq_server.doors.lifecycle, fairq_server.doors.http.server;"
        "loaded = [m for m in sys.modules if m == 'grpc' or m.startswith('grpc.')];"
        "print(sorted(loaded)[:3]); sys.exit(1 if loaded else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
