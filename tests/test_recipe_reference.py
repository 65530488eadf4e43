"""The committed recipe reference is generated from the schema and lists every field."""

from __future__ import annotations

from pathlib import Path

from trtbuild.app.recipe import Recipe
from trtbuild.app.reference_doc import iter_fields, render

DOC = Path(__file__).resolve().parent.parent / "docs" / "recipe-reference.md"


def test_reference_is_up_to_date():
    assert DOC.read_text() == render(Recipe), "run: trtbuild schema --markdown > docs/recipe-reference.md"


def test_reference_lists_every_field():
    text = DOC.read_text()
    paths = [path for path, _ in iter_fields(Recipe)]
    assert len(paths) > 10
    missing = [p for p in paths if f"| `{p}` |" not in text]
    assert not missing


def test_every_field_has_a_description():
    undocumented = [p for p, f in iter_fields(Recipe) if not (f.description or "").strip()]
    assert not undocumented, undocumented
