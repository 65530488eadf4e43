"""The quantize section's schema and its cache-key material."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from trtbuild.quantize.stage import QuantizeConfig, QuantizeStage


def test_defaults() -> None:
    config = QuantizeConfig()
    assert (config.format, config.kv_cache, config.export) == ("fp8", "fp8", "hf")
    assert config.exclude == ["lm_head"]
    assert config.gate.max_perplexity_ratio == 1.06
    assert config.calibration.dataset.kind == config.gate.eval_dataset.kind == "pydoc"


def test_dataset_shorthands_and_errors() -> None:
    config = QuantizeConfig.model_validate({"calibration": {"dataset": "data/cal.jsonl"},
                                            "gate": {"eval_dataset": {"hf": "org/set", "split": "test"}}})
    assert config.calibration.dataset.path == "data/cal.jsonl"
    assert (config.gate.eval_dataset.hf, config.gate.eval_dataset.split) == ("org/set", "test")
    for bad in ({"format": "int4"}, {"kv_cache": "int8"}, {"export": "onnx"}, {"exclude": [""]},
                {"calibration": {"num_samples": 0}}, {"gate": {"max_perplexity_ratio": 0}},
                {"calibration": {"dataset": "notes.csv"}}, {"gate": {"typo": 1}}):
        with pytest.raises(ValidationError):
            QuantizeConfig.model_validate(bad)


def test_every_field_is_documented() -> None:
    def walk(model: type) -> None:
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name}"
            annotation = field.annotation
            if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
                walk(annotation)

    walk(QuantizeConfig)


def test_key_material_follows_file_contents(tmp_path: Path) -> None:
    (tmp_path / "cal.txt").write_text("one")
    recipe = SimpleNamespace(base_dir=tmp_path)
    config = QuantizeConfig.model_validate({"calibration": {"dataset": "cal.txt"}})
    first = QuantizeStage().key_material(config, recipe)
    (tmp_path / "cal.txt").write_text("two")
    assert QuantizeStage().key_material(config, recipe) != first


def test_legacy_export_is_a_clear_error() -> None:
    """trtllm_checkpoint fed only the removed TensorRT-engine backend: refused with the fix."""
    with pytest.raises(ValidationError, match="TensorRT-engine backend.*use export: hf"):
        QuantizeConfig.model_validate({"export": "trtllm_checkpoint"})
