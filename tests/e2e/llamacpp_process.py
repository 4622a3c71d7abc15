"""Build a real llama.cpp server, give it the tiny model as GGUF, and benchmark preemption on it.

Nothing here runs in CI (the build alone takes minutes); it reproduces the llama.cpp figures of
``docs/benchmarks/preemption.md`` with one command::

    uv run --frozen python -m tests.e2e.llamacpp_process bench --out bench-results/llamacpp

Steps, each skipped when its result is already in the cache folder (``~/.cache/fairq-llamacpp``):

1. ``build``: ``pip download --no-binary :all: llama-cpp-python`` (its sdist vendors llama.cpp),
   unpack, and build ``llama-server`` with cmake (CPU, Release, ``GGML_NATIVE``).
2. ``model``: the tiny Llama of :mod:`tests.e2e.tiny_model` with random weights saved by
   ``transformers`` (the vLLM venv's python, which has torch), converted by the vendored
   ``convert_hf_to_gguf.py``. The tiny byte-level BPE is unknown to the converter's table of
   pre-tokenizers; it splits like GPT-2, so the conversion is told ``gpt-2``.
3. ``serve`` / ``bench``: ``llama-server`` on core 0 alone (``taskset -c 0``), 4 slots,
   ``--metrics``; ``bench`` then runs ``fairq bench preemption`` against it from core 1.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import httpx

from tests.e2e.tiny_model import build_tiny_model
from tests.e2e.vllm_process import find_vllm_python

__all__ = ["build_gguf", "build_server", "llama_server", "main"]

CACHE: Final = Path.home() / ".cache" / "fairq-llamacpp"
#: The sdist whose vendored llama.cpp the benchmark page was measured on.
LLAMACPP_SDIST: Final = "llama-cpp-python==0.3.36"
# Four slots, as the real vLLM runs' ``--max-num-seqs 4``: with three power users one of them
# holds two, which fair-share preemption takes one from. With two slots each holding user is
# within its share (3 power users, 2 slots), so the light user waits its turn of the next
# free slot instead (docs/design/preemption.md, "When the rule does not preempt").
SLOTS: Final = 4
# Per slot: the longest prompt plus 300 tokens of output fits in 512 (the model's trained
# length; a continuation's prompt holds the output so far, the total does not grow).
CONTEXT_PER_SLOT: Final = 512
# llama.cpp decodes the tiny model at about 0.5 ms a token: 4 requests per power user (the
# scenario's default) drain in 1.6 s, before most light requests arrive; 16 make a flood of
# about the real vLLM run's length.
PER_USER: Final = 16

_WEIGHTS: Final = """
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
config = LlamaConfig.from_pretrained(sys.argv[1])
LlamaForCausalLM(config).to(torch.float32).save_pretrained(sys.argv[1])
"""
_CONVERT: Final = """
import runpy, sys
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[1:]]
runpy.run_path("convert_hf_to_gguf.py", run_name="__main__")
"""


def _source(cache: Path) -> Path:
    """The vendored llama.cpp source of the ``llama-cpp-python`` sdist (downloaded once)."""
    found = sorted(cache.glob("llama_cpp_python-*/vendor/llama.cpp"))
    if found:
        return found[-1]
    cache.mkdir(parents=True, exist_ok=True)
    # The project's environment is made by uv and has no pip of its own: uvx fetches one.
    pip = [sys.executable, "-m", "pip"] if importlib.util.find_spec("pip") else ["uvx", "pip"]
    subprocess.run(
        [*pip, "download", "--no-binary", ":all:", "--no-deps", LLAMACPP_SDIST, "-d", str(cache)],
        check=True,
    )
    sdist = sorted(cache.glob("llama_cpp_python-*.tar.gz"))[-1]
    with tarfile.open(sdist) as tar:
        tar.extractall(cache, filter="data")
    return sorted(cache.glob("llama_cpp_python-*/vendor/llama.cpp"))[-1]


def build_server(cache: Path = CACHE) -> Path:
    """Return the ``llama-server`` binary, building it first if needed (minutes)."""
    src = _source(cache)
    binary = src / "build" / "bin" / "llama-server"
    if binary.is_file():
        return binary
    subprocess.run(
        ["cmake", "-S", str(src), "-B", str(src / "build"), "-DCMAKE_BUILD_TYPE=Release",
         "-DLLAMA_BUILD_SERVER=ON", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
         "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"],
        check=True,
    )  # fmt: skip
    subprocess.run(
        ["cmake", "--build", str(src / "build"), "--target", "llama-server", "-j2"], check=True
    )
    return binary


def build_gguf(cache: Path = CACHE) -> Path:
    """Return the tiny model as GGUF (random weights, f32), converting it first if needed."""
    out = cache / "tiny.gguf"
    if out.is_file():
        return out
    python = find_vllm_python()
    if python is None:
        raise SystemExit("no python with torch and transformers: set FAIRQ_VLLM_PYTHON")
    hf = build_tiny_model(cache / "tiny-hf")
    if not (hf / "model.safetensors").is_file():
        subprocess.run([str(python), "-c", _WEIGHTS, str(hf)], check=True)
    src = _source(cache)
    env = {**os.environ, "PYTHONPATH": f"{src / 'gguf-py'}{os.pathsep}{src}"}
    subprocess.run(
        [str(python), "-c", _CONVERT, str(hf), "--outfile", str(out), "--outtype", "f32"],
        check=True, cwd=src, env=env,
    )  # fmt: skip
    return out


@contextlib.contextmanager
def llama_server(
    port: int, cache: Path = CACHE, core: int = 0, slots: int = SLOTS
) -> Iterator[str]:
    """Run ``llama-server`` with the tiny model on ``core`` alone; yield its base URL."""
    command = [
        "taskset", "-c", str(core), str(build_server(cache)), "-m", str(build_gguf(cache)),
        "--host", "127.0.0.1", "--port", str(port), "--parallel", str(slots),
        "-c", str(CONTEXT_PER_SLOT * slots), "--metrics", "-t", "1", "--alias", "tiny",
    ]  # fmt: skip
    log = (cache / "llama-server.log").open("wb")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"llama-server exited ({proc.returncode}); see {log.name}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit(f"llama-server not healthy in 120 s; see {log.name}")
            time.sleep(0.5)  # polling a child's readiness, not standing in for an event
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def main(argv: list[str] | None = None) -> int:
    """``build``, ``model``, ``serve`` (until interrupted) or ``bench``."""
    parser = argparse.ArgumentParser(prog="llamacpp_process", description=__doc__)
    parser.add_argument("step", choices=("build", "model", "serve", "bench"))
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--slots", type=int, default=SLOTS, help="llama-server --parallel")
    parser.add_argument("--out", type=Path, default=Path("bench-results/llamacpp"))
    args = parser.parse_args(argv)
    if args.step == "build":
        print(build_server(args.cache))
    elif args.step == "model":
        print(build_gguf(args.cache))
    else:
        with llama_server(args.port, args.cache, slots=args.slots) as url:
            if args.step == "serve":
                print(url, flush=True)
                with contextlib.suppress(KeyboardInterrupt):
                    while True:
                        time.sleep(3600)
                return 0
            version = _version(args.cache)
            command = [
                sys.executable, "-m", "fairq_bench.cli", "preemption", "--backend", url,
                "--kind", "openai", "--metrics-preset", "llamacpp", "--model", "tiny",
                "--max-num-seqs", str(args.slots),
                "--per-user", str(PER_USER),
                "--cpus", "1", "--out", str(args.out),
                "--describe", f"real llama.cpp ({version}, cpu), tiny model, "
                f"{args.slots} slots, engine on core 0",
                "--reproduce", "uv run --frozen python -m tests.e2e.llamacpp_process bench",
            ]  # fmt: skip
            return subprocess.run(command, check=False).returncode
    return 0


def _version(cache: Path) -> str:
    """The sdist's name, e.g. ``llama-cpp-python 0.3.36``."""
    name = _source(cache).parents[1].name  # llama_cpp_python-0.3.36
    return name.replace("llama_cpp_python-", "llama-cpp-python ")


if __name__ == "__main__":
    sys.exit(main())
