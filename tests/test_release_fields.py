"""Fields a release's contract does not confirm at the release itself are never written for it.

The 1.1.0 contract withholds kv_cache_config.tokens_per_block, kv_cache_config.dtype and
speculative_config.eagle3_layers_to_capture (seen only in upstream snapshots from after release/1.1
branched, absent from the older snapshot: contract `llm_args.not_at_release`). A recipe that needs one is
refused in one line naming the recipe setting, the options field and the release; 1.2.1 writes them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtbuild.app.recipe import load_recipe
from trtbuild.core.contract import available_versions, load_contract
from trtbuild.core.contract import validate as cv
from trtbuild.core.errors import UserError
from trtbuild.engine.bundle import build_options, default_layers_to_capture
from trtbuild.engine.checks import has_draft
from trtbuild.engine.facts import target_facts
from trtbuild.engine.release_fields import withheld

ROOT = Path(__file__).resolve().parents[1]
RECIPE_8B = ROOT / "recipes" / "llama-3.1-8b-instruct-fp8-eagle3.yaml"


def _recipe(version: str, *sets: str):  # type: ignore[no-untyped-def]
    image = load_contract(version).section("release").get("triton_image") or "registry.example/trtllm:main"
    return load_recipe(RECIPE_8B, [f"engine.trtllm_version={version}", f"deploy.trtllm.image={image}", *sets])


def _options(recipe, draft: Path | None = None) -> dict:  # type: ignore[no-untyped-def]
    contract = load_contract(recipe.engine.trtllm_version)
    return build_options(recipe.engine, recipe, target_facts(recipe), draft, with_draft=has_draft(recipe),
                         contract=contract).to_dict()


def _flat(options: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in options.items():
        keys.add(prefix + key)
        if isinstance(value, dict):
            keys |= _flat(value, prefix + key + ".")
    return keys


def test_every_withheld_field_is_one_the_release_contract_lacks() -> None:
    for version in available_versions():
        contract = load_contract(version)
        llm = contract.section("llm_args")
        for field in withheld(contract):
            head, _, tail = field.partition(".")
            if head == "speculative_config":
                assert tail not in contract.section("speculative")["decoding_types"]["Eagle"]["fields"]
            elif tail:
                assert tail not in llm["sections"][head], (version, field)
            else:
                assert head not in llm["fields"], (version, field)
        # The source the withholding cites is declared (path@commit or a pull request).
        if "not_at_release" in llm:
            assert llm.get("not_at_release_source") in contract.sources
    assert set(withheld(load_contract("1.1.0"))) == {
        "kv_cache_config.tokens_per_block", "kv_cache_config.dtype", "speculative_config.eagle3_layers_to_capture"}
    assert withheld(load_contract("1.2.1")) == {}


@pytest.mark.parametrize(("setting", "value", "field"), [
    ("engine.kv_cache.tokens_per_block", "64", "kv_cache_config.tokens_per_block"),
    ("engine.kv_cache.dtype", "fp8", "kv_cache_config.dtype"),
])
def test_a_recipe_needing_a_withheld_field_is_refused_in_one_line(setting: str, value: str, field: str) -> None:
    with pytest.raises(UserError) as err:
        _options(_recipe("1.1.0", f"{setting}={value}"))
    line = err.value.one_line()
    assert "\n" not in line and line.startswith(setting + ":")
    assert field in line and "TensorRT-LLM 1.1.0" in line and "fcd3f316" in line
    assert err.value.exit_code == 2
    # 1.2.1 writes it, and its contract accepts what was written.
    options = _options(_recipe("1.2.1", f"{setting}={value}"))
    section, key = field.split(".")
    assert str(options[section][key]) == value
    assert cv.check_llm_args(options, load_contract("1.2.1")) == []


def test_the_1_1_0_bundle_writes_only_what_its_contract_has() -> None:
    """The 8B recipe at its defaults for 1.1.0: nothing withheld is written, and the contract accepts it."""
    contract = load_contract("1.1.0")
    options = _options(_recipe("1.1.0"))
    assert not _flat(options) & set(withheld(contract))
    assert cv.check_llm_args(options, contract) == []


def test_a_draft_on_non_default_layers_is_refused_for_1_1_0(tmp_path: Path) -> None:
    recipe = _recipe("1.1.0")
    layers = target_facts(recipe).num_hidden_layers
    default = default_layers_to_capture(layers)
    other = sorted({0, *default[1:]})
    assert other != default
    (tmp_path / "config.json").write_text(json.dumps({"eagle_config": {"eagle_aux_hidden_state_layer_ids": other}}))
    with pytest.raises(UserError) as err:
        _options(recipe, tmp_path)
    line = err.value.one_line()
    assert "speculative_config.eagle3_layers_to_capture" in line and "TensorRT-LLM 1.1.0" in line
    # The default layers need no field: the 1.1.0 bundle is written without it.
    (tmp_path / "config.json").write_text(json.dumps({"eagle_config": {"eagle_aux_hidden_state_layer_ids": default}}))
    assert "eagle3_layers_to_capture" not in _options(recipe, tmp_path)["speculative_config"]
    # 1.2.1 writes the trained layers.
    spec = _options(_recipe("1.2.1"), tmp_path.parent / tmp_path.name)["speculative_config"]
    assert "eagle3_layers_to_capture" not in spec
    (tmp_path / "config.json").write_text(json.dumps({"eagle_config": {"eagle_aux_hidden_state_layer_ids": other}}))
    assert _options(_recipe("1.2.1"), tmp_path)["speculative_config"]["eagle3_layers_to_capture"] == other


def test_the_release_tags_are_recorded_with_why_they_were_not_read() -> None:
    tags = {"1.1.0": "48b7b5d8b7ed1e6bff57aecc6ff7d1533288bed8", "1.2.1": "ca88df0a400515b8206a19eb30cd047eb7661035"}
    for version, commit in tags.items():
        contract = load_contract(version)
        assert commit in contract.sources["release_tag"] and "not at that commit" in contract.sources["release_tag"]
        assert commit in contract.sources["backend_release"]
