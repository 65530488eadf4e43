"""The draft's training step on CPU in float32 against bfloat16 autocast, side by side in one run (issue 34:
the training is the long run's second cost).

    python bench/draft_train_dtype.py [--recipe recipes/smollm2-135m-cpu-draft.yaml] [--steps 6]

Both trainings are the recipe's draft stage run by the CLI (`trtbuild build --until draft`), on the same
pool of pydoc windows (no generation: the step's cost does not depend on whose text it is) and the same
hidden states dumped once (offline), at the recipe's batch size, sequence length and draft vocabulary;
only `draft.train.dtype` differs. Prints seconds per step, the ratio, and the loss and per-step accuracy
after the same steps (bf16 autocast keeps float32 weights and optimizer: the numbers should agree).
Uses TRTBUILD_CACHE (default a temporary directory).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def train(recipe: Path, dtype: str, steps: int, out: Path, env: dict[str, str]) -> dict:
    sets = {"draft.synthetic_requests": 0, "draft.distill_fraction": 0.0, "draft.dataset": "pydoc",
            "draft.samples": 128, "draft.steps": steps, "draft.checkpoint_every": 10**6, "draft.eval.prompts": 1,
            "draft.eval.new_tokens": 8, "draft.train.dtype": dtype, "output_dir": str(out)}
    command = [sys.executable, "-m", "trtbuild.cli", "build", str(recipe), "--until", "draft", "--json"]
    for key, value in sets.items():
        command += ["--set", f"{key}={value}"]
    done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"error: the {dtype} training failed: {done.stderr.strip().splitlines()[-1:]}")
    stage = next(s for s in json.loads((out / "build.json").read_text())["stages"] if s["name"] == "draft")
    return stage["metrics"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "smollm2-135m-cpu-draft.yaml")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="trtbuild-train-dtype-"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.setdefault("TRTBUILD_CACHE", str(work / "cache"))
    rows = {dtype: train(args.recipe, dtype, args.steps, work / dtype, env) for dtype in ("float32", "bfloat16")}
    print(f"{args.steps} steps each at the recipe's batch size and sequence length, same pool and hidden states")
    print(f"{'dtype':>9} {'s/step':>8} {'loss':>9}  step accuracy")
    for dtype, m in rows.items():
        accuracy = " ".join(f"{a:.4f}" for a in m["train_step_accuracy"])
        print(f"{dtype:>9} {m['train_step_seconds']:>8.2f} {m['train_loss']:>9.4f}  {accuracy}")
    ratio = rows["float32"]["train_step_seconds"] / rows["bfloat16"]["train_step_seconds"]
    print(f"bfloat16 autocast is {ratio:.2f}x float32's speed per step")
    print(json.dumps({"steps": args.steps, "ratio": ratio, **rows}))


if __name__ == "__main__":
    main()
