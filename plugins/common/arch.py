"""GPU architectures the plugins target, and the tile sizes chosen for each.

Tiles are (BLOCK_N, BLOCK_K) of the shuffled weight layout, fixed when the checkpoint is
transformed; the kernels read them back from the tensor's shape, so a checkpoint shuffled for one
arch still runs (correctly, maybe slower) on another.

Why these tiles (the kernels compute y^T = W x^T: weight rows fill the MMA's M side, tokens its
N side, so decode batches of 1..16 tokens don't waste a 64/128-row MMA):
- BLOCK_K = 128 fp8 = 128 bytes: one 128-byte swizzle row for TMA / wgmma / tcgen05 operands,
  and one full cache line per weight row for plain vector loads.
- sm_90a (H100/H200): BLOCK_N = 128 = two wgmma m64 atoms; the warp-specialized kernel gives one
  to each of its two consumer warpgroups.
- sm_100a (B200/GB200): BLOCK_N = 128 = one tcgen05 128-row MMA (accumulator in tensor memory).
- sm_89 / sm_120a (Ada, consumer Blackwell): mma.sync m16n8k32 FP8; BLOCK_N = 64 keeps 4 warps
  busy with more CTAs per weight matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UserError


@dataclass(frozen=True)
class ArchSpec:
    name: str  # canonical, e.g. "sm_90a"
    capability: int  # 90 -> GPUTarget("cuda", 90, 32)
    block_n: int
    block_k: int
    num_warps: int  # plain kernel
    num_stages: int  # shared-memory ring depth (cp.async / TMA stages)
    mma_pattern: str  # regex: the FP8 tensor-core instruction in SASS
    warp_specialize: bool  # does Triton's automatic warp specialization work here


ARCHS: dict[str, ArchSpec] = {
    "sm_89": ArchSpec("sm_89", 89, 64, 128, 4, 4, r"QMMA\.16832\.F32\.E4M3\.E4M3", False),
    "sm_90a": ArchSpec("sm_90a", 90, 128, 128, 4, 4, r"QGMMA\.64x\d+x32\.F32\.E4M3\.E4M3", True),
    "sm_100a": ArchSpec("sm_100a", 100, 128, 128, 4, 4, r"UTCQMMA", True),
    "sm_120a": ArchSpec("sm_120a", 120, 64, 128, 4, 4, r"QMMA\.16832\.F32\.E4M3\.E4M3", False),
}

# Product names a recipe may use instead of an arch.
GPU_ARCH: dict[str, str] = {
    "L4": "sm_89", "L40": "sm_89", "L40S": "sm_89", "RTX4090": "sm_89",
    "H100": "sm_90a", "H200": "sm_90a", "GH200": "sm_90a", "H20": "sm_90a",
    "B200": "sm_100a", "GB200": "sm_100a", "B100": "sm_100a",
    "RTX5090": "sm_120a", "RTXPRO6000": "sm_120a",
}


def canonical_arch(arch: str) -> str:
    """'sm_90', 'sm_90a', '90', '9.0', 'H200' -> 'sm_90a'; UserError for anything else."""
    text = str(arch).strip()
    key = text.upper().replace(" ", "").replace("-", "")
    for gpu, name in GPU_ARCH.items():
        if key == gpu or key.startswith(gpu + "SXM") or key.startswith(gpu + "PCIE"):
            return name
    digits = text.lower().removeprefix("sm_").removeprefix("sm").removesuffix("a").replace(".", "")
    if digits.isdigit():
        for spec in ARCHS.values():
            if spec.capability == int(digits):
                return spec.name
    raise UserError(f"unknown GPU arch '{arch}'", field="arch",
                    fix=f"use one of {', '.join(ARCHS)} (or a GPU name such as H200, B200)")


def spec(arch: str) -> ArchSpec:
    return ARCHS[canonical_arch(arch)]


def arch_of_capability(major: int, minor: int) -> str | None:
    """torch.cuda.get_device_capability() -> our arch name, None when we have no tiles for it."""
    cap = major * 10 + minor
    for s in ARCHS.values():
        if s.capability == cap:
            return s.name
    return None
