"""The plugins on a real ModelOpt FP8 export (the quantize stage run on a small Llama): every FP8
linear is transformed, undone bit-exactly, and the kernel computes that layer's product."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from plugins.common.layout import FP8
from plugins.common.reference import quantize_fp8
from trtbuild.core import plugins
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.core.stage import Artifact, StageContext
from trtbuild.quantize.stage import QuantizeConfig, QuantizeStage

SMALL = {"calibration": {"num_samples": 16, "seq_len": 64, "batch_size": 8},
         "gate": {"seq_len": 64, "eval_samples": 8}}


@pytest.fixture(scope="module")
def fp8_state(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    from quantize_fixtures import make_model_dir

    root = make_model_dir(tmp_path_factory.mktemp("model"), train_steps=10)
    out = tmp_path_factory.mktemp("quant") / "out"
    out.mkdir()
    ctx = StageContext(recipe=RecipeInfo.standalone(), inputs={"model": Artifact("model", "test", root)}, out_dir=out)
    QuantizeStage().run(QuantizeConfig.model_validate(SMALL), ctx)
    state: dict[str, torch.Tensor] = {}
    for file in sorted((out / "hf").glob("*.safetensors")):
        state.update(load_file(str(file)))
    return state


@pytest.mark.slow
def test_modelopt_export_through_the_plugins(fp8_state: dict[str, torch.Tensor], monkeypatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    linears = [k for k, v in fp8_state.items() if k.endswith(".weight") and v.dtype == FP8]
    assert len(linears) >= 14  # 7 projections x 2 layers
    for name in plugins.available():
        plugin = plugins.get(name)
        out = plugin.transform_weights(fp8_state, "sm_90a")
        assert {k for k in out if k.endswith("_layout")} == {k + "_layout" for k in linears}
        back = plugin.untransform_weights(out)
        for key in linears:
            assert torch.equal(back[key].view(torch.uint8), fp8_state[key].view(torch.uint8))
        prefix = linears[0].removesuffix(".weight")
        w = fp8_state[linears[0]]
        sw, sx = fp8_state[prefix + ".weight_scale"], fp8_state[prefix + ".input_scale"]
        n, k = w.shape
        x = quantize_fp8(torch.randn(4, k), sx)
        dense = (x.float() @ w.float().t()) * (sx.float() * sw.float())
        y = plugin.kernel(x, out[linears[0]], sx, sw, n, k, torch.float32)
        torch.testing.assert_close(y, dense, rtol=1e-5, atol=1e-5 * float(dense.abs().max()))
        y_op = plugin.torch_op(x, out[linears[0]], sx, sw, n, k, torch.float32)
        torch.testing.assert_close(y_op, dense, rtol=1e-5, atol=1e-5 * float(dense.abs().max()))
