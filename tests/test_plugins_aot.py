"""AOT build on this CPU host: cubins for sm_90a / sm_100a whose SASS has FP8 tensor-core MMAs,
no local-memory spills, and (spatial_partition) a real producer/consumer warp split."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from plugins.common import aot
from plugins.common.arch import ARCHS
from trtbuild.core import plugins
from trtbuild.core.errors import BuildError, UserError

# What the SASS must show per arch (found by compiling: wgmma E4M3 on Hopper, tcgen05 on Blackwell).
EXPECTED_MMA = {"sm_90a": r"QGMMA\.64x\d+x32\.F32\.E4M3\.E4M3", "sm_100a": r"UTCQMMA",
                "sm_89": r"QMMA\.16832\.F32\.E4M3\.E4M3", "sm_120a": r"QMMA\.16832\.F32\.E4M3\.E4M3"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[plugins.AotReport, Path]]:
    out = {}
    for name in plugins.available():
        root = tmp_path_factory.mktemp(name)
        out[name] = (plugins.get(name).aot_build(root, ["sm_90a", "sm_100a"], variants=(16,)), root)
    return out


@pytest.mark.parametrize("name", plugins.available())
def test_cubins_have_fp8_mma_and_no_spills(built, name: str) -> None:
    report, root = built[name]
    assert report.ok, report.problems
    assert {(k.arch, k.variant) for k in report.kernels} == {
        (a, v) for a in ("sm_90a", "sm_100a") for v in ("bm16", "reduce")}
    for k in report.kernels:
        sass = (root / k.cubin).with_suffix(".sass").read_text()
        assert (root / k.cubin).stat().st_size > 0
        assert f"code for {k.arch}" in sass  # cuobjdump's header names the cubin's arch
        assert k.spill_stores == 0 and k.spill_loads == 0 and k.registers
        assert not re.search(r"\b(LDL|STL)(\.\w+)*\s", sass)
        if k.variant == "reduce":
            continue
        assert re.search(EXPECTED_MMA[k.arch], sass), f"{k.arch}: no FP8 MMA in SASS"
        assert k.mma and all(re.match(EXPECTED_MMA[k.arch], m) for m in k.mma)
        if k.arch == "sm_90a":  # swap AB: 64 weight rows x 16 tokens x 32 K per instruction
            assert k.mma == ["QGMMA.64x16x32.F32.E4M3.E4M3"]
    saved = json.loads((root / "aot_report.json").read_text())
    assert saved["ok"] and len(saved["kernels"]) == 4


def test_plain_kernel_streams_with_async_copies(built) -> None:
    report, root = built["gemm_weight_shuffle"]
    for k in report.kernels:
        if k.variant == "bm16":
            ops = aot.mnemonics((root / k.cubin).with_suffix(".sass").read_text())
            # 16-byte cp.async (LDGSTS ... .128) into the shared-memory ring, no TMA, no WS.
            assert "LDGSTS.E.BYPASS.128" in ops, k.arch
            assert not any(op.startswith("UTMALDG") for op in ops)
            assert "partitions" not in k.extra


def test_spatial_partition_is_warp_specialized(built) -> None:
    report, root = built["spatial_partition"]
    for k in (k for k in report.kernels if k.variant == "bm16"):
        parts = k.extra["partitions"]
        producers = [p for p, d in parts.items() if "tma_load" in d["ops"]]
        consumers = [p for p, d in parts.items() if "mma" in d["ops"]]
        assert len(producers) == 1 and consumers and producers[0] not in consumers, parts
        assert k.extra["setmaxnreg"] > 0 and k.extra["tma_loads"] > 0
        assert k.extra["num_warps"] > ARCHS[k.arch].num_warps  # partitions add warps
        ttgir = (root / k.cubin).with_suffix(".ttgir").read_text()
        if k.arch == "sm_90a":
            # Two consumer warpgroups, each a 64-row wgmma half of the 128-row weight tile (a
            # host-side TMA descriptor would make both compute the whole tile instead).
            assert len(consumers) == 2
            dots = re.findall(r"warp_group_dot .*?: !ttg\.memdesc<(\d+)x(\d+)xf8E4M3FN", ttgir)
            assert dots and {d for d in dots} == {("64", "128")}
        else:
            assert "tc_gen5_mma" in ttgir


def test_checks_catch_missing_mma_and_missing_warp_specialization(built, tmp_path: Path) -> None:
    # The split-K reduce has no MMA and the plain kernel no partitions: demanding them must fail.
    shuffle = plugins.get("gemm_weight_shuffle")
    spec = ARCHS["sm_90a"]
    plain, reduce = shuffle.aot_variants(spec, (16,))
    (tmp_path / "x").mkdir()
    for variant, expected in ((dataclasses.replace(reduce, needs_mma=True), "no FP8 tensor-core instruction"),
                              (dataclasses.replace(plain, warp_specialized=True), "did not warp-specialize")):
        check = aot.check_kernel("t", variant, spec, aot.compile_variant(variant, spec), tmp_path, Path("x"))
        assert not check.ok and any(expected in p for p in check.problems), check.problems


def test_compile_failure_is_a_build_error_and_leaves_nothing(tmp_path: Path) -> None:
    shuffle = plugins.get("gemm_weight_shuffle")
    with pytest.raises(BuildError, match=r"compiling _fp8_gemm_shuffled_kernel \(bm12\) for sm_90a failed"):
        shuffle.aot_build(tmp_path, ["sm_90a"], variants=(12,))  # tl.arange needs a power of 2
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(UserError, match="spatial_partition supports sm_90a, sm_100a, not sm_89"):
        plugins.get("spatial_partition").aot_build(tmp_path, ["sm_89"])


@pytest.mark.slow
@pytest.mark.parametrize("name", plugins.available())
def test_every_variant_for_every_supported_arch(tmp_path: Path, name: str) -> None:
    plugin = plugins.get(name)
    report = plugin.aot_build(tmp_path, list(plugin.supported_archs))
    assert report.ok, report.problems
    for k in report.kernels:
        if k.variant != "reduce":
            assert k.mma and re.match(EXPECTED_MMA[k.arch], k.mma[0])
    assert {k.variant for k in report.kernels} == {"bm16", "bm32", "bm64", "bm16_splitk", "reduce"}
