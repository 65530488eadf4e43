"""The Plugin implementation shared by the FP8 GEMM plugins (they differ in kernel and archs).

Import-light on purpose: torch, triton and the kernel modules load inside the methods, so the
registry can describe and check plugins in `trtbuild validate` without them.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plugins.common import LAYOUT_ID
from plugins.common.arch import ARCHS, canonical_arch
from trtbuild.errors import UserError
from trtbuild.plugins import AotReport, Plugin

if TYPE_CHECKING:
    import torch

    from trtbuild.progress import Progress

FP8_QUANT_ALGOS = ("FP8",)  # ModelOpt per-tensor FP8 (hf_quant_config.json quant_algo)


class Fp8ShuffledGemmPlugin(Plugin):
    requires = ("fp8_checkpoint",)
    layout = LAYOUT_ID

    def __init__(self, *, name: str, description: str, supported_archs: tuple[str, ...],
                 kernel_module: str, kernel_attr: str, torch_op_name: str, trtllm_plugin_name: str,
                 tma: bool, warp_specialized: bool, ctas_per_sm: int) -> None:
        self.name = name
        self.description = description
        self.supported_archs = supported_archs
        self.torch_op_name = torch_op_name
        self.trtllm_plugin_name = trtllm_plugin_name
        package = f"plugins.{name}"
        self.trtllm_plugin_module = f"{package}.trtllm_plugin"
        self._kernel_module = kernel_module
        self._kernel_attr = kernel_attr
        self.uses_tma = tma  # x and W tiles come in through TMA descriptors
        self.warp_specialized = warp_specialized
        self.ctas_per_sm = ctas_per_sm  # split-K sizes one wave of CTAs with this
        # Sources that decide the transformed weights, the AOT cubins and the bundled TRT-LLM plugin.
        self.code_modules = (kernel_module, self.trtllm_plugin_module, "plugins.common.layout",
                             "plugins.common.launch", "plugins.common.splitk", "plugins.common.arch",
                             "plugins.common.reference", "plugins.common.aot", "plugins.common.jit")
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
                            field="engine.plugins", fix="drop the plugin or build for a supported GPU")
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
        return getattr(importlib.import_module(self._kernel_module), self._kernel_attr)

    def kernel(self, x: torch.Tensor, w: torch.Tensor, scale_x: torch.Tensor, scale_w: torch.Tensor,
               n: int, k: int, out_dtype: torch.dtype | None = None, **options: Any) -> torch.Tensor:
        from plugins.common.launch import launch_fp8_gemm

        return launch_fp8_gemm(self.triton_kernel(), x, w, scale_x, scale_w, n, k, out_dtype,
                               tma=self.uses_tma, ctas_per_sm=self.ctas_per_sm, **options)

    @property
    def torch_op(self) -> Any:
        if self._op is None:
            from plugins.common.torch_ops import register

            self._op = register(self.torch_op_name, self.kernel, self.reference)
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

    @property
    def trtllm_python_plugin(self) -> str:
        spec = importlib.util.find_spec(self.trtllm_plugin_module)
        if spec is None or spec.origin is None:
            raise FileNotFoundError(self.trtllm_plugin_module)
        return Path(spec.origin).read_text()
