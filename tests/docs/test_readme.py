"""README.md: every Python snippet is a script that runs as pasted into a file, against the
README's own setup (model ``sim``, gRPC on 50051, the HTTP door on 8080, a key)."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fairq_server.config.schema import HttpConfig
from fairq_sim import SimServer

from ..conftest import KEYS, FairqFactory, make_config, sim_backend

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
HTTP_API = ROOT / "docs" / "http-api.md"
DOC_SNIPPETS = re.findall(r"```python\n(.*?)```", HTTP_API.read_text(), re.DOTALL)


def test_the_readme_has_its_python_snippets() -> None:
    assert len(SNIPPETS) >= 2
    assert any("fairq.AsyncClient" in s for s in SNIPPETS)
    assert any("OpenAI(" in s for s in SNIPPETS)


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_each_snippet_compiles_as_a_file(index: int) -> None:
    """A snippet pasted into a file must at least compile (no `async with` at top level)."""
    compile(SNIPPETS[index], f"README.md python block {index}", "exec")


@pytest.mark.parametrize("index", range(len(DOC_SNIPPETS)))
def test_the_http_api_page_snippets_compile_and_use_the_readme_model(index: int) -> None:
    compile(DOC_SNIPPETS[index], f"docs/http-api.md python block {index}", "exec")
    assert re.findall(r'model="([^"]+)"', DOC_SNIPPETS[index]) == ["sim"]


EXAMPLE_PAGES = [
    README,
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted(ROOT.glob("clients/*/README.md")),
]
# A model a request example names: JSON ("model": "sim"), a Python keyword (model="sim"), a
# JavaScript property (model: 'sim'), a command's flag (--model sim). Configuration examples
# (TOML's `model = "..."` in a quota) may name any model.
MODEL_NAMED = re.compile(
    r"""(?:"model":\s*"|\bmodel=["']|\bmodel:\s*')([^"']+)|--model[ =]([^\s`]+)"""
)


@pytest.mark.parametrize("page", EXAMPLE_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_names_the_readme_model(page: Path) -> None:
    """Examples pasted after the README's setup must find its model (were tiny and m)."""
    named = {a or b for a, b in MODEL_NAMED.findall(page.read_text())}
    assert named <= {"sim"}, named


async def test_each_snippet_runs_against_fairq_and_the_simulator(
    sim: SimServer, fairq_factory: FairqFactory, tmp_path: Path
) -> None:
    config = make_config([sim_backend(sim)], keys=list(KEYS.values()))
    server = await fairq_factory(replace(config, http=HttpConfig(listen="127.0.0.1:0")))
    for index, snippet in enumerate(SNIPPETS):
        script = (
            snippet.replace("127.0.0.1:50051", f"127.0.0.1:{server.port}")
            .replace("127.0.0.1:8080", f"127.0.0.1:{server.http_port}")
            .replace('"fq_..."', '"bob-key"')
            .replace('"YOUR-FAIRQ-KEY"', '"bob-key"')
        )
        path = tmp_path / f"snippet{index}.py"
        path.write_text(script)
        pipe = asyncio.subprocess.PIPE
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(path), stdout=pipe, stderr=pipe,
            env={**os.environ, "FAIRQ_API_KEY": "bob-key"},
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, (index, err.decode())
        assert out.strip(), (index, "printed nothing")
    # Without the key the README's client ends in one line naming the refusal.
    hello = ROOT / "examples" / "hello.py"
    script = tmp_path / "hello.py"
    script.write_text(hello.read_text().replace("127.0.0.1:50051", f"127.0.0.1:{server.port}"))
    env = {k: v for k, v in os.environ.items() if k != "FAIRQ_API_KEY"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), stdout=pipe, stderr=pipe, env=env
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1
    [line] = err.decode().splitlines()
    assert line.startswith("hello.py: UNAUTHENTICATED: ")


def test_the_readme_client_is_examples_hello_py_and_says_how_to_run_it() -> None:
    """`python hello.py` needs the client package: the README runs the checkout's copy."""
    [snippet] = [s for s in SNIPPETS if "fairq.AsyncClient" in s]
    hello = (ROOT / "examples" / "hello.py").read_text()
    assert hello.endswith(snippet)
    text = README.read_text()
    assert "uv run python examples/hello.py" in text
    assert "python hello.py" not in text


def test_no_page_tells_to_pip_install_a_package_that_is_not_published() -> None:
    """fairq, fairq-client, fairq-sim and fairq-bench are not on PyPI: install from a folder."""
    pages = [README, *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("*/README.md")),
             *sorted(ROOT.glob("clients/*/README.md"))]  # fmt: skip
    named = re.compile(r"pip install (?:'|\")?(fairq(?:-client|-sim|-bench)?)\b(?![-./])")
    for page in pages:
        for line in page.read_text().splitlines():
            found = named.search(line)
            if found and "on PyPI" not in line:
                raise AssertionError(f"{page.relative_to(ROOT)}: {line.strip()}")
