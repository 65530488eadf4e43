"""A stage's code version covers every project module it imports, and nothing it does not.

The edits are made in temporary copies, never in the package under test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import trtbuild
from trtbuild.core.code_version import closure, code_version

PACKAGE_DIR = Path(trtbuild.__file__).resolve().parent
REPO = PACKAGE_DIR.parent
STAGES = ("model", "quantize", "draft", "engine", "deploy")


def _copy_package(tmp_path: Path) -> Path:
    shutil.copytree(PACKAGE_DIR, tmp_path / "trtbuild", ignore=shutil.ignore_patterns("__pycache__"))
    # the kernels and the served module the engine stage ships, so the copy imports nothing of an installed tree
    shutil.copytree(PACKAGE_DIR.parent / "plugins", tmp_path / "plugins", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _versions(root: Path) -> dict[str, str]:
    return {s: code_version(f"trtbuild.{s}.stage", root=root) for s in STAGES}


def _edit(root: Path, module_path: str) -> None:
    file = root / module_path
    assert file.is_file(), module_path
    file.write_text(file.read_text() + "\n# an edit\n")


# Each edit and the stages whose own code it is (later stages change only through their inputs' keys).
EDITS = [
    ("trtbuild/draft/modelopt_compat.py", {"draft"}),  # shapes the exported draft
    ("trtbuild/runtime/target.py", {"quantize", "draft"}),  # checks the FP8 export; measures tau
    # writes every launch script (quantize: its calibration ranks' sbatch; draft: its training's)
    ("trtbuild/core/shell.py", {"quantize", "draft", "engine", "deploy"}),
    ("trtbuild/deploy/local_model.py", {"deploy"}),  # copied into the local repository as model.py
    ("trtbuild/serve/front.py", set()),  # serving, not building: no artifact depends on it
    ("trtbuild/serve/openai_api/app.py", set()),
    ("trtbuild/cli/root.py", set()),
    # The GEMM-plugin kernels: the runtime runs them in the quantize export check and the draft's
    # acceptance run (runtime/gemm_plugin.py), and the engine bundle ships them.
    ("plugins/common/layout.py", {"quantize", "draft", "engine"}),
    ("plugins/gemm_weight_shuffle/kernel.py", {"quantize", "draft", "engine"}),  # named by a string
]


@pytest.mark.parametrize(("module_path", "owners"), EDITS, ids=[e[0].removeprefix("trtbuild/") for e in EDITS])
def test_an_edit_changes_exactly_the_stages_that_import_the_module(tmp_path, module_path, owners):
    root = _copy_package(tmp_path)
    before = _versions(root)
    assert before == _versions(REPO)  # the copy hashes like the package: paths are relative to the root
    _edit(root, module_path)
    after = _versions(root)
    assert {s for s in STAGES if after[s] != before[s]} == owners


def test_plan_keys_follow_the_code(tmp_path):
    """End to end: `trtbuild plan` run from the copied package gives new keys from the owning stage on."""
    root = _copy_package(tmp_path / "src")
    recipe = tmp_path / "r.yaml"
    recipe.write_text((REPO / "recipes" / "tiny-cpu.yaml").read_text())

    def keys() -> dict[str, str]:
        env = {**os.environ, "PYTHONPATH": str(root), "TRTBUILD_CACHE": str(tmp_path / "cache")}
        out = subprocess.run([sys.executable, "-m", "trtbuild.cli", "plan", str(recipe), "--json"], env=env,
                             capture_output=True, text=True, timeout=120, check=True, cwd=tmp_path).stdout
        stages = json.loads(out)["stages"]
        assert all(s["key"] for s in stages)
        return {s["name"]: s["key"] for s in stages}

    first = keys()
    _edit(root, "trtbuild/serve/front.py")
    assert keys() == first
    _edit(root, "trtbuild/core/shell.py")
    after = keys()
    assert [s for s in STAGES if after[s] != first[s]] == ["quantize", "draft", "engine", "deploy"]  # the sbatch scripts


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


# One module reached by each way a module can be reached; `unrelated` is reached by none.
TOY = {
    "pkg/__init__.py": "",
    "pkg/stage.py": (
        "from pkg.top import VALUE\n"
        "from . import relative\n"
        "from pkg import sub_by_from\n"
        "LAZY = {'name': 'pkg.lazy'}\n"
        "SOURCE = 'copied.py'\n"
        "def run():\n"
        "    import pkg.inside_function\n"
        "    from .sub import parent_relative\n"
        "    return VALUE\n"
    ),
    "pkg/top.py": "from pkg.deep import chain\nimport pkg.other.mod\nVALUE = 1\n",
    "pkg/deep/__init__.py": "",
    "pkg/deep/chain.py": "from ..leaf import x\n",  # a second hop, relative two levels up
    "pkg/leaf.py": "x = 1\n",
    "pkg/other/__init__.py": "",  # runs, but only `pkg.other.mod` is named: a package is reached when named
    "pkg/other/mod.py": "",
    "pkg/relative.py": "",
    "pkg/sub_by_from.py": "",
    "pkg/lazy.py": "",
    "pkg/copied.py": "import pkg.only_from_copied\n",
    "pkg/only_from_copied.py": "",
    "pkg/inside_function.py": "",
    "pkg/sub/__init__.py": "",
    "pkg/sub/parent_relative.py": "",
    "pkg/unrelated.py": "from pkg import stage\n",  # importing the stage does not make it part of it
}
REACHED = ["pkg", "pkg.copied", "pkg.deep", "pkg.deep.chain", "pkg.inside_function", "pkg.lazy", "pkg.leaf",
           "pkg.other.mod", "pkg.relative", "pkg.stage", "pkg.sub", "pkg.sub.parent_relative", "pkg.sub_by_from",
           "pkg.top"]


def test_every_import_form_is_followed(tmp_path):
    _write(tmp_path, TOY)
    assert closure("pkg.stage", root=tmp_path, package="pkg") == REACHED
    base = code_version("pkg.stage", root=tmp_path, package="pkg")
    for name in REACHED:
        file = tmp_path / (name.replace(".", "/") + ".py")
        if not file.is_file():
            file = tmp_path / name.replace(".", "/") / "__init__.py"
        original = file.read_text()
        file.write_text(original + "\n# edited\n")
        assert code_version("pkg.stage", root=tmp_path, package="pkg") != base, f"{name} is left out"
        file.write_text(original)
        os.utime(file, ns=(0, 0))  # same bytes as before, and a new stat: the version is of the bytes
        assert code_version("pkg.stage", root=tmp_path, package="pkg") == base
    for name in ("unrelated", "only_from_copied", "other/__init__"):
        _edit(tmp_path, f"pkg/{name}.py")
        assert code_version("pkg.stage", root=tmp_path, package="pkg") == base, name


# Run in a fresh interpreter: wraps every stage's `run`, builds, and prints per stage the trtbuild
# modules first imported while it ran.
_DRIVER = """
import json, sys
from trtbuild.app.stages import all_stages
loaded = {}
for stage in all_stages():
    cls = type(stage)
    def run(self, config, ctx, _run=cls.run):
        before = set(sys.modules)
        try:
            return _run(self, config, ctx)
        finally:
            loaded[self.name] = sorted(m for m in set(sys.modules) - before if m.split('.')[0] == 'trtbuild')
    cls.run = run
from trtbuild.cli import main
try:
    main(['build', sys.argv[1]])
finally:
    print('LOADED ' + json.dumps(loaded))
"""

SMALL_PIPELINE = """
quantize:
  kv_cache: none
  calibration: {num_samples: 8, seq_len: 32, batch_size: 4}
  gate: {max_perplexity_ratio: 1.5, eval_samples: 4, seq_len: 32}
draft:
  source: ngram
  max_draft_len: 3
  eval: {prompts: 2, prompt_len: 16, new_tokens: 8}
engine: {}
deploy: {target: [local, trtllm]}
"""


@pytest.mark.slow
def test_every_module_a_stage_imports_while_it_runs_is_in_its_code_version(tmp_path):
    """What a real build imports, stage by stage, against the closure its key hashes."""
    from quantize_fixtures import make_model_dir

    model_dir = make_model_dir(tmp_path / "model", train_steps=5) / "hf"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: closure\noutput_dir: out\nmodel:\n  source: path\n  path: {model_dir}\n"
                      + SMALL_PIPELINE)
    env = {**os.environ, "TRTBUILD_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", _DRIVER, str(recipe)], env=env, capture_output=True, text=True,
                          timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("LOADED "))
    loaded = json.loads(line.removeprefix("LOADED "))
    assert sorted(loaded) == sorted(STAGES)
    # the walk sees what a stage imports lazily: the draft stage's n-gram measurement loads the runtime
    assert "trtbuild.runtime.generate" in loaded["draft"], loaded
    for stage, modules in loaded.items():
        missing = sorted(set(modules) - set(closure(f"trtbuild.{stage}.stage")))
        assert not missing, f"{stage} imported {missing} while it ran, and its code version leaves them out"
