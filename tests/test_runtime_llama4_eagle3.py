"""EAGLE-3 on a Llama 4 target, the project's own way: ModelOpt converts Llama4ForCausalLM
(EagleLlama4ForCausalLM) with Maverick's capture rule, the draft trains on the target's greedy
text, trtbuild.draft exports it in TensorRT-LLM's layout and its compatibility check passes, and
the runtime's speculative decoding (chain and tree) equals plain greedy decoding with real
acceptance."""

from __future__ import annotations

import pytest
import torch
from runtime_fixtures import one_thread  # noqa: F401

from trtbuild.draft.compat import check_compatible
from trtbuild.draft.export import export_draft
from trtbuild.draft.model import DraftArch, convert_to_eagle3, draft_parameters
from trtbuild.draft.model import load_target as load_hf_target
from trtbuild.runtime import Generator, SpecParams, load_draft, load_target
from trtbuild.runtime.devmodels import random_llama4

pytestmark = pytest.mark.usefixtures("one_thread")

# 8 layers as the tiny Llama 4 recipe: {1, L/2 - 1, L - 4} = 1, 3, 4 (Maverick's draft: 1, 23, 44 of 48).
AUX_LAYERS = [1, 3, 4]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama4eagle3")
    # vocabulary 16: a briefly trained draft is often right, so acceptance is partial and varied
    random_llama4(root / "target", vocab=16, hidden=32, heads=2, kv_heads=1, intermediate=32,
                  intermediate_mlp=64, layers=8)
    target = load_target(root / "target")
    plain = Generator(target)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 16, (4,), generator=gen).tolist() for _ in range(32)]
    data = torch.tensor([p + plain.generate(p, 28, eos_token_ids=[]).tokens for p in prompts])
    torch.manual_seed(0)
    model = convert_to_eagle3(load_hf_target(root / "target"), DraftArch(AUX_LAYERS, draft_vocab_size=16), None)
    assert type(model).__name__ == "EagleLlama4ForCausalLM"
    optimizer = torch.optim.AdamW(draft_parameters(model), lr=3e-3)
    model.train()
    for _ in range(60):
        loss = model(input_ids=data[torch.randint(0, len(data), (8,), generator=gen)]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    export_draft(model, root / "draft", target_dir=root / "target", dtype="float32")
    return root, target


def test_export_is_tensorrt_llms_layout_and_passes_the_check(pair) -> None:
    import json

    root, _ = pair
    config = json.loads((root / "draft" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == AUX_LAYERS
    check_compatible(root / "draft", root / "target", where="draft")


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_eagle3_speculative_equals_plain_greedy(pair, mode: str) -> None:
    root, target = pair
    generator = Generator(target, load_draft(root / "draft", target))
    accepted = steps = 0
    for prompt in ([1, 2, 3], [5, 4, 5, 4, 5, 4, 3], [9]):
        plain = generator.generate(prompt, 40, eos_token_ids=[]).tokens
        run = generator.generate(prompt, 40, spec=SpecParams(max_draft_len=3, mode=mode), eos_token_ids=[])
        assert run.tokens == plain
        accepted += sum(run.stats.accepted)
        steps += len(run.stats.accepted)
    assert accepted > steps / 2  # measured: 1.1 (chain) and 1.7 (tree) accepted per step
