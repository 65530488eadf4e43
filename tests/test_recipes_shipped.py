"""Every shipped recipe validates and plans here, where the GPU recipes' weights are absent.

The GPU recipes check out on their stand-in configs (the real models' published shapes): the
preflight reads those shapes, `plan` says the weights are absent and what would run on a GPU host,
and `build` refuses with one line. Each test runs the CLI in-process against an empty HF cache
and an empty artifact cache under tmp_path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtbuild.cli import main

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"
# Shared bases name no model; they are checked through the recipes that extend them.
SHIPPED = sorted(p for p in RECIPES_DIR.glob("*.yaml") if not p.name.startswith("base-"))
GPU_RECIPES = [p for p in SHIPPED if "standin_config" in p.read_text()]


@pytest.fixture(autouse=True)
def _empty_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-hub"))
    monkeypatch.delenv("HF_HOME", raising=False)


def _plan(recipe: Path, capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    capsys.readouterr()
    main(["plan", str(recipe), "--json", *args])
    return json.loads(capsys.readouterr().out)


def _refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def _standin(recipe: Path) -> dict:
    from trtbuild.app.recipe import load_recipe

    loaded = load_recipe(recipe)
    return json.loads(loaded.resolve_path(loaded.model.standin_config).read_text())


def test_shipped_recipes_include_the_gpu_recipes():
    names = {p.name for p in GPU_RECIPES}
    assert {"llama-3.1-8b-instruct-fp8-eagle3.yaml", "llama-4-maverick-fp8-eagle3-tp8.yaml"} <= names
    for recipe in GPU_RECIPES:
        assert "extends: base-fp8-eagle3.yaml" in recipe.read_text()


@pytest.mark.parametrize("recipe", SHIPPED, ids=lambda p: p.stem)
def test_recipe_validates_and_plans(recipe: Path, capsys: pytest.CaptureFixture[str]):
    main(["validate", str(recipe)])
    assert ": ok (" in capsys.readouterr().out
    data = _plan(recipe, capsys)
    statuses = {s["name"]: s["status"] for s in data["stages"]}
    assert statuses["model"] == "will-run"  # nothing is cached in an empty cache
    assert set(statuses.values()) <= {"will-run", "skipped"}


@pytest.mark.parametrize("recipe", GPU_RECIPES, ids=lambda p: p.stem)
def test_gpu_plan_says_weights_are_absent_and_what_runs_on_a_gpu_host(recipe: Path,
                                                                     capsys: pytest.CaptureFixture[str]):
    from trtbuild.app.recipe import load_recipe

    loaded = load_recipe(recipe)
    data = _plan(recipe, capsys)
    notes = data["notes"]
    assert notes[0].startswith("weights absent:") and loaded.model.repo_id in notes[0]
    assert "stand-in" in notes[0] and "`trtbuild build` refuses here" in notes[0]
    text = "\n".join(notes)
    engine = loaded.engine
    assert f"world size {engine.tensor_parallel * engine.pipeline_parallel}:" in text
    assert f"hf download {loaded.model.repo_id}" in text
    if loaded.draft.source == "hub":
        assert f"hf download {loaded.draft.repo_id}" in text
    # Every stage the plan would run after the model has its GPU-host line; a skipped one says so.
    for stage in data["stages"][1:]:
        line = next(n for n in notes if n.strip().startswith(f"{stage['name']}:"))
        if stage["status"] == "skipped":
            assert "not in the recipe" in line
    # The human-readable plan prints the same notes under the table.
    main(["plan", str(recipe)])
    assert notes[0][:60] in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("recipe", GPU_RECIPES, ids=lambda p: p.stem)
def test_gpu_build_refuses_without_the_weights(recipe: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]):
    err = _refused(["build", str(recipe), "--json"], capsys)
    assert "not in the local HF cache" in err and "model.repo_id" in err
    from trtbuild.core.cache import ArtifactCache

    store = ArtifactCache(tmp_path / "cache")
    assert list(store.entries()) == [] and list(store.incomplete()) == []


def test_standin_heads_reach_the_engine_preflight(capsys: pytest.CaptureFixture[str]):
    recipe = RECIPES_DIR / "llama-3.1-8b-instruct-fp8-eagle3.yaml"
    heads = _standin(recipe)["num_attention_heads"]
    tp = next(n for n in range(2, heads) if heads % n)
    err = _refused(["validate", str(recipe), "--set", f"engine.tensor_parallel={tp}",
                    "--set", f"engine.launcher.gpus_per_node={tp}"], capsys)
    assert f"engine.tensor_parallel: {tp} does not divide the target's num_attention_heads {heads}" in err
    assert "stand-in" in err


def test_standin_experts_reach_the_engine_preflight(capsys: pytest.CaptureFixture[str]):
    recipe = RECIPES_DIR / "llama-4-maverick-fp8-eagle3-tp8.yaml"
    experts = _standin(recipe)["text_config"]["num_local_experts"]
    tp = 8
    ep = next(n for n in range(2, tp + 1) if tp % n == 0 and experts % n == 0)  # a valid split ...
    main(["validate", str(recipe), "--set", f"engine.expert_parallel={ep}"])
    bad = next(n for n in range(3, experts) if experts % n)  # ... and one the experts cannot take
    err = _refused(["validate", str(recipe), "--set", f"engine.expert_parallel={bad}"], capsys)
    assert f"engine.expert_parallel: {bad} does not divide the target's {experts} experts" in err


def test_plan_says_calibration_memory_and_gpus(capsys: pytest.CaptureFixture[str]):
    # Maverick with an in-build quantize section: ~800 GB of BF16 weights exceed one node of GPUs.
    import math

    from trtbuild.app.gpu_plan import CALIBRATION_GPU_SHARE, ONE_GPU_GB, calibration_gpus

    recipe = RECIPES_DIR / "llama-4-maverick-fp8-eagle3-tp8.yaml"
    notes = _plan(recipe, capsys, "--set", "quantize.format=fp8")["notes"]
    warning = next(n for n in notes if "exceed one node" in n)
    assert "multinode_ptq.py" not in warning and "quantize.calibration" in warning
    # the calibration ranks' weights: shards + two whole all-gathered layers + embeddings/head, from the
    # stand-in's per-layer parameter counts (Maverick's MoE layers are the largest)
    from trtbuild.app.gpu_plan import parameter_layout
    from trtbuild.model.source import text_config

    standin = _standin(recipe)
    outside, layers = parameter_layout(standin)
    assert len(layers) == text_config(standin)["num_hidden_layers"]
    two_nodes = _plan(recipe, capsys, "--set", "quantize.format=fp8", "--set", "quantize.calibration.processes=8",
                      "--set", "quantize.calibration.nodes=2")["notes"]
    launch = next(n for n in two_nodes if "quantize launch:" in n)
    per_rank = 2.0 * (sum(layers) / 16 + 2 * max(layers) + outside)
    assert "2 node(s) x 8 process(es)" in launch and f"~{per_rank / 1e9:.1f} GB" in launch
    assert ("!! over" in launch) == (per_rank > CALIBRATION_GPU_SHARE * ONE_GPU_GB * 1e9)
    assert "srun under Slurm" in next(n for n in two_nodes if "quantize: ModelOpt" in n)
    small = _plan(RECIPES_DIR / "llama-3.1-8b-instruct-fp8-eagle3.yaml", capsys)["notes"]
    assert not any("exceed one" in n for n in small)
    memory = next(n for n in small if "quantize memory:" in n)
    assert "-> 1 x 80 GB GPU(s)" in memory and "on cuda:0" in next(n for n in small if "quantize: ModelOpt" in n)
    assert "1 node(s) x 1 process(es)" in next(n for n in small if "quantize launch:" in n)
    # 70 B parameters: 140 GB of BF16 over GPUs holding 80% of 80 GB each
    assert calibration_gpus(70 * 10**9) == math.ceil(140e9 / (CALIBRATION_GPU_SHARE * ONE_GPU_GB * 1e9)) == 3


def test_tiny_recipe_plan_notes_only_the_gemm_plugin_and_dynamo(capsys: pytest.CaptureFixture[str]):
    notes = _plan(RECIPES_DIR / "tiny-cpu.yaml", capsys)["notes"]
    assert notes[0] == "gemm plugin (engine.gemm_plugin):"
    assert [n.split(":")[0].strip() for n in notes[1:]] == ["sm_90a", "sm_100a", "dynamo (deploy.dynamo)"]
    assert all("run spatial_partition at these token counts: fused qkv 1..16, o_proj 1..16, fused gate_up 1..16, "
               "down_proj 1..16 " in n for n in notes[1:3])
    # deploy.target names dynamo: plan says what it writes, on how many GPUs per worker, with which image.
    assert "deploy/dynamo/dgd_agg.yaml (Frontend + 1 TRTLLMWorker x 1 GPU)" in notes[3]
    assert "tensorrtllm-runtime:1.6.1" in notes[3] and "TensorRT-LLM 1.3.0rc29" in notes[3]
