"""Draft training in one vs two processes (the stage's own torchrun + gloo DDP launch), side by side.

    python bench/draft_distributed.py [--seeds 0,1,2] [--steps 16] [--processes 2] [--threads N]

On a briefly trained tiny target (the settings of tests/test_draft_distributed.py) the draft stage
runs for each seed: one process; one process with two half-batch forwards (gradient accumulation,
the same sums in another order: the float32 summation-order reference); and N processes. Prints
the per-step loss curves' max relative difference to the one-process curve, tau per run (and the
one-process seed spread), the training loop's time per step and the stage's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trtbuild.core.recipe_info import RecipeInfo

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TINY = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "vocab_size": 512, "seq_len": 64, "batch_size": 8, "steps": 40,
        "warmup_steps": 4, "processes": 1}
DRAFT = dict(samples=32, batch_size=8, seq_len=32, prompt_len=8, max_draft_len=3, lr=3e-3,
             checkpoint_every=4, eval={"prompts": 8, "prompt_len": 12, "new_tokens": 32})



def _Recipe(base_dir: Path) -> RecipeInfo:
    return RecipeInfo.standalone(base_dir)


def run(target: Any, out: Path, seed: int, steps: int, **train: Any) -> dict[str, Any]:
    from trtbuild.core.progress import Progress
    from trtbuild.core.stage import StageContext
    from trtbuild.draft.stage import DraftConfig, DraftStage

    out.mkdir(parents=True)
    config = DraftConfig(**{**DRAFT, "steps": steps, "seed": seed, "train": train})
    began = time.perf_counter()
    result = DraftStage().run(config, StageContext(recipe=_Recipe(out.parent), inputs={"model": target},
                                                   out_dir=out, progress=Progress()))
    return {"wall": time.perf_counter() - began, "tau": result.metrics["acceptance_length"],
            "loop_s_per_step": result.metrics["train_seconds"] / steps,
            "losses": json.loads((out / "train_log.json").read_text())["losses"]}


def rel(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch threads of the one-process runs "
                        "(default: torch's; each rank of torchrun gets OMP_NUM_THREADS=1)")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    seeds = [int(s) for s in args.seeds.split(",")]

    from trtbuild.core.progress import Progress
    from trtbuild.core.stage import Artifact
    from trtbuild.model.tiny import TinyModelConfig, build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TRTBUILD_CACHE"] = str(Path(tmp) / "cache")
        build_tiny_model(TinyModelConfig(**TINY), Path(tmp) / "model" / "hf", Progress())
        target = Artifact("model", "tiny-key", Path(tmp) / "model")
        rows = []
        for seed in seeds:
            one = run(target, Path(tmp) / f"one{seed}", seed, args.steps)
            acc = run(target, Path(tmp) / f"acc{seed}", seed, args.steps, micro_batch_size=DRAFT["batch_size"] // 2)
            many = run(target, Path(tmp) / f"many{seed}", seed, args.steps, processes=args.processes)
            rows.append((seed, one, acc, many))
    print(f"| seed | loss max rel diff: accumulation vs one | {args.processes} processes vs one | tau one | "
          f"tau {args.processes} | loop ms/step one | loop ms/step {args.processes} | stage wall s one | "
          f"stage wall s {args.processes} |")
    print("|---|---|---|---|---|---|---|---|---|")
    for seed, one, acc, many in rows:
        print(f"| {seed} | {rel(acc['losses'], one['losses']):.2e} | {rel(many['losses'], one['losses']):.2e} | "
              f"{one['tau']:.3f} | {many['tau']:.3f} | {one['loop_s_per_step'] * 1e3:.0f} | "
              f"{many['loop_s_per_step'] * 1e3:.0f} | {one['wall']:.1f} | {many['wall']:.1f} |")
    taus = [one["tau"] for _, one, _, _ in rows]
    other = rel(rows[1][1]["losses"], rows[0][1]["losses"]) if len(rows) > 1 else float("nan")
    print(f"\none-process tau spread over seeds {seeds}: {min(taus):.3f} .. {max(taus):.3f}; "
          f"another seed's curve differs by {other:.2e} (max rel)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
