"""The runtime's EAGLE-3 draft reads ModelOpt's export and computes what ModelOpt's module computes."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from runtime_fixtures import eagle_module_model, export_draft, one_thread  # noqa: F401

from trtbuild.core.errors import UserError
from trtbuild.runtime import load_draft, load_target
from trtbuild.runtime.devmodels import random_llama
from trtbuild.runtime.layers import prepare_mask
from trtbuild.runtime.target import attention_block, mlp_block

DRAFT_VOCAB = 128

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("draft")
    random_llama(root / "target", layers=4)
    model = eagle_module_model(root / "target", draft_vocab=DRAFT_VOCAB)
    export_draft(model, root / "eagle3")
    return root, model


def runtime_chain(target, draft, prompt: torch.Tensor, steps: int) -> tuple[int, list[int]]:
    """Greedy chain drafting by hand: target prefill, then `steps` draft steps."""
    n = prompt.numel()
    with torch.inference_mode():
        tcache, dcache = target.new_cache(1, n + 1), draft.new_cache(1, n + steps)
        logits, aux = target.forward(prompt.view(1, -1), tcache, 0, aux_layers=draft.aux_layers)
        base = logits[0, -1].argmax()
        next_ids = torch.cat([prompt[1:], base.view(1)]).view(1, -1)
        out, dlogits = draft.forward(draft.project(aux), next_ids, dcache, 0)
        tokens, hidden = [], out[:, -1:]
        tok = draft.to_target[dlogits[0, -1].argmax()]
        for k in range(steps):
            tokens.append(int(tok))
            if k == steps - 1:
                break
            hidden, dlogits = draft.forward(hidden, tok.view(1, 1), dcache, n + k)
            tok = draft.to_target[dlogits[0, -1].argmax()]
    return int(base), tokens


def test_export_format_is_what_the_loader_reads(pair):
    root, _ = pair
    from safetensors.torch import load_file

    state = load_file(str(root / "eagle3" / "model.safetensors"))
    cfg = json.loads((root / "eagle3" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == DRAFT_VOCAB
    assert state["fc.weight"].shape == (64, 64 * len(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]))
    assert state["layers.0.self_attn.q_proj.weight"].shape[1] == 2 * 64
    assert state["d2t"].dtype == torch.int64 and state["d2t"].shape == (DRAFT_VOCAB,)
    draft = load_draft(root / "eagle3", load_target(root / "target"))
    assert draft.aux_layers == tuple(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    assert torch.equal(draft.to_target, torch.arange(DRAFT_VOCAB) + state["d2t"])


def test_chain_drafts_equal_modelopt_pseudo_speculative_generate(pair):
    """ModelOpt's own reference decoding of the same weights (it recomputes the whole sequence
    every step); our cached draft must propose the same tokens. Stock ModelOpt normalises the
    first layer's hidden input twice, which `first_norm="modelopt"` reproduces."""
    root, model = pair
    target = load_target(root / "target")
    draft = load_draft(root / "eagle3", target, first_norm="modelopt")
    for seed in range(3):
        prompt = torch.randint(0, 256, (6 + 5 * seed,), generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            base, ref = model.pseudo_speculative_generate(prompt.view(1, -1), steps=5)
        assert runtime_chain(target, draft, prompt, 5) == (int(base), ref[0].tolist())


def test_standard_first_norm_is_the_trtllm_formula(pair):
    """`standard`: attention input cat(input_layernorm(e), hidden_norm(h)), residual h (TRT-LLM's
    Eagle3DecoderLayer); the reference is that formula written out with the shared blocks."""
    root, _ = pair
    draft = load_draft(root / "eagle3", load_target(root / "target"), first_norm="standard")
    hidden = torch.randn(1, 5, 64, generator=torch.Generator().manual_seed(0))
    ids = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(1))
    layer, eps = draft.layers[0], draft.spec.rms_norm_eps

    def norm(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    with torch.inference_mode():
        out, logits = draft.forward(hidden, ids, draft.new_cache(1, 5), 0)
        x = torch.cat([norm(draft.embed[ids], layer.block.input_norm), norm(hidden, layer.hidden_norm)], -1)
        ref = hidden + attention_block(layer.block, x, draft.spec, draft.new_cache(1, 5), 0, 0,
                                       draft.rot[:5], prepare_mask(torch.ones(5, 5, dtype=torch.bool).tril(),
                                                                   draft.spec.num_heads, draft.spec.num_kv_heads,
                                                                   torch.float32))
        ref = ref + mlp_block(layer.block, norm(ref, layer.block.post_norm))
        ref_logits = draft.lm_head(norm(ref, draft.norm))
    assert torch.allclose(out, ref, atol=1e-5) and torch.allclose(logits, ref_logits, atol=1e-4)


def test_midlayer_naming_and_lm_head_fallback(pair, tmp_path):
    root, _ = pair
    from safetensors.torch import load_file, save_file

    target = load_target(root / "target")
    prompt = torch.arange(10, 22)
    ref = runtime_chain(target, load_draft(root / "eagle3", target), prompt, 4)
    renamed = tmp_path / "midlayer"
    shutil.copytree(root / "eagle3", renamed)
    state = load_file(str(renamed / "model.safetensors"))
    state = {k.replace("layers.0.", "midlayer."): v for k, v in state.items()}
    save_file(state, str(renamed / "model.safetensors"))
    assert runtime_chain(target, load_draft(renamed, target), prompt, 4) == ref
    # without lm_head and d2t (full draft vocab) the target's lm_head is used
    full = tmp_path / "full_vocab"
    shutil.copytree(renamed, full)
    del state["lm_head.weight"], state["d2t"]
    save_file(state, str(full / "model.safetensors"))
    cfg = json.loads((full / "config.json").read_text())
    cfg["draft_vocab_size"] = 256
    (full / "config.json").write_text(json.dumps(cfg))
    draft = load_draft(full, target)
    assert draft.lm_head is target.lm_head and torch.equal(draft.to_target, torch.arange(256))


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.update(architectures=["LlamaForCausalLM"]), "not an EAGLE-3 draft"),
    (lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[0, 9]), "layers the 4-layer"),
    (lambda c: c.update(hidden_size=96), "hidden_size 96"),
    (lambda c: c.update(vocab_size=999), "vocab_size 999"),
])
def test_incompatible_drafts_are_user_errors(pair, tmp_path, edit, match):
    root, _ = pair
    bad = tmp_path / "bad"
    shutil.copytree(root / "eagle3", bad)
    cfg = json.loads((bad / "config.json").read_text())
    edit(cfg)
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match=match) as err:
        load_draft(bad, load_target(root / "target"))
    assert "\n" not in str(err.value)
