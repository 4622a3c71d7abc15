"""A tiny, randomly initialised Llama that real vLLM can serve without any download.

vLLM needs a model *directory* (config + tokenizer) even when it is told to invent the weights
(``--load-format dummy``). We build that directory on the spot:

- ``config.json``: a ``LlamaForCausalLM`` small enough to decode in about a millisecond per step
  on a CPU. The head dimension is 64 because vLLM's CPU attention rejects 16 ("Unsupported CPU
  attention configuration").
- ``tokenizer.json``: a byte-level BPE trained with ``tokenizers`` on a few Python standard
  library modules, so any text round-trips and no vocabulary file has to be shipped.
- ``tokenizer_config.json``: special tokens plus a ``chat_template`` so ``/v1/chat/completions``
  works.

The tokenizer is built with this project's ``tokenizers`` and loaded by the ``transformers`` in
vLLM's own venv; ``tokenizer.json`` is a stable, versioned format, so the two need not match.
"""

from __future__ import annotations

import json
import os
import shutil
import sysconfig
import tempfile
from pathlib import Path
from typing import Any, Final

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

__all__ = ["DEFAULT_MODEL_DIR", "RECIPE_VERSION", "build_tiny_model"]

#: Where the test fixtures cache the model: ``<repo>/.cache/tiny-model``.
DEFAULT_MODEL_DIR: Final = Path(__file__).resolve().parents[2] / ".cache" / "tiny-model"

#: Bump when anything below changes, so stale caches are rebuilt instead of reused.
RECIPE_VERSION: Final = 1

_STAMP: Final = "fairq-tiny-model.json"
_SPECIAL_TOKENS: Final = ["<unk>", "<s>", "</s>", "<pad>"]
_TARGET_VOCAB: Final = 2048
_MAX_LEN: Final = 512

# Fixed stdlib modules (not a glob) so the corpus, and hence the vocabulary, stays stable.
_CORPUS_FILES: Final = (
    "argparse.py",
    "dataclasses.py",
    "functools.py",
    "inspect.py",
    "pathlib.py",
    "textwrap.py",
    "typing.py",
    "asyncio/base_events.py",
    "collections/__init__.py",
    "json/decoder.py",
)

# Zephyr-style turns. Chat is only exercised for transport, so the format just has to render.
_CHAT_TEMPLATE: Final = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def build_tiny_model(dest: Path = DEFAULT_MODEL_DIR) -> Path:
    """Create the tiny model directory at ``dest`` unless an up-to-date one is already there.

    Idempotent and safe against interrupted or concurrent builds: the files are written to a
    sibling temporary directory that is renamed into place only when complete, and a stamp
    with :data:`RECIPE_VERSION` marks a finished build.

    Args:
        dest: Directory to create (its parent is created as needed).

    Returns:
        ``dest``, ready to pass to vLLM as ``--model`` / ``--tokenizer``.
    """
    if _is_current(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide the cache from other users of the repo
    try:
        _write_model(staging)
        if dest.exists():
            # An outdated or half-written cache; a finished concurrent build would have passed
            # the stamp check above, so removing it loses nothing.
            shutil.rmtree(dest, ignore_errors=True)
        try:
            os.replace(staging, dest)
        except OSError:
            # Another process won the race with an identical recipe; use its result.
            if not _is_current(dest):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest


def _is_current(dest: Path) -> bool:
    try:
        stamp = json.loads((dest / _STAMP).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(stamp, dict) and stamp.get("recipe_version") == RECIPE_VERSION


def _write_model(out: Path) -> None:
    tokenizer = _train_tokenizer()
    tokenizer.save(str(out / "tokenizer.json"))
    vocab = tokenizer.get_vocab()
    _write_json(out / "tokenizer_config.json", _tokenizer_config())
    _write_json(out / "config.json", _model_config(len(vocab), vocab["<s>"], vocab["</s>"]))
    # Written last: its presence means every other file is complete.
    _write_json(out / _STAMP, {"recipe_version": RECIPE_VERSION})


def _train_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_TARGET_VOCAB,
        special_tokens=_SPECIAL_TOKENS,
        # All 256 byte symbols, so every string is encodable and <unk> never appears.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train([str(p) for p in _corpus()], trainer)
    return tokenizer


def _corpus() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [stdlib / name for name in _CORPUS_FILES if (stdlib / name).is_file()]
    if not files:
        raise FileNotFoundError(f"no tokenizer training text found under {stdlib}")
    return files


def _tokenizer_config() -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": _MAX_LEN,
        "chat_template": _CHAT_TEMPLATE,
    }


def _model_config(vocab_size: int, bos_id: int, eos_id: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 2,  # head dim 128 / 2 = 64, the smallest the CPU backend takes
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": _MAX_LEN,
        # Equal to the tokenizer's size: a larger head could sample ids that do not decode.
        "vocab_size": vocab_size,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")
