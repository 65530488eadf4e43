#!/usr/bin/env python
"""Section 3 of scripts/gpu_check.sh: the draft stage's EAGLE-3 training step on CUDA, speed only.

A random-weight Llama of about 1B parameters (16 layers, hidden 2048, Llama-3 vocab) is converted by
ModelOpt into its EAGLE-3 model exactly as the draft stage does (`convert_to_eagle3`), then trained
by the stage's own loop (`train.train`) on random tokens: frozen target in bfloat16, draft in
float32 under bfloat16 autocast (what `draft.train.device: auto` picks on a GPU host). The step time
is the median of the steps after the warm-up ones, timed through the loop's progress callback.
Prints markdown lines.

    python scripts/gpu_draft_train_check.py            # CUDA, what gpu_check.sh runs
    python scripts/gpu_draft_train_check.py --dry-run  # CPU, tiny shapes, float32 (checks the script)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ONE_B = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
         "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 4096}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512, "max_position_embeddings": 512}


def say(line: str) -> None:
    print(line, flush=True)


def step_times(model, pool, args, device: str, autocast: str | None) -> list[float]:  # type: ignore[no-untyped-def]
    """Seconds of every step of one run of the stage's loop, read off its progress callback (called
    after each optimizer step, once the loss is on the host: on CUDA that is a synchronisation)."""
    from trtbuild.core.progress import Progress
    from trtbuild.draft.train import TrainPlan, train

    class Clock(Progress):
        def __init__(self) -> None:
            super().__init__()
            self.marks = [time.perf_counter()]

        def _advance(self, task_id, n, fields):  # type: ignore[no-untyped-def]
            if n:
                self.marks.append(time.perf_counter())

    plan = TrainPlan(steps=args.warm_steps + args.steps, batch_size=args.batch_size, lr=1e-4, seed=0,
                     warmup_steps=1, checkpoint_every=10**8, device=device, autocast=autocast)
    clock = Clock()
    with tempfile.TemporaryDirectory() as resume:
        train(model, pool, plan, Path(resume), clock)
    return [b - a for a, b in zip(clock.marks, clock.marks[1:], strict=False)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--warm-steps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()

    import torch

    if args.dry_run:
        device, autocast, shape = "cpu", None, TINY
        args.seq_len = min(args.seq_len, 64)
    else:
        if not torch.cuda.is_available():
            say("no CUDA device")
            return 3
        device, autocast, shape = "cuda", "bfloat16", ONE_B
    try:
        import modelopt.torch.speculative  # noqa: F401
    except ImportError:
        say("- skipped: nvidia-modelopt is not importable here (the draft stage trains with it)")
        return 0
    from transformers import LlamaConfig, LlamaForCausalLM

    from trtbuild.draft.format import default_aux_layers
    from trtbuild.draft.model import DraftArch, convert_to_eagle3

    torch.manual_seed(0)
    config = LlamaConfig(**shape, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    with torch.device(device):  # random init on the GPU itself: seconds, not the CPU's minute for 1B
        target = LlamaForCausalLM._from_config(config, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    params = sum(p.numel() for p in target.parameters())
    arch = DraftArch(aux_layers=default_aux_layers(shape["num_hidden_layers"]),
                     draft_vocab_size=shape["vocab_size"])
    model = convert_to_eagle3(target, arch, None)
    model.eagle_module.float()
    pool = torch.randint(3, shape["vocab_size"], (args.batch_size * (args.warm_steps + args.steps), args.seq_len))
    measured = sorted(step_times(model, pool, args, device, autocast)[args.warm_steps:])
    per_step = measured[len(measured) // 2]  # the median step after the warm-up steps
    tokens = args.batch_size * args.seq_len
    where = "CUDA, bf16 target, float32 draft under bf16 autocast" if device == "cuda" else "CPU dry run, float32"
    say(f"- target: random Llama, {params / 1e9:.2f} B parameters ({shape['num_hidden_layers']} layers, hidden "
        f"{shape['hidden_size']}, vocab {shape['vocab_size']}); {where}; batch {args.batch_size} x "
        f"{args.seq_len} tokens; the draft stage's loop (ModelOpt HFEagleModel, {arch.ttt_steps} TTT steps)")
    say("")
    say("| draft training | ms/step | tokens/s | peak GPU memory |")
    say("|---|---|---|---|")
    memory = f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if device == "cuda" else "n/a"
    say(f"| one process, {device} | {per_step * 1e3:.1f} | {tokens / per_step:,.0f} | {memory} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
