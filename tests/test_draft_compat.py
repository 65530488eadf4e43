"""The compatibility check refuses drafts that do not fit the target, each with a one-line message
naming the field and both values; a draft exported for the target passes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from draft_fixtures import write_target, write_target_config, write_tokenizer

from trtbuild.core.errors import UserError
from trtbuild.draft.compat import check_compatible, rope_settings, tokenizer_fingerprint

DRAFT_VOCAB = 200


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(target dir, draft dir): a random target and an untrained draft exported by ModelOpt for it."""
    import torch

    from trtbuild.draft.export import export_draft
    from trtbuild.draft.model import DraftArch, convert_to_eagle3, load_target
    from trtbuild.draft.vocab import d2t_table

    root = tmp_path_factory.mktemp("compat")
    target_dir = write_target(root / "target")
    arch = DraftArch(aux_layers=[0, 1], draft_vocab_size=DRAFT_VOCAB)
    model = convert_to_eagle3(load_target(target_dir), arch,
                              d2t_table([2 * i for i in range(150)] + list(range(300, 350))))
    with torch.no_grad():
        export_draft(model, root / "draft", target_dir=target_dir, dtype="float32")
    return target_dir, root / "draft"


def _copy(draft: Path, tmp_path: Path) -> Path:
    out = tmp_path / "draft"
    shutil.copytree(draft, out)
    return out


def _edit_config(draft: Path, **changes: object) -> None:
    config = json.loads((draft / "config.json").read_text())
    for key, value in changes.items():
        if key.startswith("eagle_config."):
            config["eagle_config"][key.split(".", 1)[1]] = value
        else:
            config[key] = value
    (draft / "config.json").write_text(json.dumps(config))


def _edit_tensors(draft: Path, edit) -> None:  # type: ignore[no-untyped-def]
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(draft / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(draft / "model.safetensors"))


def _refused(draft: Path, target: Path, *fragments: str) -> UserError:
    with pytest.raises(UserError) as info:
        check_compatible(draft, target)
    text = info.value.one_line()
    assert "\n" not in text
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in: {text}"
    return info.value


def test_matching_draft_passes(exported: tuple[Path, Path]) -> None:
    target, draft = exported
    checked = check_compatible(draft, target)
    assert checked.draft_vocab_size() == DRAFT_VOCAB
    assert checked.aux_layer_ids() == [0, 1]


def test_wrong_hidden_size(exported: tuple[Path, Path], tmp_path: Path) -> None:
    _, draft = exported
    target = write_target_config(tmp_path / "t", hidden_size=128, head_dim=32)
    _refused(draft, target, "draft.hidden_size", "64 (draft)", "128 (target)")


def test_too_few_aux_layers_for_fc(exported: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = exported
    draft = _copy(draft, tmp_path)
    _edit_config(draft, **{"eagle_config.eagle_aux_hidden_state_layer_ids": [1]})
    _refused(draft, target, "draft.fc.weight", "input width 128 (draft)", "1 x hidden_size 64 = 64 (target)")


def test_aux_layer_beyond_target_depth(exported: tuple[Path, Path], tmp_path: Path) -> None:
    _, draft = exported
    target = write_target_config(tmp_path / "t", num_hidden_layers=1)
    _refused(draft, target, "draft.eagle_aux_hidden_state_layer_ids", "aux layer id 1", "1 layers")


def test_d2t_out_of_range(exported: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = exported
    draft = _copy(draft, tmp_path)

    def push_last_beyond_vocab(tensors: dict) -> None:  # type: ignore[type-arg]
        tensors["d2t"][-1] = 1000  # last draft id 199 -> target id 1199, vocab is 384

    _edit_tensors(draft, push_last_beyond_vocab)
    _refused(draft, target, "draft.d2t", "target id 1199 (draft)", "vocab_size 384 (target)")


def test_d2t_not_one_to_one(exported: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = exported
    draft = _copy(draft, tmp_path)

    def collide(tensors: dict) -> None:  # type: ignore[type-arg]
        tensors["d2t"][1] = tensors["d2t"][0] - 1  # draft ids 0 and 1 -> the same target id

    _edit_tensors(draft, collide)
    _refused(draft, target, "draft.d2t", "one-to-one", "199 target ids")


def test_other_tokenizer(exported: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = exported
    draft = _copy(draft, tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (draft / name).unlink()
    write_tokenizer(draft, corpus_chars=50_000)  # same size, other merges
    expected_draft, expected_target = tokenizer_fingerprint(draft), tokenizer_fingerprint(target)
    assert expected_draft != expected_target
    _refused(draft, target, "draft.tokenizer", f"{expected_draft[:12]} (draft)",
             f"{expected_target[:12]} (target)")


def test_other_vocab_size(exported: tuple[Path, Path], tmp_path: Path) -> None:
    _, draft = exported
    target = write_target_config(tmp_path / "t", vocab_size=512)
    _refused(draft, target, "draft.vocab_size", "384 (draft)", "512 (target)")


def test_other_head_dim(exported: tuple[Path, Path], tmp_path: Path) -> None:
    _, draft = exported
    target = write_target_config(tmp_path / "t", num_attention_heads=2, num_key_value_heads=2, head_dim=32)
    _refused(draft, target, "draft.head_dim", "16 (draft)", "32 (target)")


def test_other_kv_heads(exported: tuple[Path, Path], tmp_path: Path) -> None:
    _, draft = exported
    target = write_target_config(tmp_path / "t", num_key_value_heads=4)
    _refused(draft, target, "draft.num_key_value_heads", "2 (draft)", "4 (target)")


def test_head_count_disagrees_with_weights(exported: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = exported
    draft = _copy(draft, tmp_path)
    _edit_config(draft, num_attention_heads=8)  # q_proj holds 4 heads of 16
    _refused(draft, target, "draft.num_attention_heads", "[64, 128] (draft)", "num_attention_heads 8")


def test_other_rope_theta(exported: tuple[Path, Path], tmp_path: Path) -> None:
    _, draft = exported
    rope = {"rope_type": "default", "rope_theta": 500000.0}
    target = write_target_config(tmp_path / "t", rope_parameters=rope)
    assert rope_settings(json.loads((target / "config.json").read_text()))[0] == 500000.0
    _refused(draft, target, "draft.rope_theta", "10000 (draft)", "500000 (target)")
    check_compatible(draft, target, ignore=["rope"])  # a waived check passes


def test_dtype_disagrees_with_tensors(exported: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = exported
    draft = _copy(draft, tmp_path)
    _edit_config(draft, torch_dtype="bfloat16")
    _refused(draft, target, "draft.torch_dtype", "F32", "bfloat16")


def test_not_an_eagle3_checkpoint(exported: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = exported
    draft = _copy(draft, tmp_path)
    _edit_config(draft, architectures=["LlamaForCausalLM"])
    _refused(draft, target, "draft.architectures", "['LlamaForCausalLM'] (draft)", "LlamaForCausalLMEagle3")


def test_missing_fc(exported: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = exported
    draft = _copy(draft, tmp_path)
    _edit_tensors(draft, lambda tensors: tensors.pop("fc.weight"))
    _refused(draft, target, "draft.tensors", "fc.weight missing")


def test_draft_vocab_larger_than_target(exported: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = exported
    draft = _copy(draft, tmp_path)
    _edit_config(draft, draft_vocab_size=1000)
    _refused(draft, target, "draft.draft_vocab_size", "1000 (draft)", "384 (target)")


def test_unknown_waiver_is_refused(exported: tuple[Path, Path]) -> None:
    target, draft = exported
    with pytest.raises(UserError, match="unknown compatibility check 'hiden_size'"):
        check_compatible(draft, target, ignore=["hiden_size"])
