"""Real engine bundles for the deploy / serve tests: a small Llama and an EAGLE-3 draft made here,
run through the engine stage, then the deploy stage.

The recipe is composed from the real stage configs of the sections these tests need, so the
fixtures do not depend on which stages the CLI registers yet.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from draft_fixtures import write_target

from trtbuild.core.data.chat import FALLBACK_CHAT_TEMPLATE
from trtbuild.core.progress import Progress
from trtbuild.core.stage import Artifact, StageContext

LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, VOCAB = 4, 64, 4, 2, 128, 384
DRAFT_AUX = [0, 1, 2]


def write_random_draft(directory: Path, seed: int = 0) -> Path:
    """An EAGLE-3 draft checkpoint in TRT-LLM's layout with random weights: it accepts little,
    which is what makes it a good test of lossless verification."""
    import torch
    from safetensors.torch import save_file

    from trtbuild.draft.format import LAYER_TENSORS

    directory.mkdir(parents=True)
    head_dim = HIDDEN // HEADS
    kv = KV_HEADS * head_dim
    shapes = {"self_attn.q_proj.weight": (HIDDEN, 2 * HIDDEN), "self_attn.k_proj.weight": (kv, 2 * HIDDEN),
              "self_attn.v_proj.weight": (kv, 2 * HIDDEN), "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
              "mlp.gate_proj.weight": (FFN, HIDDEN), "mlp.up_proj.weight": (FFN, HIDDEN),
              "mlp.down_proj.weight": (HIDDEN, FFN)}
    gen = torch.Generator().manual_seed(seed)
    tensors = {f"midlayer.{name}": (0.05 * torch.randn(shapes[name], generator=gen) if name in shapes
                                   else torch.ones(HIDDEN)) for name in LAYER_TENSORS}
    tensors["fc.weight"] = 0.05 * torch.randn(HIDDEN, len(DRAFT_AUX) * HIDDEN, generator=gen)
    tensors["norm.weight"] = torch.ones(HIDDEN)
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": HIDDEN,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": head_dim,
        "num_hidden_layers": 1, "intermediate_size": FFN, "vocab_size": VOCAB, "draft_vocab_size": VOCAB,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": DRAFT_AUX, "use_aux_hidden_state": True}}))
    return directory


def write_sources(root: Path) -> dict[str, Path]:
    """The model and draft stages' artifacts: `model/hf` and `draft/eagle3`."""
    write_target(root / "model" / "hf", num_hidden_layers=LAYERS)
    write_random_draft(root / "draft" / "eagle3")
    return {"model": root / "model", "draft": root / "draft"}


def make_recipe(base: Path, *, engine: dict[str, Any] | None = None, draft: bool = True,
                deploy: dict[str, Any] | None = None) -> Any:
    from trtbuild.app.recipe import Recipe

    recipe = Recipe.model_validate({
        "name": "deploy-test",
        "draft": {"source": "train", "max_draft_len": 3} if draft else {"source": "none"},
        "engine": {"max_batch_size": 4, **(engine or {})},
        "deploy": deploy or {},
    })
    recipe._recipe_file = base / "recipe.yaml"
    return recipe


def build_engine(base: Path, sources: dict[str, Path], recipe: Any, name: str = "engine") -> Path:
    """Run the engine stage into `<base>/cache/engine/<name>` (cache-like depth for the bundle link)."""
    from trtbuild.engine.stage import EngineStage

    out = base / "cache" / "engine" / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    inputs = {"model": Artifact("model", "k-model", sources["model"])}
    if recipe.draft.source != "none":
        inputs["draft"] = Artifact("draft", "k-draft", sources["draft"])
    EngineStage().run(recipe.engine, StageContext(recipe, inputs, out, Progress()))
    return out


def build_deploy(base: Path, engine_dir: Path, recipe: Any, name: str = "deploy") -> tuple[Path, Any]:
    from trtbuild.deploy.stage import DeployStage

    out = base / "cache" / "deploy" / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    ctx = StageContext(recipe, {"engine": Artifact("engine", "k-engine", engine_dir)}, out, Progress())
    result = DeployStage().run(recipe.deploy, ctx)
    return out, result


def start_logged(cmd: list[str]) -> tuple[subprocess.Popen[str], list[str]]:
    """A server process in its own session (so a test can kill its whole group) whose output lines
    a thread appends to the returned list as they come."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    return proc, lines


def wait_for_line(proc: subprocess.Popen[str], lines: list[str], text: str, timeout_s: float = 300) -> str:
    """The first output line containing `text`; fails with the whole log if the process exits or
    the time runs out first."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [line for line in lines if text in line]
        if found:
            return found[0]
        assert proc.poll() is None, "".join(lines)
        assert time.monotonic() < deadline, f"{text!r} not seen: " + "".join(lines)
        time.sleep(0.2)


class Reference:
    """Plain greedy decoding of the runtime (no Triton, no draft, no trtbuild.serve code): what
    the OpenAI fronts must answer."""

    def __init__(self, bundle: Path) -> None:
        from transformers import AutoTokenizer

        from trtbuild.runtime import Generator, load_target

        self.tokenizer = AutoTokenizer.from_pretrained(str(bundle / "target"))
        self.generator = Generator(load_target(bundle / "target"))

    def ids(self, prompt: str) -> list[int]:
        return self.tokenizer(prompt)["input_ids"]

    def complete(self, prompt: str, max_tokens: int) -> str:
        tokens = self.generator.generate(self.ids(prompt), max_tokens).tokens
        return self.tokenizer.decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        assert self.tokenizer.chat_template is None  # so the fronts use their documented fallback
        return self.tokenizer.apply_chat_template(messages, chat_template=FALLBACK_CHAT_TEMPLATE, tokenize=False,
                                                  add_generation_prompt=True)
