"""Ship a draft the draft stage trained into the repository, pinned by sha256 in the recipe that serves it.

    python scripts/ship_draft.py build/smollm2-135m-cpu-draft        # what `make draft-smollm2` runs

Reads OUT/draft (the stage's artifact: eagle3/, train_log.json, manifest.json with the measured tau) and
writes the draft directory: the EAGLE-3 checkpoint with its float tensors cast to `--dtype` (bfloat16
halves the file; d2t stays int64), the tokenizer files, the training log, the stage's metrics, the
training recipe and a README naming the command. Then it rewrites the `sha256:` line of the serving
recipe's draft section, so a changed file is refused at load (draft.sha256). The directory is written
beside the old one and swapped in at the end: an interrupted run leaves the shipped draft as it was.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file, save_file

from trtbuild.core.cache import sha256_file

ROOT = Path(__file__).resolve().parent.parent
PINNED = ("model.safetensors", "config.json")  # what the runtime and TRT-LLM read as the draft
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def cast(source: Path, target: Path, dtype: torch.dtype) -> None:
    tensors = load_file(str(source))
    save_file({name: t.to(dtype) if t.is_floating_point() else t for name, t in sorted(tensors.items())},
              str(target))


def readme(manifest: dict, recipe: str, dtype: str) -> str:
    metrics = manifest["metrics"]
    rates = " / ".join(f"{r:.2f}" for r in metrics.get("acceptance_rates", []))
    name = manifest["recipe"].get("name", "draft")
    return f"""# {name}: the shipped EAGLE-3 draft

Trained by trtbuild's draft stage (`source: train`, `{name}`), cast to
{dtype} by `scripts/ship_draft.py` and served by `{recipe}`. Made again from nothing with
`make draft-smollm2`.

- data: {metrics.get("pool_sequences")} sequences, {metrics.get("pool_tokens")} tokens
- training: {metrics.get("train_steps")} steps in {metrics.get("train_seconds")} s \
({metrics.get("train_step_seconds")} s a step) on {metrics.get("train_device")}
- tau measured by the stage: {metrics.get("acceptance_length")} at chain {metrics.get("max_draft_len")} \
(by position: {rates}), {metrics.get("eval_prompts")} prompts ({metrics.get("eval_prompts_from")})

Files: `model.safetensors` and `config.json` are the draft (pinned by `draft.sha256` in the serving
recipe); `train_log.json` is the loss per step; `metrics.json` the stage's metrics; `training-config.yaml`
the draft section as the stage resolved it, with the library versions and the code and target keys.
"""


def pin(recipe: Path, pins: dict[str, str]) -> None:
    text = recipe.read_text()
    line = "  sha256: {" + ", ".join(f"{name}: {digest}" for name, digest in sorted(pins.items())) + "}"
    new, count = re.subn(r"(?m)^  sha256: \{.*\}$", line, text)
    if count != 1:
        sys.exit(f"error: {recipe}: needs one `  sha256: {{...}}` line in its draft section to pin the files")
    recipe.write_text(new)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build", type=Path, help="the training recipe's output_dir")
    parser.add_argument("--to", type=Path, default=ROOT / "drafts" / "smollm2-135m-instruct-eagle3")
    parser.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "smollm2-135m-cpu.yaml",
                        help="the serving recipe whose draft.sha256 line is rewritten")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    args = parser.parse_args()

    artifact = args.build / "draft"
    manifest_file = artifact / "manifest.json"
    if not (artifact / "eagle3" / "model.safetensors").is_file() or not manifest_file.is_file():
        sys.exit(f"error: {artifact}: no trained draft there; build the training recipe first "
                 "(trtbuild build recipes/smollm2-135m-cpu-draft.yaml --until draft)")
    manifest = json.loads(manifest_file.read_text())
    work = args.to.with_name(f".{args.to.name}.{os.getpid()}.tmp")
    work.mkdir(parents=True)
    try:
        for file in sorted((artifact / "eagle3").iterdir()):
            if file.name == "model.safetensors":
                cast(file, work / file.name, DTYPES[args.dtype])
            elif file.name == "config.json":
                config = json.loads(file.read_text())
                config["torch_dtype"] = args.dtype
                (work / file.name).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
            else:
                shutil.copyfile(file, work / file.name)
        shutil.copyfile(artifact / "train_log.json", work / "train_log.json")
        (work / "metrics.json").write_text(json.dumps(manifest["metrics"], indent=2, sort_keys=True) + "\n")
        components = manifest["key_components"]
        (work / "training-config.yaml").write_text(yaml.safe_dump(
            {"recipe": manifest["recipe"], "draft": components["config"], "libraries": components["libraries"],
             "code": components["code"], "target": components["inputs"]}, sort_keys=True))
        (work / "README.md").write_text(readme(manifest, os.path.relpath(args.recipe, ROOT), args.dtype))
        old = args.to.with_name(f".{args.to.name}.{os.getpid()}.old")
        if args.to.exists():
            args.to.rename(old)
        work.rename(args.to)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    pins = {name: sha256_file(args.to / name) for name in PINNED}
    pin(args.recipe, pins)
    size = (args.to / "model.safetensors").stat().st_size
    print(f"shipped {args.to} ({size / 1e6:.1f} MB weights, {args.dtype}); pinned in {args.recipe}")


if __name__ == "__main__":
    main()
