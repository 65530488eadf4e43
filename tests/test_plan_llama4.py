"""`plan` describes the tiny Llama 4 rehearsal and the Maverick recipe with the same structure line:
the same layer kinds by the same rules, only the sizes differ."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trtbuild.app.target_structure import llama4_structure
from trtbuild.cli import main

RECIPES = Path(__file__).resolve().parent.parent / "recipes"


def _plan(recipe: str) -> None:
    try:
        main(["plan", str(RECIPES / recipe), "--json"])
    except SystemExit as exc:
        assert exc.code in (0, None)


def _structure(recipe: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
               tmp_path: Path) -> str:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-hub"))  # Maverick's weights absent: its stand-in
    capsys.readouterr()
    _plan(recipe)
    notes = json.loads(capsys.readouterr().out)["notes"]
    lines = [n for n in notes if n.startswith("Llama 4 structure:")]
    assert len(lines) == 1, notes
    return lines[0]


def test_tiny_llama4_and_maverick_plan_the_same_structure(capsys, monkeypatch, tmp_path) -> None:
    tiny = _structure("tiny-llama4-cpu.yaml", capsys, monkeypatch, tmp_path)
    maverick = _structure("llama-4-maverick-fp8-eagle3-tp8.yaml", capsys, monkeypatch, tmp_path)
    assert "every 2: 1, 3, 5, 7" in tiny and "every 2: 1, 3, 5, ..., 45, 47" in maverick
    assert "every 4: 3, 7)" in tiny and "every 4: 3, 7, 11, ..., 43, 47)" in maverick

    def shape(line: str) -> str:  # the sentence with every number and elided list taken out
        return re.sub(r"\d+(, \d+)*(, \.\.\.(, \d+)*)?", "N", line)

    assert shape(tiny) == shape(maverick)
    assert "top-N sigmoid router" in shape(tiny) and "qk-norm off" in tiny and "temperature tuning on" in tiny


def test_no_structure_line_for_a_dense_llama(capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-hub"))
    capsys.readouterr()
    _plan("tiny-cpu.yaml")
    assert not [n for n in json.loads(capsys.readouterr().out)["notes"] if n.startswith("Llama 4")]
    assert llama4_structure({"model_type": "llama", "num_hidden_layers": 2}) is None
