"""The exported draft: its names and keys follow the format in shared/REFERENCE.md, and the runtime
loading it drafts exactly what ModelOpt's model (as we train it) drafts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from draft_fixtures import base_token, random_eagle3, runtime_chain, write_target

from trtbuild.core.errors import UserError
from trtbuild.draft.format import default_aux_layers

# The EAGLE-3 draft checkpoint as shared/REFERENCE.md describes it (TRT-LLM's loader).
REFERENCE_CONFIG_KEYS = {"architectures", "draft_vocab_size", "eagle_config", "hidden_size",
                         "num_attention_heads", "num_key_value_heads", "intermediate_size", "rms_norm_eps",
                         "vocab_size", "num_hidden_layers", "rope_theta", "max_position_embeddings"}
REFERENCE_EAGLE_KEYS = {"eagle_aux_hidden_state_layer_ids", "use_aux_hidden_state",
                        "use_input_layernorm_in_first_layer", "use_last_layernorm"}
REFERENCE_TENSORS = {"fc.weight", "norm.weight", "lm_head.weight", "d2t"} | {
    f"midlayer.{name}.weight" for name in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj", "input_layernorm", "hidden_norm", "post_attention_layernorm")}
DRAFT_VOCAB = 256


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A random target, converted by ModelOpt, draft weights randomised (norms far from 1), exported."""
    from trtbuild.draft.export import export_draft

    root = tmp_path_factory.mktemp("export")
    target_dir = write_target(root / "target", num_hidden_layers=6)
    model, chosen = random_eagle3(target_dir, 6, DRAFT_VOCAB)
    model.eval()
    export_draft(model, root / "draft", target_dir=target_dir, dtype="float32")
    return model, target_dir, root / "draft", chosen


def test_names_and_keys_follow_the_reference(converted) -> None:  # type: ignore[no-untyped-def]
    from safetensors import safe_open

    _, _, draft_dir, chosen = converted
    config = json.loads((draft_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert set(config) >= REFERENCE_CONFIG_KEYS, REFERENCE_CONFIG_KEYS - set(config)
    assert set(config["eagle_config"]) >= REFERENCE_EAGLE_KEYS
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == default_aux_layers(6) == [1, 2]
    assert config["draft_vocab_size"] == DRAFT_VOCAB and config["num_hidden_layers"] == 1
    with safe_open(str(draft_dir / "model.safetensors"), framework="pt") as handle:
        names = set(handle.keys())
        fc, d2t = handle.get_tensor("fc.weight"), handle.get_tensor("d2t")
        head = handle.get_tensor("lm_head.weight")
    assert names == REFERENCE_TENSORS
    # ... which is what TensorRT-LLM 1.1.0 (the Triton image's release) and the newest source load.
    from trtbuild.core.contract import available_versions, load_contract
    from trtbuild.core.contract.validate import check_draft_dir

    for version in available_versions():
        assert check_draft_dir(draft_dir, load_contract(version)) == [], version
    assert list(fc.shape) == [64, 2 * 64]  # hidden x (n_aux * hidden)
    assert d2t.dtype == torch.int64 and (torch.arange(DRAFT_VOCAB) + d2t).tolist() == chosen
    assert list(head.shape) == [DRAFT_VOCAB, 64]


def test_config_is_modelopt_template(converted) -> None:  # type: ignore[no-untyped-def]
    """The draft config.json has exactly the keys of ModelOpt 0.47's llama EAGLE template, which
    trtbuild keeps a copy of for ModelOpt 0.37 (no speculative export there): the copy stays equal."""
    from modelopt.torch.export.plugins.hf_spec_configs import llama_eagle_template_config

    from trtbuild.draft.modelopt_compat import DRAFT_CONFIG_TEMPLATE

    assert llama_eagle_template_config == DRAFT_CONFIG_TEMPLATE
    config = json.loads((converted[2] / "config.json").read_text())
    assert set(config) == set(DRAFT_CONFIG_TEMPLATE)
    assert set(config["eagle_config"]) == set(DRAFT_CONFIG_TEMPLATE["eagle_config"])


def test_runtime_drafts_what_modelopt_drafts(converted) -> None:  # type: ignore[no-untyped-def]
    from trtbuild.runtime.draft import load_draft
    from trtbuild.runtime.target import load_target

    model, target_dir, draft_dir, _ = converted
    target = load_target(target_dir)
    steps = 4
    prompts = torch.randint(3, 384, (3, 12), generator=torch.Generator().manual_seed(3))
    expected = [model.pseudo_speculative_generate(p[None], steps=steps) for p in prompts]
    for norm, should_match in (("standard", True), ("modelopt", False)):
        draft = load_draft(draft_dir, target, first_norm=norm)
        got = [runtime_chain(target, draft, p[None], steps) for p in prompts]
        matches = [torch.equal(e[1], g) for e, g in zip(expected, got, strict=True)]
        bases = [base_token(target, p[None]) for p in prompts]
        assert all(torch.equal(e[0], b) for e, b in zip(expected, bases, strict=True))
        assert all(matches) if should_match else not all(matches), (norm, matches)


def test_runtime_refuses_a_draft_for_another_target(converted, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from trtbuild.runtime.draft import load_draft
    from trtbuild.runtime.target import load_target

    _, _, draft_dir, _ = converted
    other = load_target(write_target(tmp_path / "other", num_hidden_layers=2))
    with pytest.raises(UserError, match="eagle_aux_hidden_state_layer_ids"):
        load_draft(draft_dir, other)
