"""A loaded draft's tau on several held-out request sets, and the margin a later measurement is held to
(issue 34: the shipped SmolLM2 draft's slow test).

    python bench/draft_eval_spread.py recipes/smollm2-135m-cpu.yaml [--seeds 4] [--draft DIR] [--record]

The recipe's draft section says which draft (`source: path`, its `sha256` pins checked first) and how it
is evaluated (`draft.eval`: prompts, new tokens; `max_draft_len`). The requests are the ones the draft
stage evaluates on: written by the target itself, request seed 0 being the stage's own set
(trtbuild.draft.evaluate.EVAL_REQUEST_SEED), seeds 1.. other sets of the same size. tau and its rates by
position are measured with the stage's function on each set. The margin is 3 standard deviations of tau
over the sets: what changing every prompt moves it by, so a machine whose rounding parts a greedy
continuation somewhere stays inside it, and a draft that no longer predicts does not. `--record` writes
it all into the draft directory's metrics.json (`recorded_eval`, not pinned); `--draft` measures another
directory (e.g. the float32 artifact before `scripts/ship_draft.py` cast it). One JSON object.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any


def main() -> None:
    from trtbuild.cli.common import built
    from trtbuild.core.layout import MODEL_HF
    from trtbuild.draft.config import DraftConfig
    from trtbuild.draft.evaluate import EVAL_REQUEST_SEED, TARGET_WRITTEN, eval_prompts, measure_tau

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("--seeds", type=int, default=4, help="request sets: the stage's and seeds-1 others")
    parser.add_argument("--draft", type=Path, help="measure this draft directory instead of the recipe's")
    parser.add_argument("--record", action="store_true", help="write recorded_eval into the draft's metrics.json")
    parser.add_argument("--set", action="append", default=[], help="recipe overrides, as the CLI's")
    args = parser.parse_args()
    if args.seeds < 2:
        parser.error("--seeds needs 2 or more sets for a spread")
    loaded, artifacts = built(args.recipe, tuple(args.set), "model", True)
    config = loaded.section(DraftConfig)
    if config is None or config.source != "path" or not config.path:
        raise SystemExit(f"error: {args.recipe}: draft.source must be path (a shipped draft) for this measurement")
    draft_dir = args.draft or loaded.resolve_path(config.path)
    target_dir = artifacts["model"] / MODEL_HF
    rows: list[dict[str, Any]] = []
    for seed in range(args.seeds):
        prompts, origin = eval_prompts(target_dir, config.eval, loaded.base_dir, EVAL_REQUEST_SEED + seed)
        if origin != TARGET_WRITTEN:
            raise SystemExit(f"error: {args.recipe}: the evaluation reads {origin}; request seeds need the "
                             "target's own requests (draft.eval.dataset unset, a chat target)")
        result = measure_tau(target_dir, draft_dir, prompts, config.eval.new_tokens, config.max_draft_len,
                             config.eval.mode)
        rows.append({"request_seed": seed, **{k: result[k] for k in ("acceptance_length", "acceptance_rates",
                                                                    "eval_prompts", "eval_new_tokens")}})
        print(f"request seed {seed}: tau {result['acceptance_length']:.3f} "
              f"(by position {' / '.join(f'{r:.2f}' for r in result['acceptance_rates'])})", flush=True)
    taus = [r["acceptance_length"] for r in rows]
    report = {
        "draft": draft_dir.name, "prompts": config.eval.prompts, "new_tokens": config.eval.new_tokens,
        "max_draft_len": config.max_draft_len, "mode": config.eval.mode, "sets": rows,
        "tau": taus[0], "mean": round(statistics.mean(taus), 4), "stdev": round(statistics.stdev(taus), 4),
        "margin": round(3 * statistics.stdev(taus), 4),
        "measured": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()} {platform.processor()}".strip(),
    }
    print(f"tau {report['tau']:.3f} on the stage's set; {report['mean']:.3f} +- {report['stdev']:.3f} over "
          f"{args.seeds} sets; margin {report['margin']:.3f}")
    if args.record:
        metrics_file = draft_dir / "metrics.json"
        metrics = json.loads(metrics_file.read_text()) if metrics_file.is_file() else {}
        metrics["recorded_eval"] = report
        tmp = metrics_file.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
        tmp.replace(metrics_file)
        print(f"recorded in {metrics_file}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
