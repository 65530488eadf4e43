"""`quantize.format: nvfp4` through the stages on CPU: the quantize stage's work (ModelOpt's
NVFP4_DEFAULT_CFG under the CPU block fake quantizer, the gate, the export and both checks), the
runtime serving the export (greedy speculative output equal to plain greedy output), each contracted
release's NVFP4 checkpoint facts, and the preflight / plan lines for NVFP4 deployments.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
import yaml

from trtbuild.app.preflight import problems
from trtbuild.app.recipe import load_recipe
from trtbuild.core.contract import available_versions, load_contract
from trtbuild.core.contract import validate as cv
from trtbuild.core.errors import BuildError
from trtbuild.quantize.config import NVFP4_MAX_PERPLEXITY_RATIO, GateConfig, QuantizeConfig

pytest.importorskip("modelopt.torch.quantization.qtensor.nvfp4_tensor")
SMALL = {"format": "nvfp4", "calibration": {"num_samples": 8, "seq_len": 64},
         "gate": {"seq_len": 64, "eval_samples": 4, "max_perplexity_ratio": 1000}}


def test_nvfp4_gets_its_own_gate_default_and_an_explicit_one_is_kept() -> None:
    fp8_default = GateConfig().max_perplexity_ratio
    assert QuantizeConfig().gate.max_perplexity_ratio == fp8_default
    assert QuantizeConfig(format="nvfp4").gate.max_perplexity_ratio == NVFP4_MAX_PERPLEXITY_RATIO != fp8_default
    assert QuantizeConfig.model_validate({"format": "nvfp4", "gate": {"max_perplexity_ratio": 1.3}}
                                         ).gate.max_perplexity_ratio == 1.3
    with pytest.raises(ValueError, match="format"):
        QuantizeConfig.model_validate({"format": "int4"})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from quantize_fixtures import make_model_dir

    return make_model_dir(tmp_path_factory.mktemp("model")) / "hf"


@pytest.fixture(scope="module")
def stage(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    from trtbuild.quantize.modelopt_nvfp4 import run_nvfp4

    out = tmp_path_factory.mktemp("quantize")
    result = run_nvfp4(QuantizeConfig.model_validate(SMALL), model_dir, out)
    return out / "hf", result


def test_the_stage_exports_nvfp4_and_the_runtime_reproduces_the_fake_quant_model(stage: tuple[Path, Any]) -> None:
    export, result = stage
    m = result.metrics
    quant = json.loads((export / "hf_quant_config.json").read_text())["quantization"]
    assert (quant["quant_algo"], quant["group_size"], quant["kv_cache_quant_algo"]) == ("NVFP4", 16, "FP8")
    assert m["format"] == "nvfp4" and m["nvfp4_linears_checked"] == 14  # 2 layers x 7 linears, bit for bit
    assert m["perplexity_ratio"] == pytest.approx(m["perplexity_quantized"] / m["perplexity_base"])
    assert m["export_check"] == "passed"  # the runtime, layer by layer, against ModelOpt's fake quant
    assert m["export_layer_error_median"] < m["export_layer_error_limit"]
    assert m["weight_bytes_quantized"] < m["weight_bytes_base"]
    assert result.info["excluded_modules"] == ["lm_head"] and result.info["export_dir"] == "hf"


def test_the_gate_refuses_before_anything_is_written(model_dir: Path, stage: tuple[Path, Any],
                                                     tmp_path: Path) -> None:
    from trtbuild.quantize.modelopt_nvfp4 import run_nvfp4

    limit = stage[1].metrics["perplexity_ratio"] * 0.999  # the same run (same windows, seed) scores above it
    config = QuantizeConfig.model_validate({**SMALL, "gate": {**SMALL["gate"], "max_perplexity_ratio": limit}})
    with pytest.raises(BuildError, match="NVFP4 accuracy gate failed") as info:
        run_nvfp4(config, model_dir, tmp_path / "q")
    assert info.value.field == "quantize.gate.max_perplexity_ratio"
    assert not (tmp_path / "q" / "hf").exists()


def test_runtime_serves_the_export_with_the_exact_linear_and_speculation_is_lossless(stage: tuple[Path, Any]) -> None:
    import torch

    from trtbuild.runtime.generate import Generator, SpecParams
    from trtbuild.runtime.nvfp4 import ExactNvfp4Linear
    from trtbuild.runtime.target import load_target

    export, _ = stage
    target = load_target(export)
    assert target.quant.quant_algo == "NVFP4" and target.dtype == torch.float64
    linears = [lin for layer in target.layers for lin in vars_of(layer) if getattr(lin, "nvfp4", None) is not None]
    assert len(linears) == 14 and all(isinstance(lin.nvfp4, ExactNvfp4Linear) for lin in linears)
    # One row equals the same row inside a batch, bit for bit (what makes greedy speculation exact).
    x = torch.randn(9, linears[0].nvfp4.k, dtype=torch.float64)
    assert torch.equal(linears[0](x[4:5]), linears[0](x)[4:5])
    gen = Generator(target)
    prompt = list(range(3, 40)) * 2  # repeats: the n-gram drafter finds matches and drafts
    plain = gen.generate(prompt, 40).tokens
    ngram = gen.generate(prompt, 40, spec=SpecParams(method="ngram", max_draft_len=4))
    assert ngram.tokens == plain
    assert sum(ngram.stats.accepted) > 0  # multi-row verifications were accepted: the rows agreed


def vars_of(layer: Any) -> list[Any]:
    """The Linear objects one decoder layer holds (fused lists flattened)."""
    from trtbuild.runtime.layers import Linear

    out: list[Any] = []
    for value in (getattr(layer, name, None) for name in dir(layer) if not name.startswith("__")):
        items = value if isinstance(value, (list, tuple)) else [value]
        out += [v for v in items if isinstance(v, Linear)]
    return out


@pytest.mark.parametrize("version", available_versions())
def test_the_export_passes_every_releases_nvfp4_facts(stage: tuple[Path, Any], version: str) -> None:
    contract = load_contract(version)
    assert contract.section("nvfp4")["group_size"] == 16
    assert cv.check_nvfp4_checkpoint(stage[0], contract) == []


def _copy(export: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(export, tmp_path / "hf"))


def _set_scalar(directory: Path, name: str, value: float) -> None:
    """Overwrite one float32 scalar of the export in place (offsets from the safetensors header)."""
    from trtbuild.core.safetensors_header import read_header

    for file in directory.glob("*.safetensors"):
        header = read_header(file)
        if name in header:
            data = bytearray(file.read_bytes())
            (length,) = struct.unpack("<Q", data[:8])
            start, end = header[name]["data_offsets"]
            data[8 + length + start:8 + length + end] = struct.pack("<f", value)
            file.write_bytes(bytes(data))
            return
    raise AssertionError(name)


def test_release_checks_name_what_each_release_would_refuse(stage: tuple[Path, Any], tmp_path: Path) -> None:
    export = _copy(stage[0], tmp_path)
    path = export / "hf_quant_config.json"
    data = json.loads(path.read_text())
    data["quantization"]["group_size"] = 32
    path.write_text(json.dumps(data))
    found = cv.check_nvfp4_checkpoint(export, load_contract("1.1.0"))
    assert [v.field for v in found] == ["target/hf_quant_config.json:quantization.group_size"]
    assert "linear.py@ed53795b" in found[0].line()
    data["quantization"]["group_size"] = 16
    path.write_text(json.dumps(data))
    # q/k/v share one input_scale in ModelOpt's export; TensorRT-LLM asserts it when fusing them.
    _set_scalar(export, "model.layers.1.self_attn.k_proj.input_scale", 0.5)
    for version in available_versions():
        lines = [v.line() for v in cv.check_nvfp4_checkpoint(export, load_contract(version))]
        assert len(lines) == 1 and "model.layers.1.self_attn.{q_proj,k_proj,v_proj}.input_scale" in lines[0], lines


def _recipe(tmp_path: Path, archs: list[str], engine: dict[str, Any] | None = None) -> Any:
    data = yaml.safe_load((Path(__file__).resolve().parent.parent / "recipes" / "tiny-cpu.yaml").read_text())
    data.update({"gpu_archs": archs, "output_dir": str(tmp_path / "out")})
    data["quantize"] = {"format": "nvfp4"}
    if engine is not None:
        data["engine"] = {**data["engine"], **engine}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_recipe(path)


def test_validate_refuses_nvfp4_on_hopper_in_one_line(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, ["sm_90a", "sm_100a"], {"gemm_plugin": None})
    found = [p for p in problems(recipe) if "NVFP4" in p]
    assert len(found) == 1 and found[0].startswith("gpu_archs: sm_90a cannot run the NVFP4 checkpoint")
    assert "(fix: set gpu_archs to [sm_100a], or quantize.format: fp8 for Hopper)" in found[0]
    assert problems(_recipe(tmp_path, ["sm_100a"], {"gemm_plugin": None})) == []


def test_plan_says_the_fp8_plugins_take_no_nvfp4_gemm(tmp_path: Path) -> None:
    from trtbuild.engine.plugin_module import plan_notes

    recipe = _recipe(tmp_path, ["sm_100a"], {"gemm_plugin": {"kernels": {"sm_100a": "spatial_partition"}}})
    assert problems(recipe) == []
    notes = plan_notes(recipe)
    assert notes[0] == "gemm plugin (engine.gemm_plugin):" and len(notes) == 2
    assert notes[1].startswith("  sm_100a: NVFP4 checkpoint: the FP8 plugins take no GEMM")
    assert "stays TensorRT-LLM's NVFP4 GEMM" in notes[1]
    fp8 = plan_notes(load_recipe(Path(__file__).resolve().parent.parent / "recipes" / "tiny-cpu.yaml"))
    assert "spatial_partition at these token counts" in fp8[1]  # FP8: the plugins' GEMMs, unchanged
