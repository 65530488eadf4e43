"""ModelOpt's NVFP4 flow on CPU (trtbuild.quantize.modelopt_nvfp4): mtq.quantize with NVFP4_DEFAULT_CFG and
ModelOpt's HF export on the tiny Llama, the export's files, and its packed values and scales
against ModelOpt's own NVFP4QTensor for the calibrated weights and amax."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from trtbuild.core.errors import BuildError
from trtbuild.quantize import modelopt_nvfp4
from trtbuild.quantize.config import QuantizeConfig
from trtbuild.runtime import nvfp4_blocks as nvfp4

NVFP4QTensor = pytest.importorskip("modelopt.torch.quantization.qtensor.nvfp4_tensor").NVFP4QTensor

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from quantize_fixtures import make_model_dir

    return make_model_dir(tmp_path_factory.mktemp("model")) / "hf"


@pytest.fixture(scope="module")
def run(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any],
                                                                               dict[str, modelopt_nvfp4.Calibrated]]:
    """quantize_nvfp4 end to end, with the calibrated snapshot kept for the tests below."""
    config = QuantizeConfig.model_validate({"calibration": {"num_samples": 8, "seq_len": 64},
                                            "gate": {"seq_len": 64, "eval_samples": 4}})
    kept: dict[str, dict[str, modelopt_nvfp4.Calibrated]] = {}
    original, unify = modelopt_nvfp4.snapshot, modelopt_nvfp4.unify_fused_groups

    def keep(model: Any) -> dict[str, modelopt_nvfp4.Calibrated]:
        kept["snapshot"] = original(model)
        return kept["snapshot"]

    def keep_before_unifying(model: Any) -> int:
        CALIBRATED.update(original(model))  # each linear's own amax, before its fused group's max
        return unify(model)

    out = tmp_path_factory.mktemp("export") / "hf"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(modelopt_nvfp4, "snapshot", keep)
        mp.setattr(modelopt_nvfp4, "unify_fused_groups", keep_before_unifying)
        metrics = modelopt_nvfp4.quantize_nvfp4(config, model_dir, out)
    return out, metrics, kept["snapshot"]


CALIBRATED: dict[str, modelopt_nvfp4.Calibrated] = {}


def test_modelopt_needs_cuda_without_the_patch(model_dir: Path) -> None:
    """The reason for trtbuild.runtime.nvfp4_blocks: ModelOpt 0.47's NVFP4 fake quantization stops on CPU."""
    import modelopt.torch.quantization as mtq
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.randint(0, 100, (1, 16))
    with pytest.raises(AssertionError, match="amax must be a CUDA tensor"):
        mtq.quantize(model, modelopt_nvfp4.quant_config(kv_cache=False, excluded=[]),
                     lambda m: m(input_ids=ids))
        with torch.no_grad():
            model(input_ids=ids)


def test_export_files(run: tuple[Path, dict[str, Any], dict[str, Any]]) -> None:
    from safetensors import safe_open

    out, metrics, snap = run
    quant = json.loads((out / "hf_quant_config.json").read_text())["quantization"]
    assert quant["quant_algo"] == "NVFP4" and quant["group_size"] == 16
    assert quant["kv_cache_quant_algo"] == "FP8"
    assert "lm_head" in quant["exclude_modules"]  # quantize.exclude's default
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        for layer in range(2):
            for linear in LINEARS:
                name = f"model.layers.{layer}.{linear}"
                weight = snap[name].weight
                n, k = weight.shape
                assert f.get_tensor(f"{name}.weight").dtype == torch.uint8
                assert tuple(f.get_slice(f"{name}.weight").get_shape()) == (n, k // 2)
                assert f.get_tensor(f"{name}.weight_scale").dtype == torch.float8_e4m3fn
                assert tuple(f.get_slice(f"{name}.weight_scale").get_shape()) == (n, k // 16)
                for scalar in ("weight_scale_2", "input_scale"):
                    t = f.get_tensor(f"{name}.{scalar}")
                    assert t.dtype == torch.float32 and t.numel() == 1
        # the embedding keeps the checkpoint's floating dtype
        assert f.get_tensor("model.embed_tokens.weight").is_floating_point()
        # TensorRT-LLM loads q/k/v (and gate/up) into one GEMM and asserts one weight_scale_2 and
        # input_scale for them (NVFP4LinearMethod.load_weight_scales)
        for members in (("q", "k", "v"), ("gate", "up")):
            prefix = "self_attn" if members[0] == "q" else "mlp"
            for scalar in ("weight_scale_2", "input_scale"):
                values = {f.get_tensor(f"model.layers.1.{prefix}.{m}_proj.{scalar}").item() for m in members}
                assert len(values) == 1
    assert metrics["nvfp4_linears_checked"] == len(snap) == 2 * len(LINEARS)
    assert "lm_head" not in snap and "lm_head.weight" in names and "lm_head.weight_scale" not in names
    # the quantized linears' bytes: half a byte a weight plus one e4m3 scale per 16 (and two float32)
    linear_elements = sum(c.weight.numel() for c in snap.values())
    assert metrics["nvfp4_packed_bytes"] == linear_elements // 2
    unquantized = metrics["weight_bytes_base"] - linear_elements * snap[next(iter(snap))].weight.element_size()
    kv_scales = sum(n.endswith((".k_scale", ".v_scale")) for n in names)  # FP8 KV cache: float32 each
    assert kv_scales == 4
    assert metrics["weight_bytes_quantized"] == (unquantized + linear_elements // 2 + linear_elements // 16
                                                 + 8 * len(snap) + 4 * kv_scales)


def test_export_equals_modelopt_nvfp4qtensor(run: tuple[Path, dict[str, Any], dict[str, Any]]) -> None:
    """Every exported linear against NVFP4QTensor.quantize of the calibrated weight, with the
    fused group's amax (q/k/v and gate/up share one), computed here by ModelOpt itself."""
    from safetensors.torch import load_file

    out, _, snap = run
    tensors = load_file(str(out / "model.safetensors"))
    shared = 0
    for name, cal in snap.items():
        members = [m for m in modelopt_nvfp4._group(name) if m in snap]
        amax = torch.stack([snap[m].weight_amax.reshape(()) for m in members]).max()
        scale_2 = NVFP4QTensor.get_weights_scaling_factor_2(amax.reshape(1)).reshape(())
        q, scale, scale_2 = NVFP4QTensor.quantize(cal.weight.clone(), 16, None, scale_2)
        assert torch.equal(tensors[f"{name}.weight"], q._quantized_data)
        assert torch.equal(tensors[f"{name}.weight_scale"].view(torch.uint8), scale.view(torch.uint8))
        assert torch.equal(tensors[f"{name}.weight_scale_2"], scale_2)
        input_amax = torch.stack([snap[m].input_amax.reshape(()) for m in members]).max()
        assert torch.equal(tensors[f"{name}.input_scale"], (input_amax / (6.0 * 448.0)).float())
        own = CALIBRATED[name].weight_amax
        shared += len(members) > 1 and bool((own < amax).item())
        assert bool((own <= amax).item()) and torch.equal(CALIBRATED[name].weight, cal.weight)
    assert shared > 0  # the fusion rule was exercised: some member's own amax was below its group's


def test_check_export_catches_a_flipped_byte(run: tuple[Path, dict[str, Any], dict[str, Any]],
                                             tmp_path: Path) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    out, _, snap = run
    copy = tmp_path / "hf"
    shutil.copytree(out, copy)
    assert modelopt_nvfp4.check_export(copy, snap, [])["nvfp4_linears_checked"] == len(snap)
    tensors = load_file(str(copy / "model.safetensors"))
    tensors["model.layers.1.mlp.down_proj.weight"][3, 5] ^= 0x10  # one e2m1 code
    save_file(tensors, str(copy / "model.safetensors"))
    with pytest.raises(BuildError, match=r"model\.layers\.1\.mlp\.down_proj\.weight differs .* in 1 bytes"):
        modelopt_nvfp4.check_export(copy, snap, [])


def test_fake_quant_model_is_the_dequantized_export(run: tuple[Path, dict[str, Any], dict[str, Any]],
                                                    model_dir: Path) -> None:
    """The perplexity the flow reports is of ModelOpt's fake-quant model; its weights are the
    export's: dequantizing the exported tensors gives NVFP4QTensor.dequantize of the same."""
    from safetensors.torch import load_file

    out, _, snap = run
    tensors = load_file(str(out / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj"
    q = nvfp4.NVFP4Weight(tensors[f"{name}.weight"], tensors[f"{name}.weight_scale"],
                          tensors[f"{name}.weight_scale_2"], tuple(snap[name].weight.shape), torch.float32)
    ref = NVFP4QTensor(q.shape, torch.float32, q.packed).dequantize(
        dtype=torch.float32, scale=q.weight_scale, double_scale=q.weight_scale_2, block_sizes={-1: 16})
    assert torch.equal(nvfp4.dequantize(q), ref)
    err = (ref - snap[name].weight).abs().max() / snap[name].weight.abs().max()
    assert 0 < err < 0.2  # half an e2m1 step (1/6 of a block amax) times e4m3 rounding (1 + 1/16) at most


def test_runtime_linear_on_the_export(run: tuple[Path, dict[str, Any], dict[str, Any]]) -> None:
    """The runtime's exact NVFP4 linear built from the exported tensors computes ModelOpt's
    fake-quant linear (input QDQ with the calibrated input amax, the export's weight) up to the
    float32 roundings of ModelOpt's QDQ, and gives the same bits for one row as within a batch."""
    from safetensors.torch import load_file

    from trtbuild.runtime.nvfp4 import ExactNvfp4Linear

    out, _, snap = run
    tensors = load_file(str(out / "model.safetensors"))
    for name in ("model.layers.0.self_attn.k_proj", "model.layers.1.mlp.down_proj"):
        linear = ExactNvfp4Linear.from_export(tensors, name)
        members = [m for m in modelopt_nvfp4._group(name) if m in snap]
        input_amax = torch.stack([snap[m].input_amax.reshape(()) for m in members]).max()
        x = torch.randn(5, linear.k, generator=torch.Generator().manual_seed(0)) * float(input_amax) / 3
        w = NVFP4QTensor(tuple(snap[name].weight.shape), torch.float32, tensors[f"{name}.weight"]).dequantize(
            dtype=torch.float32, scale=tensors[f"{name}.weight_scale"],
            double_scale=tensors[f"{name}.weight_scale_2"], block_sizes={-1: 16}).double()
        x_fake = nvfp4.fake_quantize(x, input_amax).double()
        got = linear(x)
        assert ((got - x_fake @ w.t()).abs() <= 2.0 ** -21 * (x_fake.abs() @ w.abs().t())).all()
        assert torch.equal(linear(x[3:4]), got[3:4])


def test_restore_dtype_keeps_the_global_scales_float32(tmp_path: Path) -> None:
    """A bf16 checkpoint is calibrated in float32 on CPU and its export cast back
    (export_dtype.restore_dtype): NVFP4's weight_scale_2 stays float32, as TensorRT-LLM reads it."""
    from safetensors.torch import load_file, save_file

    from trtbuild.quantize.export_dtype import restore_dtype

    tensors = {"a.weight": torch.zeros(4, 4, dtype=torch.uint8), "a.weight_scale": torch.ones(4, 1).to(torch.float8_e4m3fn),
               "a.weight_scale_2": torch.tensor(0.5), "a.input_scale": torch.tensor(0.25),
               "norm.weight": torch.ones(4)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float32"}))
    assert restore_dtype(tmp_path, torch.bfloat16) == 1
    back = load_file(str(tmp_path / "model.safetensors"))
    assert back["norm.weight"].dtype == torch.bfloat16
    assert back["a.weight_scale_2"].dtype == back["a.input_scale"].dtype == torch.float32


def test_a_tied_lm_head_stays_unquantized_as_the_embedding(tmp_path: Path) -> None:
    """Real checkpoints tie the LM head to the embedding (SmolLM2): the export stores it once, as
    model.embed_tokens.weight, so the check finds the excluded lm_head there (it failed with
    'lm_head was to stay unquantized' on SmolLM2-135M-Instruct)."""
    from quantize_fixtures import make_model_dir
    from safetensors.torch import load_file

    model = make_model_dir(tmp_path / "model", train_steps=0, tie_word_embeddings=True) / "hf"
    config = QuantizeConfig.model_validate({"calibration": {"num_samples": 4, "seq_len": 32},
                                            "gate": {"seq_len": 32, "eval_samples": 2}})
    out = tmp_path / "export"
    metrics = modelopt_nvfp4.quantize_nvfp4(config, model, out)
    tensors = load_file(str(out / "model.safetensors"))
    assert "lm_head.weight" not in tensors and tensors["model.embed_tokens.weight"].dtype.is_floating_point
    assert metrics["nvfp4_linears_checked"] == 2 * len(LINEARS)
