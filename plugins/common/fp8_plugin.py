"""The Plugin implementation shared by the FP8 GEMM plugins (they differ in kernel and archs).

Import-light on purpose: torch, triton and the kernel modules load inside the methods, so the
registry can describe and check plugins in `trtbuild validate` without them.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plugins.common import LAYOUT_ID
from plugins.common.arch import ARCHS, canonical_arch
from trtbuild.core.errors import UserError
from trtbuild.core.plugins import AotReport, Plugin

if TYPE_CHECKING:
    import torch

    from trtbuild.core.progress import Progress

FP8_QUANT_ALGOS = ("FP8",)  # ModelOpt per-tensor FP8 (hf_quant_config.json quant_algo)


class Fp8ShuffledGemmPlugin(Plugin):
    requires = ("fp8_checkpoint",)
    layout = LAYOUT_ID

    def __init__(self, *, name: str, description: str, supported_archs: tuple[str, ...],
                 warp_specialized: bool) -> None:
        from plugins.common.kernels import KERNELS

        kernel = KERNELS[name]
        self.name = name
        self.description = description
        self.supported_archs = supported_archs
        self.torch_op_name = kernel.op
        self._kernel_module = f"plugins.{kernel.module}"
        self.uses_tma = kernel.tma  # x and W tiles come in through TMA descriptors
        self.warp_specialized = warp_specialized
        self.ctas_per_sm = kernel.ctas_per_sm  # split-K sizes one wave of CTAs with this
        # Sources that decide the AOT cubins and the kernels the bundled TRT-LLM module runs.
        self.code_modules = (self._kernel_module, "plugins.common.kernels", "plugins.common.layout",
                             "plugins.common.launch", "plugins.common.splitk", "plugins.common.arch",
                             "plugins.common.reference", "plugins.common.aot", "plugins.common.jit",
                             "plugins.common.torch_ops", "plugins.trtllm_module")
        self._op: Any = None

    # --- checks ----------------------------------------------------------------------------
    def compatibility_problems(self, *, arch: str | None = None,
                               quant_algo: str | None = None) -> list[str]:
        problems = []
        if arch is not None:
            try:
                name = canonical_arch(arch)
            except UserError:
                name = str(arch)
            if name not in self.supported_archs:
                problems.append(f"plugin {self.name} supports {', '.join(self.supported_archs)}, "
                                f"not {arch}")
        if quant_algo is not None and quant_algo.upper() not in FP8_QUANT_ALGOS:
            problems.append(f"plugin {self.name} needs a per-tensor FP8 checkpoint "
                            f"(quant_algo FP8), the checkpoint has {quant_algo}")
        return problems

    def _arch(self, arch: str) -> str:
        name = canonical_arch(arch)
        if name not in self.supported_archs:
            raise UserError(f"plugin {self.name} supports {', '.join(self.supported_archs)}, not {arch}",
                            field="engine.gemm_plugin", fix="name another kernel for that arch or build for a supported GPU")
        return name

    def tile_for(self, arch: str) -> tuple[int, int]:
        spec = ARCHS[self._arch(arch)]
        return spec.block_n, spec.block_k

    # --- weights ---------------------------------------------------------------------------
    def transform_weights(self, state_dict: dict[str, torch.Tensor], arch: str) -> dict[str, torch.Tensor]:
        from plugins.common.layout import transform_state_dict

        block_n, block_k = self.tile_for(arch)
        return transform_state_dict(state_dict, block_n, block_k, self.name)

    def untransform_weights(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        from plugins.common.layout import untransform_state_dict

        return untransform_state_dict(state_dict)

    def metadata(self, arch: str) -> dict[str, str]:
        from plugins.common.layout import header_metadata

        block_n, block_k = self.tile_for(arch)
        return header_metadata(self._arch(arch), block_n, block_k, self.name)

    # --- compute ---------------------------------------------------------------------------
    def reference(self, x: torch.Tensor, w: torch.Tensor, scale_x: torch.Tensor, scale_w: torch.Tensor,
                  n: int, k: int, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        from plugins.common.reference import fp8_gemm_reference

        return fp8_gemm_reference(x, w, scale_x, scale_w, n, k, out_dtype)

    def triton_kernel(self) -> Any:
        """The DualKernel (compiled + interpreted) of this plugin's Triton kernel."""
        from plugins.common.kernels import triton_kernel

        return triton_kernel(self.name)

    def kernel(self, x: torch.Tensor, w: torch.Tensor, scale_x: torch.Tensor, scale_w: torch.Tensor,
               n: int, k: int, out_dtype: torch.dtype | None = None, **options: Any) -> torch.Tensor:
        from plugins.common.kernels import run

        return run(self.name, x, w, scale_x, scale_w, n, k, out_dtype, **options)

    @property
    def torch_op(self) -> Any:
        if self._op is None:
            from plugins.common.kernels import torch_op

            self._op = torch_op(self.name)
        return self._op

    # --- build / backends ------------------------------------------------------------------
    def aot_variants(self, arch: Any, block_ms: tuple[int, ...] | None = None) -> list[Any]:
        from plugins.common import splitk
        from plugins.common.aot import Variant

        module = importlib.import_module(self._kernel_module)
        # BLOCK_M variants with the direct epilogue; the full build adds the decode hot path
        # (BLOCK_M 16, split-K partials) and always the split-K reduce.
        shapes = [(bm, False) for bm in block_ms or splitk.BLOCK_M_CHOICES]
        if block_ms is None:
            shapes.append((splitk.BLOCK_M_CHOICES[0], True))
        variants = []
        for bm, partials in shapes:
            variants.append(Variant(
                kernel=self.triton_kernel(), tag=f"bm{bm}" + ("_splitk" if partials else ""),
                signature=module.AOT_SIGNATURE, aligned=module.AOT_ALIGNED,
                warp_specialized=self.warp_specialized, num_stages=arch.num_stages,
                constexprs={"BLOCK_N": arch.block_n, "BLOCK_K": arch.block_k, "BLOCK_M": bm,
                            "NUM_STAGES": arch.num_stages, "USE_PARTIALS": partials}))
        variants.append(Variant(
            kernel=splitk.splitk_reduce_kernel, tag="reduce", needs_mma=False,
            signature={"part_ptr": "*fp32", "sx_ptr": "*fp32", "sw_ptr": "*fp32", "out_ptr": "*bf16",
                       "MN": "i32", "SPLIT": "i32"},
            aligned=("part_ptr", "sx_ptr", "sw_ptr", "out_ptr", "MN"),
            constexprs={"BLOCK": splitk.REDUCE_BLOCK}))
        return variants

    def aot_build(self, out_dir: str | Path, archs: list[str] | tuple[str, ...], *,
                  variants: tuple[int, ...] | None = None, progress: Progress | None = None) -> AotReport:
        """Compile into out_dir/<arch>/ (BLOCK_M variants: `variants`, default all) and check the SASS."""
        from plugins.common import aot

        specs = [ARCHS[self._arch(a)] for a in archs]
        return aot.build(self.name, out_dir, specs, lambda spec: self.aot_variants(spec, variants),
                         progress)


PLUGINS: dict[str, Fp8ShuffledGemmPlugin] = {
    "gemm_weight_shuffle": Fp8ShuffledGemmPlugin(
        name="gemm_weight_shuffle",
        description=("FP8 (e4m3) linear weights shuffled into tile-contiguous BLOCK_N x BLOCK_K blocks "
                     "(tiles per arch) at load time; an FP8 GEMM/GEMV with per-tensor scales streams each "
                     "program's tiles with contiguous 16-byte loads through a cp.async ring"),
        supported_archs=("sm_89", "sm_90a", "sm_100a", "sm_120a"),
        warp_specialized=False),
    "spatial_partition": Fp8ShuffledGemmPlugin(
        name="spatial_partition",
        description=("warp-specialized FP8 GEMM/GEMV on the tile-shuffled layout: Triton's "
                     "tl.range(warp_specialize=True) splits each CTA into a TMA producer warpgroup "
                     "filling a multi-stage shared-memory ring (mbarriers) and tensor-core consumer "
                     "warps (wgmma on sm_90a, tcgen05 on sm_100a)"),
        supported_archs=("sm_90a", "sm_100a"),
        warp_specialized=True),
}
