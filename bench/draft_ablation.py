"""One row of the draft ablation in bench/RESULTS.md: train an EAGLE-3 draft with the draft stage's
own code on a target, then measure tau on the bench prompts, EAGLE-3 and n-gram side by side.

    python bench/draft_ablation.py TARGET_HF_DIR OUT_DIR [field=value ...]

TARGET_HF_DIR: the unquantized target (e.g. build/tiny-cpu/model/hf). Fields are DraftConfig's
(`steps=600 aux_layers=[1,3,5] lr=3e-3`), on top of the shipped tiny recipe's draft section.
Prints one JSON line: training seconds and per-step accuracy, tau at chain 3 and 5 for the draft
(`etau3`, `etau5`, with conditional acceptance per position) and for prompt lookup (`ntau3`, `ntau5`).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from draft_training import draft_config, train


def main(argv: list[str]) -> None:
    import torch

    from trtbuild.draft.evaluate import measure_tau
    from trtbuild.runtime.bench import load_prompts

    target, out = Path(argv[0]), Path(argv[1])
    config, overrides = draft_config(Path(__file__).resolve().parent.parent / "recipes" / "tiny-cpu.yaml", argv[2:])
    torch.set_num_threads(2)
    started = time.perf_counter()
    result = train(config, target, out, Path("."))
    row: dict[str, Any] = {"overrides": overrides, "seconds": round(time.perf_counter() - started, 1),
                           "train_step_accuracy": result["metrics"]["train_step_accuracy"]}
    prompts = load_prompts("pydoc-heldout", target, 8, 64)
    for depth in (3, 5):
        for draft_dir, tag in ((out / "eagle3", "e"), (None, "n")):  # None: n-gram prompt lookup
            tau = measure_tau(target, draft_dir, prompts, 128, depth, max_matching_ngram_size=2)
            row[f"{tag}tau{depth}"] = round(tau["acceptance_length"], 3)
            if draft_dir is not None:
                row[f"rates{depth}"] = [round(r, 3) for r in tau["acceptance_rates"]]
    print(json.dumps(row))


if __name__ == "__main__":
    main(sys.argv[1:])
