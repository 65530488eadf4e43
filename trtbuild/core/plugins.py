"""Plugin registry: name -> a self-describing GEMM plugin (weight transform, kernel, backends).

The kernels live in the top-level `plugins/` package; this module only knows their names and
where to import them from, so `trtbuild validate` / `plan` can describe and check plugins
without importing torch or triton. Everything heavy happens inside the plugin's methods.

Use:
    from trtbuild.core import plugins
    plugins.available()                       # ['gemm_weight_shuffle', 'spatial_partition']
    p = plugins.get("gemm_weight_shuffle")
    p.compatibility_problems(arch="sm_90a", quant_algo="FP8")   # [] when it fits
    sd = p.transform_weights(state_dict, "sm_90a")              # offline, on the FP8 checkpoint
    y = p.torch_op(x_fp8, sd[name], sx, sw, n, k, torch.bfloat16)
    report = p.aot_build(out_dir, ["sm_90a", "sm_100a"])        # cubins + SASS checks
"""

from __future__ import annotations

import importlib
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtbuild.core.errors import UserError

if TYPE_CHECKING:
    import torch

    from trtbuild.core.progress import Progress

# name -> the module whose `PLUGINS[name]` is the Plugin object. Importing it is cheap: torch and
# triton load only inside methods.
_REGISTRY: dict[str, str] = {
    "gemm_weight_shuffle": "plugins.common.fp8_plugin",
    "spatial_partition": "plugins.common.fp8_plugin",
}


@dataclass
class KernelCheck:
    """One compiled kernel variant for one arch, and what its SASS showed."""

    plugin: str
    arch: str
    variant: str  # e.g. "bm16"
    kernel: str  # Triton kernel function name
    cubin: str  # path relative to the AOT output dir
    registers: int | None
    spill_stores: int | None  # bytes, from ptxas -v
    spill_loads: int | None
    mma: list[str]  # FP8 tensor-core mnemonics found (e.g. QGMMA.64x16x32.F32.E4M3.E4M3)
    local_memory_ops: list[str]  # LDL/STL found (should be empty)
    extra: dict[str, Any] = field(default_factory=dict)  # warp-specialization evidence etc.
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class AotReport:
    """What `aot_build` produced; `problems` is empty when every SASS check passed."""

    plugin: str
    out_dir: str
    kernels: list[KernelCheck] = field(default_factory=list)
    tools: dict[str, str] = field(default_factory=dict)

    @property
    def problems(self) -> list[str]:
        return [f"{k.arch}/{k.variant}: {p}" for k in self.kernels for p in k.problems]

    @property
    def ok(self) -> bool:
        return bool(self.kernels) and not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "plugin": self.plugin,
            "ok": self.ok,
            "tools": self.tools,
            "kernels": [dict(vars(k), ok=k.ok) for k in self.kernels],
        }


class Plugin(ABC):
    """A GEMM plugin: offline weight transform + Triton kernel + torch reference + backends.

    Class attributes describe it (cheap to read, no heavy imports):
      name, description, supported_archs (e.g. "sm_90a"), requires (e.g. "fp8_checkpoint"),
      layout (weight layout id; plugins sharing one layout share one transformed checkpoint),
      torch_op_name ("trtbuild::..."; the op TensorRT-LLM's linears call through the bundle's
      module, plugins/trtllm_module), code_modules (modules whose source defines the plugin's output, for cache keys),
      uses_tma / warp_specialized (how the kernel reads and splits its work).
    """

    name: str
    description: str
    supported_archs: tuple[str, ...]
    requires: tuple[str, ...]
    layout: str
    torch_op_name: str
    code_modules: tuple[str, ...]
    uses_tma: bool
    warp_specialized: bool

    # --- checks (cheap) ---------------------------------------------------------------------
    @abstractmethod
    def compatibility_problems(self, *, arch: str | None = None,
                               quant_algo: str | None = None) -> list[str]:
        """One line per reason this plugin cannot serve this GPU arch / checkpoint format."""

    @abstractmethod
    def tile_for(self, arch: str) -> tuple[int, int]:
        """(BLOCK_N, BLOCK_K) of the weight layout for this arch."""

    # --- offline weight transform ----------------------------------------------------------
    @abstractmethod
    def transform_weights(self, state_dict: dict[str, torch.Tensor], arch: str) -> dict[str, torch.Tensor]:
        """Return a new state dict with every FP8 linear weight in this plugin's layout."""

    @abstractmethod
    def untransform_weights(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Inverse of transform_weights (for checks)."""

    @abstractmethod
    def metadata(self, arch: str) -> dict[str, str]:
        """Safetensors header metadata describing the transformed layout (tile sizes, arch)."""

    # --- compute ---------------------------------------------------------------------------
    @abstractmethod
    def reference(self, x: torch.Tensor, w: torch.Tensor, scale_x: torch.Tensor, scale_w: torch.Tensor,
                  n: int, k: int, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """Pure torch: y = (x_fp8 @ W^T) * scale_x * scale_w, W read from the transformed layout."""

    @abstractmethod
    def kernel(self, x: torch.Tensor, w: torch.Tensor, scale_x: torch.Tensor, scale_w: torch.Tensor,
               n: int, k: int, out_dtype: torch.dtype | None = None, **options: Any) -> torch.Tensor:
        """The Triton kernel (JIT on CUDA tensors, interpreter on CPU tensors)."""

    @abstractmethod
    def triton_kernel(self) -> Any:
        """The kernel object (`plugins.common.jit.DualKernel`: `.jit` compiled, `.interpreted`)."""

    @property
    @abstractmethod
    def torch_op(self) -> Any:
        """`torch.ops.trtbuild.<op>`: kernel on CUDA tensors, reference on CPU (registers on first use)."""

    # --- build / backends ------------------------------------------------------------------
    @abstractmethod
    def aot_build(self, out_dir: str | Path, archs: list[str] | tuple[str, ...], *,
                  variants: tuple[int, ...] | None = None, progress: Progress | None = None) -> AotReport:
        """Compile the kernels for `archs` into out_dir/<arch>/ and check their SASS (see AotReport)."""

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "supported_archs": list(self.supported_archs),
            "requires": list(self.requires),
            "layout": self.layout,
            "torch_op": self.torch_op_name,
        }


def _import_kernels(module: str) -> Any:
    """Import a module of the top-level `plugins` package.

    It sits beside `trtbuild/` in the source tree; when only `trtbuild` is on the path (an
    editable install that packages trtbuild alone, a script run from elsewhere), add that root.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        root = Path(__file__).resolve().parents[2]
        if exc.name != "plugins" or not (root / "plugins" / "__init__.py").is_file():
            raise
        sys.path.append(str(root))
        return importlib.import_module(module)


def available() -> list[str]:
    """Names of the registered plugins, sorted."""
    return sorted(_REGISTRY)


def get(name: str) -> Plugin:
    """The plugin called `name`; UserError naming the choices when there is none."""
    module = _REGISTRY.get(name)
    if module is None:
        raise UserError(f"unknown plugin '{name}'", field="engine.gemm_plugin",
                        fix=f"use one of: {', '.join(available())}")
    plugin = _import_kernels(module).PLUGINS[name]
    if not isinstance(plugin, Plugin):  # a registry entry pointing at the wrong object is our bug
        raise TypeError(f"{module}.PLUGINS[{name!r}] is not a trtbuild.core.plugins.Plugin")
    return plugin
