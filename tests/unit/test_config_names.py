"""The configuration names the backend kinds and the scheduling plugins without importing
them (it is the bottom layer): its closed sets must be exactly what the code registers."""

from __future__ import annotations

import ast
from pathlib import Path

import fairq_server
from fairq_server.backends.kinds import BACKEND_KINDS
from fairq_server.config.backends import BACKEND_KIND_NAMES
from fairq_server.config.scheduler import FAIRNESS_NAMES, GATE_NAMES, ORDERING_NAMES, ROUTING_NAMES
from fairq_server.scheduling.registry import FAIRNESS_POLICIES, GATES, ORDERING_POLICIES, ROUTERS

CONFIG = Path(fairq_server.__file__).parent / "config"


def test_the_backend_kinds_are_the_adapters_kinds() -> None:
    assert list(BACKEND_KIND_NAMES) == list(BACKEND_KINDS)


def test_the_plugin_names_are_the_registrys() -> None:
    assert set(FAIRNESS_NAMES) == set(FAIRNESS_POLICIES)
    assert set(ORDERING_NAMES) == set(ORDERING_POLICIES)
    assert set(GATE_NAMES) == set(GATES)
    assert set(ROUTING_NAMES) == set(ROUTERS)


def test_config_imports_only_errors_and_names_of_fairq() -> None:
    allowed = {"fairq_server.errors", "fairq_server.names"}
    wrong = []
    for path in sorted(CONFIG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            wrong += [
                f"{path.name} imports {n}"
                for n in names
                if n.startswith("fairq_server")
                and n not in allowed
                and not n.startswith("fairq_server.config")
            ]
    assert wrong == []
