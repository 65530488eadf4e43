"""The plugin kernels compile, with FP8 tensor-core MMAs and no spills, under the Triton of each Triton
TRT-LLM image a release contract names (the server JIT-compiles them with that Triton, not ours).

Each version is installed once (pip --no-deps --target, the upstream wheel the image's pytorch_triton
build is cut from) into pytest's cache directory; scripts/aot_check_triton.py then runs with it first on
sys.path. Without network the install fails and the test says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trtbuild.core.contract import available_versions, load_contract

ROOT = Path(__file__).resolve().parent.parent


def container_tritons() -> dict[str, list[str]]:
    """Upstream triton version -> the releases whose image ships a pytorch_triton built from it."""
    found: dict[str, list[str]] = {}
    for version in available_versions():
        pinned = load_contract(version).section("release").get("triton_python")
        if pinned:
            found.setdefault(str(pinned).split("+")[0], []).append(version)
    return found


def test_every_supported_image_names_its_triton() -> None:
    assert container_tritons() == {"3.4.0": ["1.1.0"], "3.5.1": ["1.2.1"]}


@pytest.mark.slow
@pytest.mark.parametrize("triton_version", sorted(container_tritons()))
def test_kernels_compile_with_the_images_triton(triton_version: str, request: pytest.FixtureRequest) -> None:
    target = Path(request.config.cache.mkdir(f"triton-{triton_version}"))
    if not (target / "triton").is_dir():
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                               f"triton=={triton_version}"], capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"installing triton {triton_version}: {done.stderr[-1500:]}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), str(ROOT)]),
               TRITON_CACHE_DIR=str(target.parent / f"triton-{triton_version}-kernel-cache"))
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "aot_check_triton.py")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    report = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {}
    assert done.returncode == 0 and report.get("ok"), (done.stderr[-2000:], report)
    assert report["triton"] == triton_version
    for plugin in ("spatial_partition", "gemm_weight_shuffle"):
        kernels = report["plugins"][plugin]["kernels"]
        assert {k["arch"] for k in kernels} == {"sm_90a", "sm_100a"}
        gemms = [k for k in kernels if k["variant"] != "reduce"]
        assert gemms and all(k["mma"] and k["spill_bytes"] == 0 and not k["local_memory_ops"] for k in gemms)
