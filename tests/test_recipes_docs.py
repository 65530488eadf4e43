"""The user-facing docs and CI examples stay in step with the code they describe."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
TROUBLESHOOTING = (ROOT / "docs" / "troubleshooting.md").read_text()


def test_troubleshooting_covers_every_engine_check():
    source = (ROOT / "trtbuild" / "engine" / "checks.py").read_text()
    fields = set(re.findall(r'_line\("([A-Za-z0-9_.]+)"', source))
    # The regex finds the checks (quantize.export left with the trtllm_checkpoint export).
    assert {"engine.tensor_parallel", "engine.gemm_plugin", "engine.kv_cache.dtype", "gpu_archs"} <= fields
    assert len(fields) >= 14
    missing = sorted(f for f in fields if f"`{f}`" not in TROUBLESHOOTING)
    assert not missing, f"add these to docs/troubleshooting.md: {missing}"


def test_troubleshooting_covers_every_draft_compatibility_check():
    from trtbuild.draft.compat import CHECKS

    missing = [c for c in CHECKS if f"| `{c}` |" not in TROUBLESHOOTING]
    assert not missing, f"add these to docs/troubleshooting.md: {missing}"


def test_troubleshooting_covers_the_model_and_deploy_preflight():
    sources = [(ROOT / "trtbuild" / name).read_text() for name in ("model/stage.py", "model/source.py", "model/config.py",
                                                                   "deploy/stage.py")]
    fields = {f for text in sources for f in re.findall(r'[\[(]f?"((?:model|deploy)\.[a-z_.]+):', text)}
    assert {"model.path", "model.repo_id", "model.standin_config", "deploy.max_batch_size"} <= fields
    missing = sorted(f for f in fields if f"`{f}`" not in TROUBLESHOOTING)
    assert not missing, f"add these to docs/troubleshooting.md: {missing}"


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", text, re.M)
    assert phony is not None
    return set(phony.group(1).split())


def test_ci_examples_call_existing_make_targets():
    targets = _make_targets()
    assert {"validate", "plan", "build", "deploy", "bench"} <= targets
    for name in ("github-actions.yml", "gitlab-ci.yml"):
        text = (ROOT / "ci" / name).read_text()
        yaml.safe_load(text)  # parses
        called = set(re.findall(r"\bmake ([a-z-]+)", text))
        assert called and called <= targets, f"{name}: {sorted(called - targets)}"
        for recipe in re.findall(r"recipes/[\w.-]+\.yaml", text):
            assert (ROOT / recipe).is_file(), f"{name} names {recipe}"


def test_docs_name_only_shipped_recipes():
    for doc in ("docs/gpu-path.md", "README.md"):
        text = (ROOT / doc).read_text()
        named = set(re.findall(r"recipes/[\w.-]+\.yaml", text))
        assert named, doc
        assert all((ROOT / r).is_file() for r in named), (doc, named)
