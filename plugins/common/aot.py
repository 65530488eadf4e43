"""Ahead-of-time build of the plugin kernels on a host without a GPU, and the SASS checks.

`triton.compile(ASTSource(...), target=GPUTarget("cuda", cap, 32))` lowers to PTX and runs the
ptxas Triton ships (the cubin's arch gets the "a" suffix: sm_90a, sm_100a). We then:
- run that ptxas again with -v on the PTX for registers and spill bytes,
- disassemble the cubin with the wheel's cuobjdump and look for the arch's FP8 tensor-core
  instruction (QGMMA ... E4M3 on sm_90a, UTCQMMA on sm_100a, QMMA.16832 ... E4M3 on sm_89/120)
  and for local-memory traffic (LDL/STL),
- for warp-specialized kernels, read the TTGIR's `ttg.warp_specialize` partitions (which one
  issues TMA loads, which one the MMAs) and the SASS register hand-off (USETMAXREG).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plugins.common.arch import ArchSpec
from plugins.common.jit import FP_FUSION, DualKernel
from trtbuild.core.errors import BuildError
from trtbuild.core.plugins import AotReport, KernelCheck
from trtbuild.core.progress import Progress


@dataclass(frozen=True)
class Variant:
    """One kernel build: a kernel, its AOT signature, constexprs, and what the SASS must show."""

    kernel: DualKernel
    tag: str  # file stem suffix, e.g. "bm16"
    signature: dict[str, str]
    aligned: tuple[str, ...]  # args known to be multiples of 16 (pointers: 16-byte aligned)
    constexprs: dict[str, Any]
    needs_mma: bool = True
    warp_specialized: bool = False
    num_stages: int = 4


def tools() -> dict[str, str]:
    """Paths of the NVIDIA tools the triton wheel carries."""
    from triton import knobs

    return {"cuobjdump": knobs.nvidia.cuobjdump.path, "nvdisasm": knobs.nvidia.nvdisasm.path}


def _ptxas_for(capability: int) -> str:
    from triton.backends.nvidia.compiler import get_ptxas

    try:
        return get_ptxas(capability).path
    except TypeError:  # triton 3.4 / 3.5 (the Triton TRT-LLM images' versions): one ptxas for every arch
        return get_ptxas().path


def compile_variant(variant: Variant, arch: ArchSpec) -> Any:
    """triton.compile for one arch; returns the CompiledKernel (asm has ptx, cubin, ttgir)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = variant.kernel.jit
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in variant.aligned}
    sig = dict(variant.signature)
    for name in variant.constexprs:
        sig[name] = "constexpr"
    src = ASTSource(fn, signature=sig, constexprs=variant.constexprs, attrs=attrs)
    target = GPUTarget("cuda", arch.capability, 32)
    backend = triton.compiler.make_backend(target)
    options = backend.parse_options({"num_warps": arch.num_warps, "num_stages": variant.num_stages,
                                     "enable_fp_fusion": FP_FUSION})
    return triton.compile(src, target=target, options=options.__dict__)


_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")


def ptxas_usage(ptx: str, arch: ArchSpec) -> tuple[int | None, int | None, int | None, str]:
    """(registers, spill store bytes, spill load bytes, log) from `ptxas -v` on the PTX."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        # Triton's own ptxas flags (backends/nvidia/compiler.py make_cubin), so the numbers are
        # those of the cubin we ship; its log is not kept, and a cache hit runs no ptxas at all.
        proc = subprocess.run([_ptxas_for(arch.capability), "-lineinfo", "-v", "--regAllocOptLevel=2",
                               *([] if FP_FUSION else ["--fmad=false"]), f"--gpu-name={arch.name}",
                               str(src), "-o", str(Path(tmp) / "k.cubin")],
                              capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise BuildError(f"ptxas failed for {arch.name}: {log.strip().splitlines()[-1:]}")
    regs = _REGS.search(log)
    spill = _SPILL.search(log)
    return (int(regs.group(1)) if regs else None,
            int(spill.group(1)) if spill else None,
            int(spill.group(2)) if spill else None, log)


def disassemble(cubin: Path) -> str:
    proc = subprocess.run([tools()["cuobjdump"], "-sass", str(cubin)], capture_output=True, text=True,
                          timeout=300)
    if proc.returncode != 0:
        raise BuildError(f"cuobjdump failed on {cubin.name}: {proc.stderr.strip()[:200]}")
    return proc.stdout


# "        /*0e80*/      @!P0 QGMMA.64x16x32.F32.E4M3.E4M3 R24, ..." -> "QGMMA.64x16x32.F32.E4M3.E4M3"
_MNEMONIC = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)",
                       re.M)


def mnemonics(sass: str) -> list[str]:
    """Instruction mnemonics (with modifiers, without predicates or operands) in program order."""
    return _MNEMONIC.findall(sass)


def warp_partitions(ttgir: str, default_warps: int | None = None) -> dict[str, dict[str, Any]]:
    """Regions of the `ttg.warp_specialize` op: name -> {warps, ops} (ops: tma_load, mma, store).

    The default region runs on the kernel's own warps (`default_warps`); the others say theirs.
    """
    lines = ttgir.splitlines()
    start = next((i for i, line in enumerate(lines) if "ttg.warp_specialize(" in line), None)
    if start is None:
        return {}
    parts: dict[str, dict[str, Any]] = {}
    depth = 0
    current = ""
    for line in lines[start + 1:]:
        stripped = line.strip()
        if depth == 0:  # between regions: the next one starts or the op has ended
            header = re.match(r"^(default|partition\d+)\b", stripped)
            if header is None:
                break
            current = header.group(1)
            warps = re.search(r"num_warps\((\d+)\)", stripped)
            parts[current] = {"warps": int(warps.group(1)) if warps else default_warps, "ops": []}
        else:
            ops = parts[current]["ops"]
            for kind, pattern in (("tma_load", "async_tma_copy_global_to_local"),
                                  ("mma", r"warp_group_dot |tc_gen5_mma "),
                                  ("store", r"tt\.store ")):
                if re.search(pattern, stripped) and kind not in ops:
                    ops.append(kind)
        depth += stripped.count("{") - stripped.count("}")
        if depth == 0 and stripped.startswith("} :"):
            break
    return parts


def check_kernel(plugin: str, variant: Variant, arch: ArchSpec, compiled: Any, out: Path,
                 rel: Path) -> KernelCheck:
    """Write the variant's files under out/rel and check them."""
    stem = f"{variant.kernel.name.strip('_')}_{variant.tag}"
    cubin = out / rel / f"{stem}.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    (out / rel / f"{stem}.ptx").write_text(compiled.asm["ptx"])
    (out / rel / f"{stem}.ttgir").write_text(compiled.asm["ttgir"])
    sass = disassemble(cubin)
    (out / rel / f"{stem}.sass").write_text(sass)
    regs, spill_st, spill_ld, _ = ptxas_usage(compiled.asm["ptx"], arch)
    ops = mnemonics(sass)
    mma = sorted({op for op in ops if re.fullmatch(arch.mma_pattern + r"(\..*)?", op)})
    local = sorted({op for op in ops if re.match(r"(LDL|STL)(\.|$)", op)})

    problems: list[str] = []
    if variant.needs_mma and not mma:
        problems.append(f"no FP8 tensor-core instruction matching /{arch.mma_pattern}/ in the SASS")
    if local:
        problems.append(f"local-memory traffic in the SASS: {', '.join(local)}")
    if spill_st or spill_ld:
        problems.append(f"ptxas reports spills: {spill_st} bytes stored, {spill_ld} bytes loaded")
    if spill_st is None:
        problems.append("ptxas -v printed no spill report")

    extra: dict[str, Any] = {"shared_bytes": compiled.metadata.shared,
                             "num_warps": compiled.metadata.num_warps}
    if variant.warp_specialized:
        parts = warp_partitions(compiled.asm["ttgir"], arch.num_warps)
        extra["partitions"] = parts
        extra["tma_loads"] = sum(op.startswith("UTMALDG") for op in ops)
        extra["setmaxnreg"] = sum(op.startswith("USETMAXREG") for op in ops)
        producers = {p for p, d in parts.items() if "tma_load" in d["ops"]}
        consumers = {p for p, d in parts.items() if "mma" in d["ops"]}
        if not parts:
            problems.append("Triton did not warp-specialize the K loop (no ttg.warp_specialize)")
        elif not producers or not consumers or producers & consumers:
            problems.append(f"partitions are not split into TMA producers and MMA consumers: {parts}")
        if not extra["tma_loads"]:
            problems.append("no TMA load (UTMALDG) in the SASS")
    return KernelCheck(plugin=plugin, arch=arch.name, variant=variant.tag, kernel=variant.kernel.name,
                       cubin=str(rel / cubin.name), registers=regs, spill_stores=spill_st,
                       spill_loads=spill_ld, mma=mma, local_memory_ops=local, extra=extra,
                       problems=problems)


def build(plugin: str, out_dir: str | Path, archs: Iterable[ArchSpec], variants_for: Any,
          progress: Progress | None = None) -> AotReport:
    """Compile `variants_for(arch)` for each arch into out_dir/<arch>/, check each kernel.

    Files: out_dir/<arch>/<kernel>_<variant>.{cubin,ptx,ttgir,sass} and out_dir/aot_report.json.
    Everything is written into a temporary directory first and moved into out_dir only when all
    compiled; a compile error is a BuildError naming the kernel and arch. Failed SASS checks are
    reported, not raised (the caller decides; see AotReport.ok).
    """
    out_root = Path(out_dir)
    out_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".aot-", dir=out_root))
    report = AotReport(plugin=plugin, out_dir=str(out_root), tools=tools())
    progress = progress or Progress()
    jobs = [(arch, v) for arch in archs for v in variants_for(arch)]
    try:
        with progress.task(f"AOT build {plugin}", total=len(jobs)) as bar:
            for arch, variant in jobs:
                rel = Path(arch.name)
                (tmp / rel).mkdir(exist_ok=True)
                try:
                    compiled = compile_variant(variant, arch)
                except Exception as exc:  # triton raises several types; name the kernel and arch
                    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                    raise BuildError(f"{plugin}: compiling {variant.kernel.name} ({variant.tag}) for "
                                     f"{arch.name} failed: {first}") from exc
                report.kernels.append(check_kernel(plugin, variant, arch, compiled, tmp, rel))
                bar.advance(1)
        (tmp / "aot_report.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        for item in sorted(tmp.iterdir()):
            target = out_root / item.name
            if target.is_dir():
                shutil.rmtree(target)
            item.replace(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report
