"""Online vs offline EAGLE-3 training side by side: tau over seeds, dump time, train step time.

    python bench/draft_offline.py TARGET_HF_DIR OUT_DIR [--seeds 0,1,2] [--steps 60] [--samples 96]
        [--seq-len 64] [--timing-steps 20] [--timing-only]

For each seed the draft stage runs online, then offline (the same data set: its key holds no
training setting, so the second run reuses it and adds the hidden-state dump). Then the two training
steps are timed interleaved on the same batches (one online step, one offline step, the order
swapped every step), so a busy machine slows both alike; the ratio is what this prints. The cache is OUT_DIR/cache.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from trtbuild.core.recipe_info import RecipeInfo


def _Recipe() -> RecipeInfo:
    return RecipeInfo.standalone()


def _config(args: argparse.Namespace, seed: int, mode: str):  # type: ignore[no-untyped-def]
    from trtbuild.draft.config import DraftConfig

    return DraftConfig(samples=args.samples, steps=args.steps, batch_size=8, seq_len=args.seq_len, prompt_len=16,
                       distill_fraction=1.0, aux_layers=[0, 1, 2], max_draft_len=3, shard_samples=32, seed=seed,
                       hidden_states=mode, eval={"prompts": 8, "prompt_len": 32, "new_tokens": 32})


def _stage_runs(args: argparse.Namespace, model) -> list[dict]:  # type: ignore[no-untyped-def]
    from trtbuild.core.progress import Progress
    from trtbuild.core.stage import StageContext
    from trtbuild.draft.stage import DraftStage

    rows = []
    for seed in args.seeds:
        for mode in ("online", "offline"):
            out = args.out / f"{mode}-{seed}"
            out.mkdir(parents=True)
            started = time.perf_counter()
            ctx = StageContext(recipe=_Recipe(), inputs={"model": model}, out_dir=out, progress=Progress())
            metrics = DraftStage().run(_config(args, seed, mode), ctx).metrics
            rows.append({"seed": seed, "mode": mode, "tau": metrics["acceptance_length"],
                         "loss": metrics["train_loss"], "data_s": metrics["data_seconds"],
                         "dump_s": metrics.get("dump_seconds"), "step_s": metrics["train_step_seconds"],
                         "wall_s": round(time.perf_counter() - started, 1)})
            print(rows[-1], flush=True)
    return rows


def _interleaved_steps(args: argparse.Namespace, target: Path) -> tuple[list[float], list[float]]:
    """Seconds per training step (forward, backward, optimizer), online and offline, alternating."""
    import torch

    from trtbuild.draft.draft_data import load_pool
    from trtbuild.draft.hidden_store import HiddenStore, load_head_only
    from trtbuild.draft.model import DraftArch, convert_to_eagle3, draft_parameters, load_target

    cache = args.out / "cache"
    data_entry = next(p for p in (cache / "draft-data").iterdir() if not p.name.startswith("."))
    hidden_entry = next(p for p in (cache / "draft-hidden").iterdir() if not p.name.startswith("."))
    pool, store = load_pool(data_entry), HiddenStore(hidden_entry)
    vocab = int(load_target(target).config.vocab_size)
    arch = DraftArch(aux_layers=[0, 1, 2], draft_vocab_size=vocab)
    models = {"online": convert_to_eagle3(load_target(target), arch, None),
              "offline": convert_to_eagle3(load_head_only(target), DraftArch(**{**arch.__dict__, "offline": True}),
                                           None)}
    optims = {m: torch.optim.AdamW(draft_parameters(model), lr=1e-4) for m, model in models.items()}
    times: dict[str, list[float]] = {"online": [], "offline": []}
    generator = torch.Generator().manual_seed(0)
    for step in range(args.timing_steps):
        rows = torch.randint(0, len(pool), (8,), generator=generator)
        order = list(models.items()) if step % 2 == 0 else list(models.items())[::-1]  # neither always first
        for mode, model in order:
            model.train()
            started = time.perf_counter()
            inputs = store.batch(rows) if mode == "offline" else {"input_ids": pool[rows]}
            model(**inputs).loss.backward()
            optims[mode].step()
            optims[mode].zero_grad(set_to_none=True)
            times[mode].append(time.perf_counter() - started)
    return times["online"], times["offline"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target", type=Path, help="the target's HF directory")
    parser.add_argument("out", type=Path)
    parser.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--timing-steps", type=int, default=20)
    parser.add_argument("--timing-only", action="store_true", help="only the interleaved step timing, on "
                        "the shard sets an earlier run left in OUT")
    args = parser.parse_args()
    os.environ["TRTBUILD_CACHE"] = str(args.out / "cache")
    if args.timing_only:  # the step timing again, on the shard sets of an earlier run into OUT
        _print_timing(args, *_interleaved_steps(args, args.target))
        return
    args.out.mkdir(parents=True, exist_ok=False)
    model_dir = args.out / "model"
    model_dir.mkdir()
    (model_dir / "hf").symlink_to(args.target.resolve())
    from trtbuild.core.stage import Artifact

    rows = _stage_runs(args, Artifact("model", "bench-target", model_dir))
    online, offline = _interleaved_steps(args, args.target)

    print("\n| seed | tau online | tau offline | data s | dump s | step s online | step s offline |")
    print("|---|---|---|---|---|---|---|")
    for seed in args.seeds:
        on = next(r for r in rows if r["seed"] == seed and r["mode"] == "online")
        off = next(r for r in rows if r["seed"] == seed and r["mode"] == "offline")
        print(f"| {seed} | {on['tau']} | {off['tau']} | {on['data_s']} | {off['dump_s']} | {on['step_s']} | "
              f"{off['step_s']} |")
    taus = [r["tau"] for r in rows if r["mode"] == "online"]
    print(f"\nonline tau spread over seeds {args.seeds}: {min(taus)} .. {max(taus)}")
    _print_timing(args, online, offline)


def _print_timing(args: argparse.Namespace, online: list[float], offline: list[float]) -> None:
    med_on, med_off = statistics.median(online), statistics.median(offline)
    print(f"interleaved train step, median of {args.timing_steps}: online {med_on:.4f} s, offline "
          f"{med_off:.4f} s, online/offline {med_on / med_off:.2f}x")


if __name__ == "__main__":
    main()
