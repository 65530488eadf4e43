"""Host memory and bytes read per rank when the draft stage holds the target whole vs FSDP2-sharded.

    python bench/draft_sharded_memory.py TARGET_HF_DIR OUT [--processes 2]

Runs the draft stage twice on the same target, `draft.train.processes` ranks (gloo), 2 training
steps on a small raw-text pool: `target_sharding: none` (every rank loads the whole target) and
`fsdp` (draft/sharded_load.py: meta-device build, each rank reads its rows). Prints each run's
bytes read per rank, peak host memory per rank after loading and overall (the max over ranks),
layer parameters per rank, training step time and final loss (equal losses: same computation).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]

FIELDS = ("train_target_sharding", "target_bytes_read_per_rank", "rank_peak_host_memory_loaded_bytes",
          "rank_peak_host_memory_bytes", "target_layer_parameters", "target_layer_parameters_per_rank",
          "train_step_seconds", "train_loss")


def main() -> None:
    from test_draft_distributed import _Recipe

    from trtbuild.core.progress import Progress
    from trtbuild.core.stage import Artifact, StageContext
    from trtbuild.draft.stage import DraftConfig, DraftStage

    parser = argparse.ArgumentParser()
    parser.add_argument("target", type=Path, help="an HF directory (the model stage's hf/)")
    parser.add_argument("out", type=Path)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    root = args.out / "target"
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "hf").exists():
        (root / "hf").symlink_to(args.target.resolve())
    rows = {}
    for sharding in ("none", "fsdp"):
        out = args.out / sharding
        out.mkdir(exist_ok=True)
        config = DraftConfig(samples=8, steps=2, batch_size=2, seq_len=64, prompt_len=8, max_draft_len=3,
                             distill_fraction=0.0, checkpoint_every=2,
                             eval={"prompts": 1, "prompt_len": 12, "new_tokens": 8},
                             train={"processes": args.processes, "target_sharding": sharding})
        ctx = StageContext(recipe=_Recipe(out), inputs={"model": Artifact("model", f"bench-{sharding}", root)},
                           out_dir=out, progress=Progress())
        metrics = DraftStage().run(config, ctx).metrics
        rows[sharding] = {name: metrics.get(name) for name in FIELDS}
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
