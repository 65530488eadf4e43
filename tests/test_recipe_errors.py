"""Bad recipes: each exits 2 with one line naming the field (and the file), never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trtbuild.cli import main

GOOD = "name: t\nmodel:\n  source: tiny\n"

# (id, files {name: text}, extra CLI args, substrings the one-line message must contain)
CASES: list[tuple[str, dict[str, str], list[str], list[str]]] = [
    ("unknown-top-key", {"r.yaml": "name: t\nmodle:\n  source: tiny\n"}, [], ["modle", "did you mean 'model'", "r.yaml:2"]),
    ("unknown-nested-key", {"r.yaml": "name: t\nmodel:\n  sorce: tiny\n"}, [], ["model.sorce", "did you mean 'source'", ":3"]),
    ("wrong-type-bool", {"r.yaml": "name: t\nmodel:\n  trust_remote_code: maybe\n"}, [], ["model.trust_remote_code", "maybe"]),
    ("bad-literal", {"r.yaml": "name: t\nmodel:\n  source: s3\n"}, [], ["model.source", "'tiny'"]),
    ("missing-recipe-file", {}, [], ["r.yaml", "not found"]),
    ("extends-cycle", {"r.yaml": "extends: b.yaml\n" + GOOD, "b.yaml": "extends: r.yaml\nname: b\n"}, [], ["extends", "cycle"]),
    ("extends-missing", {"r.yaml": "extends: nope.yaml\n" + GOOD}, [], ["extends", "nope.yaml", "not found"]),
    ("extends-wrong-type", {"r.yaml": "extends: 5\n" + GOOD}, [], ["extends", "path"]),
    ("set-into-scalar", {"r.yaml": GOOD}, ["--set", "model.source.x=1"], ["model.source", "not a section"]),
    ("set-unknown-key", {"r.yaml": GOOD}, ["--set", "model.sorce=tiny"], ["--set model.sorce=tiny", "did you mean 'source'"]),
    ("set-no-equals", {"r.yaml": GOOD}, ["--set", "model.source"], ["KEY=VALUE"]),
    ("set-bad-path", {"r.yaml": GOOD}, ["--set", "model..source=tiny"], ["dotted key path"]),
    ("not-yaml", {"r.yaml": "name: t\nmodel: [unclosed\n"}, [], ["not valid YAML", "r.yaml"]),
    ("empty-file", {"r.yaml": ""}, [], ["empty"]),
    ("top-level-list", {"r.yaml": "- a\n- b\n"}, [], ["mapping"]),
    ("duplicate-key", {"r.yaml": "name: t\nname: u\nmodel: {}\n"}, [], ["twice", ":2"]),
    ("env-missing", {"r.yaml": "name: ${env:TRTBUILD_SURELY_UNSET}\nmodel: {}\n"}, [], ["TRTBUILD_SURELY_UNSET", "name"]),
    ("bad-interpolation", {"r.yaml": "name: ${foo}\nmodel: {}\n"}, [], ["interpolation", "name"]),
    ("path-without-path", {"r.yaml": "name: t\nmodel:\n  source: path\n"}, [], ["model", "path"]),
    ("path-not-a-dir", {"r.yaml": "name: t\nmodel:\n  source: path\n  path: ./no-such-model\n"}, [], ["model.path", "not found"]),
    ("path-no-safetensors", {"r.yaml": "name: t\nmodel:\n  source: path\n  path: m\n", "m/config.json": "{}",
                             "m/pytorch_model.bin": "x"}, [], ["model.path", "safetensors"]),
    ("path-remote-code", {"r.yaml": "name: t\nmodel:\n  source: path\n  path: m\n",
                          "m/config.json": '{"auto_map": {"AutoModel": "x.Y"}}', "m/model.safetensors": ""},
     [], ["trust_remote_code"]),
    ("hub-without-repo", {"r.yaml": "name: t\nmodel:\n  source: hub\n"}, [], ["repo_id"]),
    ("hub-not-cached", {"r.yaml": "name: t\nmodel:\n  source: hub\n  repo_id: nobody/nothing-here\n"}, [],
     ["model.repo_id", "nobody/nothing-here", "local HF cache"]),
    ("name-missing", {"r.yaml": "model:\n  source: tiny\n"}, [], ["name", "missing"]),
    ("name-wrong-type", {"r.yaml": "name: [a, b]\nmodel: {}\n"}, [], ["name"]),
    ("archs-not-a-list", {"r.yaml": GOOD + "gpu_archs: sm_90a\n"}, [], ["gpu_archs"]),
    ("archs-unknown", {"r.yaml": GOOD + "gpu_archs: [sm_42]\n"}, [], ["gpu_archs", "sm_42"]),
    ("non-string-key", {"r.yaml": GOOD + "1: x\n"}, [], ["keys must be strings"]),
    ("recipe-is-directory", {"r.yaml/x": ""}, [], ["r.yaml"]),
    ("binary-file", {"r.yaml": "\udcff\udcfe"}, [], ["r.yaml"]),
    ("tiny-unknown-field", {"r.yaml": "name: t\nmodel:\n  tiny:\n    layerz: 3\n"}, [], ["model.tiny.layerz"]),
]


def _write(tmp_path: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode("utf-8", "surrogateescape"))


@pytest.mark.parametrize("case_id,files,args,expected", CASES, ids=[c[0] for c in CASES])
def test_bad_recipe_is_one_line_exit_2(tmp_path, monkeypatch, capsys, case_id, files, args, expected):
    _write(tmp_path, files)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", "r.yaml", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for fragment in expected:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"


def test_cases_are_distinct():
    assert len({c[0] for c in CASES}) == len(CASES) >= 25


def test_subprocess_has_no_traceback(tmp_path):
    (tmp_path / "r.yaml").write_text("name: t\nmodel:\n  sorce: tiny\n")
    proc = subprocess.run([sys.executable, "-m", "trtbuild.cli", "plan", "r.yaml"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "model.sorce" in proc.stderr


def test_good_recipe_validates(tmp_path, capsys):
    (tmp_path / "r.yaml").write_text(GOOD)
    main(["validate", str(tmp_path / "r.yaml")])
    assert "ok" in capsys.readouterr().out
