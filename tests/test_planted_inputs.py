"""Issue 13, findings 3 and 4: a planted shell payload and a planted secret in a recipe are inert and
absent from every artifact. The launch scripts are run for real in bash, with stand-ins for the
commands they start (trtllm-serve, mpirun, srun, docker, ...) that record the argv they were handed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from deploy_fixtures import build_deploy, build_engine, make_recipe, write_sources

from trtbuild.app.recipe import load_recipe

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="bash not installed")
TOKEN = "hf_PLANTEDsecret0123456789abcdef"
STAND_INS = ("trtllm-serve", "trtllm-llmapi-launch", "mpirun", "srun", "docker", "cp", "rm")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_sources(tmp_path_factory.mktemp("planted") / "sources")


def _stand_ins(root: Path) -> Path:
    """Commands that append their argv (one JSON list per call) and HF_TOKEN to calls.jsonl."""
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for name in STAND_INS:
        script = bin_dir / name
        script.write_text("#!/usr/bin/env python3\nimport json, os, sys\n"
                          f"with open({str(root / 'calls.jsonl')!r}, 'a') as f:\n"
                          "    f.write(json.dumps({'argv': sys.argv, 'HF_TOKEN': os.environ.get('HF_TOKEN')}) + '\\n')\n")
        script.chmod(0o755)
    return bin_dir


def _run(script: Path, root: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    path = f"{root / 'bin'}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run([BASH, str(script)], cwd=script.parent, capture_output=True, text=True,
                          env={**os.environ, **env, "PATH": path, "TRTBUILD_HOSTFILE": "hosts"}, timeout=60)


def _calls(root: Path) -> list[dict]:
    file = root / "calls.jsonl"
    return [json.loads(line) for line in file.read_text().splitlines()] if file.is_file() else []


def test_planted_shell_payload_is_data(tmp_path: Path, sources: dict[str, Path]) -> None:
    marker = tmp_path / "PWNED"
    payload = f"$(touch {marker})`touch {marker}`"
    engine = {"env": {"X_PAYLOAD": f"a'b\"c{payload}"},
              "launcher": {"container_image": f"img{payload}".replace(" ", "_"),
                           "container_mounts": [f"/data{payload}:/data".replace(" ", "_")],
                           "slurm": {"job_name": "job"}}}
    deploy = {"target": "trtllm", "trtllm": {"image": f"img{payload}".replace(" ", "_"),
                                             "bundle_mount": f"/b{payload}".replace(" ", "_"),
                                             "all_models_dir": f"/m{payload}".replace(" ", "_")}}
    recipe = make_recipe(tmp_path, engine=engine, draft=False, deploy=deploy)
    bundle = build_engine(tmp_path, sources, recipe) / "bundle"
    deploy_dir, _ = build_deploy(tmp_path, bundle.parent, recipe)
    _stand_ins(tmp_path)
    scripts = [bundle / "launch" / n for n in ("serve.sh", "mpirun.sh", "slurm.sbatch")]
    scripts += [deploy_dir / "launch" / n for n in ("triton_trtllm.sh", "start_in_container.sh")]
    for script in scripts:
        _run(script, tmp_path, {})
    assert not marker.exists(), "a recipe value ran as shell code"
    calls = _calls(tmp_path)
    assert {Path(c["argv"][0]).name for c in calls} >= {"trtllm-serve", "mpirun", "srun", "docker"}
    argv = [a for call in calls for a in call["argv"]]
    joined = "\n".join(argv)
    # The values arrived as the literal text the recipe wrote.
    assert f"--container-image=img{payload}".replace(" ", "_") in joined or f"img{payload}".replace(" ", "_") in argv
    assert any(a.startswith("/data$(touch") for a in joined.replace(",", "\n").split("\n"))
    assert f"/b{payload}".replace(" ", "_") in joined


def test_planted_secret_is_a_reference_everywhere(tmp_path: Path, sources: dict[str, Path],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from trtbuild.app import pipeline
    from trtbuild.core.cache import ArtifactCache

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    recipe_file = tmp_path / "r.yaml"
    recipe_file.write_text("name: secret\nmodel: {source: tiny}\nengine:\n  env:\n"
                           "    HF_TOKEN: ${env:HF_TOKEN}\n    AUTH: 'Bearer ${env:HF_TOKEN}'\n"
                           "    LEVEL: ${env:TRTBUILD_UNSET_LEVEL:-in fo}\n")
    loaded = load_recipe(recipe_file)
    assert loaded.engine.env["HF_TOKEN"] == "${env:HF_TOKEN}"
    steps = pipeline.plan(loaded, ArtifactCache())
    keys = json.dumps([s.components for s in steps]) + json.dumps(pipeline.report(loaded, steps, executed=False))
    assert TOKEN not in keys  # the cache key and the plan hold the reference only

    recipe = make_recipe(tmp_path, engine={"env": dict(loaded.engine.env)}, deploy={"target": ["trtllm", "local"]})
    engine_dir = build_engine(tmp_path, sources, recipe)
    deploy_dir, result = build_deploy(tmp_path, engine_dir, recipe)
    assert TOKEN not in json.dumps([result.metrics, result.info], default=str)
    written = [p for root in (engine_dir, deploy_dir) for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    assert len(written) > 10
    assert [p for p in written if TOKEN.encode() in p.read_bytes()] == []

    _stand_ins(tmp_path)
    done = _run(engine_dir / "bundle" / "launch" / "serve.sh", tmp_path, {})
    assert done.returncode == 0, done.stderr
    assert _calls(tmp_path)[-1]["HF_TOKEN"] == TOKEN  # resolved from the environment at launch
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    unset = subprocess.run([BASH, str(engine_dir / "bundle" / "launch" / "serve.sh")], capture_output=True,
                           text=True, env={**env, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{env['PATH']}"})
    assert unset.returncode != 0 and "set HF_TOKEN in the environment" in unset.stderr
