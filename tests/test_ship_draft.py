"""scripts/ship_draft.py: a trained draft artifact becomes the shipped directory, cast to bf16 and pinned."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file, save_file

from trtbuild.draft.config import DraftConfig
from trtbuild.draft.loaded import check_pinned

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "ship_draft.py"


def write_artifact(out: Path) -> dict[str, torch.Tensor]:
    """The draft stage's output layout: OUT/draft/{eagle3/, manifest.json, train_log.json}."""
    eagle3 = out / "draft" / "eagle3"
    eagle3.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    tensors = {"fc.weight": torch.randn(8, 24, generator=g), "lm_head.weight": torch.randn(16, 8, generator=g),
               "d2t": torch.arange(16, dtype=torch.int64) * 3}
    save_file(tensors, str(eagle3 / "model.safetensors"))
    (eagle3 / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"],
                                                    "torch_dtype": "float32"}))
    (eagle3 / "tokenizer.json").write_text("{}")
    (out / "draft" / "train_log.json").write_text(json.dumps({"losses": [3.0, 2.0]}))
    manifest = {"recipe": {"file": "r.yaml", "name": "trained"},
                "metrics": {"acceptance_length": 1.9, "acceptance_rates": [0.5, 0.3, 0.1], "max_draft_len": 3},
                "key_components": {"config": {"samples": 4}, "libraries": {"torch": "x"}, "code": "c",
                                   "inputs": {"model": "k"}}}
    (out / "draft" / "manifest.json").write_text(json.dumps(manifest))
    return tensors


def test_the_shipped_draft_is_cast_pinned_and_loads(tmp_path: Path) -> None:
    tensors = write_artifact(tmp_path / "build")
    recipe = tmp_path / "serve.yaml"
    recipe.write_text("draft:\n  source: path\n  path: shipped\n  sha256: {}\n  max_draft_len: 3\n")
    shipped = tmp_path / "shipped"
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "build"), "--to", str(shipped),
                           "--recipe", str(recipe)], capture_output=True, text=True, check=True)
    assert "bfloat16" in done.stdout

    weights = load_file(str(shipped / "model.safetensors"))
    assert weights["d2t"].dtype == torch.int64 and torch.equal(weights["d2t"], tensors["d2t"])
    for name in ("fc.weight", "lm_head.weight"):
        assert torch.equal(weights[name], tensors[name].to(torch.bfloat16))
    assert json.loads((shipped / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert (shipped / "tokenizer.json").is_file() and (shipped / "train_log.json").is_file()
    assert "1.9 at chain 3" in (shipped / "README.md").read_text()

    config = DraftConfig(**yaml.safe_load(recipe.read_text())["draft"])
    assert config.sha256 == {name: hashlib.sha256((shipped / name).read_bytes()).hexdigest()
                             for name in ("model.safetensors", "config.json")}
    check_pinned(shipped, config.sha256)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build", "serve.yaml", "shipped"]  # no temp dirs left


def test_no_trained_draft_is_one_line_and_leaves_the_shipped_one(tmp_path: Path) -> None:
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "model.safetensors").write_bytes(b"old")
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "nothing"), "--to", str(shipped),
                           "--recipe", str(tmp_path / "r.yaml")], capture_output=True, text=True)
    assert done.returncode != 0 and "no trained draft there" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert (shipped / "model.safetensors").read_bytes() == b"old"
