"""The 8B recipe's draft stage on a draft shaped like the one it names (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B).

That draft ships config.json and one pytorch_model.bin (a pickle) holding a flat state dict of 15 tensors
in float16: fc, midlayer.* (10), norm, lm_head (the 32000-token draft vocabulary), d2t (int64) and t2d
(bool over the target vocabulary); its config carries draft_vocab_size and no rope_theta. Here the same
names, dtypes, file layout and config keys at the test target's small sizes.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
import yaml
from draft_fixtures import VOCAB, write_target
from safetensors.torch import load_file, save_file

from trtbuild.app.pipeline import Artifact
from trtbuild.core.errors import UserError
from trtbuild.core.progress import Progress
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.core.stage import StageContext
from trtbuild.draft.stage import DraftConfig, DraftStage

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "llama-3.1-8b-instruct-fp8-eagle3.yaml"
HIDDEN, HEADS, KV_HEADS, INTER, DRAFT_VOCAB = 64, 4, 2, 128, 200


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Artifact:
    root = tmp_path_factory.mktemp("model")
    write_target(root / "hf", num_hidden_layers=8)  # default aux layers {1, 3, 4}: three, as for 8B
    return Artifact("model", "model-key", root)


def published_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    head_dim = HIDDEN // HEADS

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.05).half()

    chosen = sorted(torch.randperm(VOCAB, generator=g)[:DRAFT_VOCAB].tolist())
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[chosen] = True
    layer = {"self_attn.q_proj.weight": w(HEADS * head_dim, 2 * HIDDEN),
             "self_attn.k_proj.weight": w(KV_HEADS * head_dim, 2 * HIDDEN),
             "self_attn.v_proj.weight": w(KV_HEADS * head_dim, 2 * HIDDEN),
             "self_attn.o_proj.weight": w(HIDDEN, HEADS * head_dim),
             "mlp.gate_proj.weight": w(INTER, HIDDEN), "mlp.up_proj.weight": w(INTER, HIDDEN),
             "mlp.down_proj.weight": w(HIDDEN, INTER), "input_layernorm.weight": torch.ones(HIDDEN).half(),
             "hidden_norm.weight": torch.ones(HIDDEN).half(),
             "post_attention_layernorm.weight": torch.ones(HIDDEN).half()}
    return {"fc.weight": w(HIDDEN, 3 * HIDDEN), **{f"midlayer.{k}": v for k, v in layer.items()},
            "norm.weight": torch.ones(HIDDEN).half(), "lm_head.weight": w(DRAFT_VOCAB, HIDDEN),
            "d2t": torch.tensor(chosen) - torch.arange(DRAFT_VOCAB), "t2d": t2d}


def published_config() -> dict:
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "bias": False,
            "draft_vocab_size": DRAFT_VOCAB, "vocab_size": VOCAB, "hidden_size": HIDDEN, "hidden_act": "silu",
            "intermediate_size": INTER, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
            "num_hidden_layers": 1, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False, "torch_dtype": "float16"}


def write_draft(directory: Path, fmt: str) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(published_config()))
    if fmt == "pickle":
        torch.save(published_state(), directory / "pytorch_model.bin")  # the test writes it; trtbuild only reads
    else:
        save_file(published_state(), str(directory / "model.safetensors"))
    return directory


def recipe_draft(path: Path) -> DraftConfig:
    """The 8B recipe's draft section with the published draft's directory in place of the Hub download."""
    section = yaml.safe_load(RECIPE.read_text())["draft"]
    assert section["repo_id"] == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    section = {k: v for k, v in section.items() if k != "repo_id"}
    return DraftConfig(**{**section, "source": "path", "path": str(path), "eval": {"prompts": 0}})



def _Recipe(base_dir: Path) -> RecipeInfo:  # no model section: the draft is judged on its own
    return RecipeInfo.standalone(base_dir)


class _Log(Progress):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def log(self, message: str) -> None:
        self.lines.append(message)


def run_stage(config: DraftConfig, target: Artifact, out: Path, progress: Progress | None = None):  # type: ignore[no-untyped-def]
    out.mkdir(parents=True)
    ctx = StageContext(recipe=_Recipe(out.parent), inputs={"model": target}, out_dir=out,
                       progress=progress or Progress())
    return DraftStage().run(config, ctx)


@pytest.mark.parametrize("fmt", ["safetensors", "pickle"])
def test_the_8b_recipes_draft_stage_passes_on_a_published_shaped_draft(target: Artifact, tmp_path: Path,
                                                                       fmt: str) -> None:
    draft = write_draft(tmp_path / "published", fmt)
    log = _Log()
    result = run_stage(recipe_draft(draft), target, tmp_path / "out", log)
    out = tmp_path / "out" / "eagle3"
    assert result.metrics["draft_vocab_size"] == DRAFT_VOCAB and result.metrics["max_draft_len"] == 4
    assert not list(out.glob("*.bin"))  # the artifact holds safetensors only
    loaded = load_file(str(out / "model.safetensors"))
    expected = published_state()
    assert loaded.keys() == expected.keys() and all(torch.equal(loaded[k], expected[k]) for k in expected)
    if fmt == "pickle":
        converted = result.info["converted"]
        assert converted["file"] == "pytorch_model.bin" and converted["tensors"] == 15
        assert len([line for line in log.lines if "weights-only loader" in line]) == 1


class _Payload:
    """Unpickling this creates a file (a planted pickle)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (Path.write_text, (self.marker, "pwned"))


@pytest.mark.parametrize("how", ["torch.save", "pickle.dumps"])
def test_a_planted_malicious_pickle_is_refused(target: Artifact, tmp_path: Path, how: str) -> None:
    """A payload that writes a file when unpickled, saved the way published drafts are (torch.save: the
    weights-only loader refuses it at build) or as a bare pickle (refused before any work)."""
    draft = tmp_path / "published"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps(published_config()))
    marker = tmp_path / "pwned"
    state = {**published_state(), "fc.weight": _Payload(marker)}
    if how == "torch.save":
        torch.save(state, draft / "pytorch_model.bin")
        expected = "needs more than tensors to unpickle and is refused"
        assert DraftStage().preflight(recipe_draft(draft), _Recipe(tmp_path)) == []  # a valid archive
    else:
        (draft / "pytorch_model.bin").write_bytes(pickle.dumps(state))
        expected = "is not a torch.save archive"
        assert expected in DraftStage().preflight(recipe_draft(draft), _Recipe(tmp_path))[0]
    with pytest.raises(UserError, match=expected) as err:
        run_stage(recipe_draft(draft), target, tmp_path / "out")
    assert not marker.exists() and err.value.field == "draft.path"
    assert not (tmp_path / "out" / "eagle3" / "model.safetensors").exists()


def test_other_pickles_are_still_refused(target: Artifact, tmp_path: Path) -> None:
    """Only a lone pytorch_model.bin is a published draft; beside safetensors or under another name,
    a pickle refuses the directory as before."""
    both = write_draft(tmp_path / "both", "safetensors")
    torch.save(published_state(), both / "pytorch_model.bin")
    other = write_draft(tmp_path / "other", "safetensors")
    (other / "model.safetensors").unlink()
    torch.save(published_state(), other / "draft.pt")
    for directory in (both, other):
        with pytest.raises(UserError, match="holds pickle files"):
            run_stage(recipe_draft(directory), target, tmp_path / f"out-{directory.name}")


def test_pinned_files_are_checked_before_the_draft_loads(target: Artifact, tmp_path: Path) -> None:
    """draft.sha256: the digests `sha256sum` prints pass; one flipped byte or a missing file is refused
    with the field named, in preflight and in the stage, and the artifact gets no weights."""
    import hashlib

    draft = write_draft(tmp_path / "published", "safetensors")
    weights = draft / "model.safetensors"
    pins = {name: hashlib.sha256((draft / name).read_bytes()).hexdigest()
            for name in ("model.safetensors", "config.json")}
    pinned = recipe_draft(draft).model_copy(update={"sha256": pins})
    assert DraftStage().preflight(pinned, _Recipe(tmp_path)) == []
    assert run_stage(pinned, target, tmp_path / "ok").metrics["draft_vocab_size"] == DRAFT_VOCAB

    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    [line] = DraftStage().preflight(pinned, _Recipe(tmp_path))
    assert "model.safetensors has sha256" in line and "draft.sha256" in line
    with pytest.raises(UserError, match="the recipe pins") as err:
        run_stage(pinned, target, tmp_path / "changed")
    assert err.value.field == "draft.sha256"
    assert not (tmp_path / "changed" / "eagle3" / "model.safetensors").exists()

    weights.unlink()
    with pytest.raises(UserError, match="is missing"):
        run_stage(pinned, target, tmp_path / "missing")


@pytest.mark.parametrize("pins, message", [
    ({"model.safetensors": "ABC"}, "String should match pattern"),
    ({"../model.safetensors": "0" * 64}, "String should match pattern"),
])
def test_bad_pins_are_refused_by_the_config(pins: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DraftConfig(source="path", path="d", sha256=pins)
    with pytest.raises(ValueError, match="for source: path or hub"):
        DraftConfig(source="train", sha256={"model.safetensors": "0" * 64})
