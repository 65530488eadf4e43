"""The plugin registry: names, self-description, compatibility checks, cheap imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from plugins.common.arch import ARCHS, arch_of_capability, canonical_arch
from trtbuild.core import plugins
from trtbuild.core.errors import UserError

ROOT = Path(__file__).resolve().parent.parent


def test_available_and_get() -> None:
    assert plugins.available() == ["gemm_weight_shuffle", "spatial_partition"]
    for name in plugins.available():
        plugin = plugins.get(name)
        assert isinstance(plugin, plugins.Plugin)
        assert plugin.name == name
        info = plugin.describe()
        assert info["requires"] == ["fp8_checkpoint"]
        assert {"sm_90a", "sm_100a"} <= set(info["supported_archs"])
        assert info["torch_op"].startswith("trtbuild::")
    # Both read one weight layout, so a checkpoint is transformed once for either.
    assert plugins.get("gemm_weight_shuffle").layout == plugins.get("spatial_partition").layout


def test_unknown_plugin_is_a_user_error() -> None:
    with pytest.raises(UserError) as err:
        plugins.get("gemm_magic")
    assert "gemm_weight_shuffle" in err.value.one_line()
    assert err.value.field == "engine.gemm_plugin"


def test_registry_does_not_import_torch_or_triton() -> None:
    # `trtbuild validate` describes and checks plugins: that must stay cheap.
    code = ("import sys; from trtbuild.core import plugins\n"
            "for n in plugins.available():\n"
            "    p = plugins.get(n); p.describe(); p.compatibility_problems(arch='H200', quant_algo='FP8')\n"
            "    p.tile_for('sm_100a')\n"
            "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("text", "arch"), [
    ("sm_90a", "sm_90a"), ("sm_90", "sm_90a"), ("90", "sm_90a"), ("9.0", "sm_90a"), ("H200", "sm_90a"),
    ("h100-sxm", "sm_90a"), ("B200", "sm_100a"), ("sm_100a", "sm_100a"), ("L40S", "sm_89"),
    ("sm_120", "sm_120a"),
])
def test_canonical_arch(text: str, arch: str) -> None:
    assert canonical_arch(text) == arch


def test_unknown_arch() -> None:
    with pytest.raises(UserError, match="unknown GPU arch 'sm_75'"):
        canonical_arch("sm_75")
    assert arch_of_capability(9, 0) == "sm_90a"
    assert arch_of_capability(7, 5) is None


def test_compatibility_problems() -> None:
    shuffle = plugins.get("gemm_weight_shuffle")
    ws = plugins.get("spatial_partition")
    assert shuffle.compatibility_problems(arch="H200", quant_algo="FP8") == []
    assert ws.compatibility_problems(arch="sm_100a", quant_algo="fp8") == []
    assert shuffle.compatibility_problems(arch="sm_89") == []
    # Warp specialization needs Hopper or Blackwell datacenter parts.
    [problem] = ws.compatibility_problems(arch="L40S")
    assert "spatial_partition supports sm_90a, sm_100a, not L40S" in problem
    [problem] = shuffle.compatibility_problems(arch="sm_75")
    assert "not sm_75" in problem
    [problem] = shuffle.compatibility_problems(quant_algo="NVFP4")
    assert "per-tensor FP8" in problem and "NVFP4" in problem
    assert len(ws.compatibility_problems(arch="sm_80", quant_algo="FP8_BLOCK_SCALES")) == 2


def test_tiles_per_arch() -> None:
    shuffle = plugins.get("gemm_weight_shuffle")
    for name, spec in ARCHS.items():
        assert shuffle.tile_for(name) == (spec.block_n, spec.block_k)
    assert shuffle.tile_for("H100") == (128, 128)
    assert shuffle.tile_for("sm_89") == (64, 128)
    with pytest.raises(UserError, match="spatial_partition supports"):
        plugins.get("spatial_partition").tile_for("sm_89")
    meta = shuffle.metadata("H200")
    assert meta["trtbuild.weight_layout.arch"] == "sm_90a"
    assert (meta["trtbuild.weight_layout.block_n"], meta["trtbuild.weight_layout.block_k"]) == ("128", "128")
    assert all(isinstance(v, str) for v in meta.values())
