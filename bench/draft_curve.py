"""The draft's data-size curve (issue 34): tau by position on held-out chat requests against how many of
the pool's answers the draft trained on, from ONE regenerated pool and its hidden states.

    python bench/draft_curve.py recipes/smollm2-135m-cpu-draft.yaml --points 300,1000,3000,10000 \
        --seeds-at 1000 --seeds 1,2 --out build/draft-curve

Each point is the recipe's draft stage run by the CLI (`trtbuild build RECIPE --until draft`) with
`--set draft.train_samples=N` (and `draft.train_seed=S` for the seed spread): the pool and its hidden
states keep their cache key, so only the training and the evaluation run again; the schedule is the
recipe's (epochs x N / batch_size steps). Every point is resumable (the stage checkpoints its training)
and the results file is rewritten after each point, so a killed run goes on where it stopped.
`--cli` runs another tree's CLI (e.g. `--cli "/path/python -m trtbuild.cli" --cwd /path/tree`: the
tree whose cache keys made the pool). Prints a table, writes OUT/curve.json and OUT/curve.png, and the
data size at which a straight line through tau against log10(N) reaches `--target-tau`.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

KEPT = ("acceptance_length", "acceptance_rates", "eval_prompts", "eval_new_tokens", "eval_prompts_from",
        "train_steps", "train_seconds", "train_step_seconds", "train_loss", "pool_sequences", "pool_tokens",
        "draft_vocab_size", "vocab_coverage", "max_draft_len", "data_seconds")


def run_point(args: argparse.Namespace, samples: int, train_seed: int | None) -> dict[str, Any]:
    name = f"n{samples}" + ("" if train_seed is None else f"-seed{train_seed}")
    out_dir = (args.out / "builds" / name).resolve()
    sets = [f"draft.train_samples={samples}", f"output_dir={out_dir}"]
    if train_seed is not None:
        sets.append(f"draft.train_seed={train_seed}")
    command = [*shlex.split(args.cli), "build", str(Path(args.recipe).resolve()), "--until", "draft", "--json"]
    for item in sets + list(args.set):
        command += ["--set", item]
    print(f"[{name}] {' '.join(command)}", file=sys.stderr, flush=True)
    done = subprocess.run(command, cwd=args.cwd, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"error: point {name} failed (exit {done.returncode}); rerun to resume it")
    stage = next(s for s in json.loads((out_dir / "build.json").read_text())["stages"] if s["name"] == "draft")
    metrics = stage["metrics"]
    return {"name": name, "train_samples": samples, "train_seed": train_seed, "stage_seconds": stage["seconds"],
            "status": stage["status"], **{k: metrics.get(k) for k in KEPT}}


def crossing(points: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """Least squares of tau on log10(N) over the seed-0 points; N where the line reaches `target`."""
    xs = [math.log10(p["train_samples"]) for p in points if p["train_seed"] is None]
    ys = [p["acceptance_length"] for p in points if p["train_seed"] is None]
    if len(xs) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    intercept = my - slope * mx
    reach = None if slope <= 0 else 10 ** ((target - intercept) / slope)
    return {"slope_per_decade": slope, "intercept": intercept, "target_tau": target, "samples_at_target": reach}


def plot(points: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    main = sorted((p for p in points if p["train_seed"] is None), key=lambda p: p["train_samples"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot([p["train_samples"] for p in main], [p["acceptance_length"] for p in main], "o-", label="seed 0")
    spread = [p for p in points if p["train_seed"] is not None]
    left.plot([p["train_samples"] for p in spread], [p["acceptance_length"] for p in spread], "x",
              label="other train seeds")
    left.set(xscale="log", xlabel="answers trained on", ylabel="tau (tokens per target step)",
             title="acceptance length on held-out chat requests")
    left.legend()
    for p in main:
        rates = p["acceptance_rates"] or []
        right.plot(range(1, len(rates) + 1), rates, "o-", label=f"{p['train_samples']}")
    right.set(xlabel="draft position", ylabel="acceptance rate", title="acceptance by position",
              xticks=range(1, 1 + max((len(p["acceptance_rates"] or []) for p in main), default=1)))
    right.legend(title="answers")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--points", default="300,1000,3000,10000")
    parser.add_argument("--seeds-at", type=int, default=1000, help="the data size of the seed spread")
    parser.add_argument("--seeds", default="1,2", help="train seeds besides the recipe's, at --seeds-at")
    parser.add_argument("--target-tau", type=float, default=1.8)
    parser.add_argument("--cli", default=f"{sys.executable} -m trtbuild.cli")
    parser.add_argument("--cwd", type=Path, default=None)
    parser.add_argument("--set", action="append", default=[], help="more recipe overrides, as the CLI's")
    parser.add_argument("--out", type=Path, default=Path("build/draft-curve"))
    parser.add_argument("--largest-first", action="store_true",
                        help="train the largest size (the draft to ship) before the rest of the curve")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results_file = args.out / "curve.json"
    done = json.loads(results_file.read_text())["points"] if results_file.is_file() else []
    # ascending sizes, each size's other seeds right after it: the cheap half of the curve comes first
    seeds: list[int | None] = [None, *(int(s) for s in args.seeds.split(",") if s.strip())]
    sizes = sorted({int(n) for n in args.points.split(",")} | {args.seeds_at})
    if args.largest_first:
        sizes = [sizes[-1], *sizes[:-1]]
    todo = [(n, seed) for n in sizes for seed in (seeds if n == args.seeds_at else [None])]
    for samples, seed in todo:
        if any(p["train_samples"] == samples and p["train_seed"] == seed for p in done):
            continue
        done.append(run_point(args, samples, seed))
        report = {"recipe": args.recipe, "points": done, "fit": crossing(done, args.target_tau)}
        tmp = results_file.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        tmp.replace(results_file)
    plot(done, args.out / "curve.png")
    print(f"{'answers':>8} {'seed':>5} {'tau':>6}  by position          steps  train s")
    for p in sorted(done, key=lambda p: (p["train_samples"], p["train_seed"] or 0)):
        rates = " ".join(f"{r:.2f}" for r in p["acceptance_rates"] or [])
        print(f"{p['train_samples']:>8} {p['train_seed'] or 0:>5} {p['acceptance_length']:>6.3f}  {rates:<20} "
              f"{p['train_steps']:>5} {p['train_seconds']:>8}")
    fit = crossing(done, args.target_tau)
    if fit:
        at = fit["samples_at_target"]
        reached = [p["train_samples"] for p in done if p["acceptance_length"] >= args.target_tau]
        where = (f"N ~ {at:,.0f} answers" if at is not None else
                 f"measured from N = {min(reached)} on (the line is flat)" if reached else "never (flat or falling)")
        print(f"tau = {fit['intercept']:.3f} + {fit['slope_per_decade']:.3f} log10(N): tau {args.target_tau} at {where}")
    print(f"wrote {results_file} and {args.out / 'curve.png'}")


if __name__ == "__main__":
    main()
