"""Issue 37.1: `plan` says what the GEMM plugin adds to each GPU, and with one copy it is the tile padding.

The module (plugins/trtllm_module/patch.py) releases TensorRT-LLM's [N, K] weight after it shuffled it
(tests/test_trtllm_module.py shows one fp8 tensor per patched linear on every release's stand-in); this
checks the planner's arithmetic against sizes computed here from the recipes' stand-in configs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from trtbuild.app.recipe import load_recipe
from trtbuild.core.contract import load_contract
from trtbuild.engine.plugin_memory import plugin_memory
from trtbuild.engine.plugin_module import plugin_token_ranges

ROOT = Path(__file__).resolve().parents[1]
RECIPE_8B = ROOT / "recipes" / "llama-3.1-8b-instruct-fp8-eagle3.yaml"


def _config_8b() -> dict:
    return json.loads((ROOT / "recipes" / "standins" / "llama-3.1-8b-instruct" / "config.json").read_text())


def _fp8_bytes_per_layer(cfg: dict, tp: int) -> int:
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    return ((q + 2 * kv) * h + h * q + 2 * inter * h + h * inter) // tp


def test_8b_one_copy_adds_only_tile_padding() -> None:
    recipe = load_recipe(RECIPE_8B)
    engine = recipe.engine
    cfg = _config_8b()
    weights = cfg["num_hidden_layers"] * _fp8_bytes_per_layer(cfg, engine.tensor_parallel)
    for arch in recipe.gpu_archs:
        contract = load_contract(engine.trtllm_version)
        ranges = plugin_token_ranges(engine.gemm_plugin, cfg, engine.tensor_parallel, False, contract)
        assert all(r == (1, engine.gemm_plugin.max_tokens) for r in ranges.values())
        got = plugin_memory(engine.gemm_plugin, arch, cfg, engine.tensor_parallel, ranges, contract)
        assert got.weight_bytes == weights
        assert got.linears == got.one_copy == 4 * cfg["num_hidden_layers"]
        assert got.extra_bytes <= 0.01 * weights  # near zero: Llama's dims are whole 128 x 128 tiles
        # Both copies (one_copy false, or a release whose apply may want an NCCL-window output): the whole
        # selected FP8 weight again, at least.
        kept = engine.gemm_plugin.model_copy(update={"one_copy": False})
        two = plugin_memory(kept, arch, cfg, engine.tensor_parallel, ranges, contract)
        assert two.one_copy == 0 and two.extra_bytes >= weights
        main = plugin_memory(engine.gemm_plugin, arch, cfg, engine.tensor_parallel, ranges,
                             load_contract("main-0004396"))
        assert main.one_copy == 0 and main.extra_bytes >= weights


def test_plan_prints_the_plugins_memory_per_gpu() -> None:
    proc = subprocess.run([sys.executable, "-m", "trtbuild.cli", "plan", str(RECIPE_8B)], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if "the plugin's extra memory per GPU" in line]
    assert len(lines) == len(load_recipe(RECIPE_8B).gpu_archs), proc.stdout
    for line in lines:
        assert ": 0.0 MiB beside" in line and "128 of 128 linears hold one copy" in line
