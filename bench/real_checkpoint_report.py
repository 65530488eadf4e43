"""One run on the real third-party checkpoint: build every stage, then measure what issue 25 asks for.

    python bench/real_checkpoint_report.py [--recipe bench/smollm2-report.yaml] [--set field=value ...]
        [--prompts 8] [--new 64] [--draft-len 1 2 3] [--ppl-windows 16] [--threads N] [--out report.json]

1. `trtbuild build RECIPE --json` with model.path at the SmolLM2-135M-Instruct fixture
   (tests/real_checkpoint.py): per-stage wall seconds, and the draft stage's own steps (data,
   hidden-state dump, training, evaluation) with its τ on held-out chat prompts. A stage found in the
   cache reports the seconds it took when it ran (status `cached`). Point TRTBUILD_CACHE at an
   empty directory for a build from nothing.
2. FP8 perplexity ratio of the build's export against the unquantized checkpoint, both computed by
   the runtime the served CPU model uses, on pydoc's held-out split and on the held-out chat
   requests rendered with the chat template (plus the quantize gate's own figure: ModelOpt's
   fake-quant model on the gate's text).
3. bench/peer_real_checkpoint.py's comparison with the build's export and draft: plain decoding vs
   transformers bf16 `generate`, EAGLE-3 and n-gram τ and speed per chain length, prompt lookup.

Prints a markdown report; --out writes everything as JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench")]
CHAT_EVAL = ROOT / "tests" / "data" / "chat_eval.jsonl"


def build(recipe: Path, model_dir: Path, overrides: list[str]) -> dict[str, Any]:
    """The build's JSON report (stdout of `trtbuild build --json`, which draws no progress bars)."""
    command = [str(Path(sys.executable).parent / "trtbuild"), "build", str(recipe), "--json",
               "--set", f"model.path={model_dir}"]
    for override in overrides:
        command += ["--set", override]
    started = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    report = json.loads(done.stdout)
    report["wall_seconds"] = round(time.perf_counter() - started, 1)
    if done.returncode != 0:
        raise SystemExit(f"build failed (exit {done.returncode}): {json.dumps(report)[:2000]}")
    return report


def perplexities(model_dir: Path, fp8_dir: Path, windows: int, seq_len: int) -> dict[str, Any]:
    """FP8 / base perplexity on pydoc (held-out) and chat text, both through trtbuild's runtime."""
    from transformers import AutoTokenizer

    from trtbuild.core.data import sources
    from trtbuild.quantize import evaluation
    from trtbuild.runtime import load_target

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    texts = {"pydoc (held-out split)": (sources.TextSource.model_validate("pydoc"), seq_len, windows),
             "chat (held-out requests, chat template)": (sources.TextSource.model_validate(str(CHAT_EVAL)), 128, None)}
    models = {"base": load_target(model_dir), "fp8": load_target(fp8_dir)}
    out: dict[str, Any] = {}
    for name, (source, length, count) in texts.items():
        records = sources.load_texts(source, "eval", tokenizer=tokenizer)
        ids = sources.sequential_windows(tokenizer, records, length, count, bos=True, separator=sources.joiner(source))
        ppl = {m: evaluation.perplexity(model.logits, ids, batch_size=4) for m, model in models.items()}
        out[name] = {"windows": int(ids.shape[0]), "seq_len": length, "predicted_tokens": ppl["base"].tokens,
                     "base": round(ppl["base"].value, 4), "fp8": round(ppl["fp8"].value, 4),
                     "ratio": round(ppl["fp8"].value / ppl["base"].value, 4)}
    return out


def artifact(report: dict[str, Any], stage: str) -> Path:
    found = next(s for s in report["stages"] if s["name"] == stage)
    return Path(found["artifact"])


def markdown(result: dict[str, Any]) -> str:
    from peer_real_checkpoint import FP8_PLAIN

    lines = ["## Build (per stage)", "", "| stage | status | seconds | detail |", "|---|---|---:|---|"]
    for stage in result["build"]["stages"]:
        m = stage.get("metrics") or {}
        detail = ""
        if stage["name"] == "draft":
            steps = ("data_seconds", "dump_seconds", "train_seconds", "eval_seconds")
            detail = ", ".join(f"{k.split('_')[0]} {m[k]}" for k in steps if k in m)
            detail += (f"; τ {m.get('acceptance_length')} on held-out chat prompts, acceptance by position "
                       f"{m.get('acceptance_rates')}")
        if stage["name"] == "quantize" and "perplexity_ratio" in m:
            detail = f"gate ratio {m['perplexity_ratio']:.4f} (ModelOpt fake quant); export check {m.get('export_check')}"
        lines.append(f"| {stage['name']} | {stage['status']} | {stage['seconds']} | {detail} |")
    lines.append(f"| build wall (process included) | | {result['build']['wall_seconds']} | |")
    lines += ["", "## FP8 perplexity (trtbuild runtime, FP8 export vs unquantized)", "",
              "| text | windows x tokens | base | FP8 | ratio |", "|---|---|---:|---:|---:|"]
    for text, p in result["perplexity"].items():
        lines.append(f"| {text} | {p['windows']} x {p['seq_len']} | {p['base']} | {p['fp8']} | {p['ratio']} |")
    bench = result["bench"]
    plain = next(r for r in bench["rows"] if r["mode"] == FP8_PLAIN)["tokens_per_s"]
    lines += ["", f"## Decoding: {bench['prompts']} held-out chat prompts x {bench['new_tokens']} tokens, "
              f"{bench['threads']} threads", "",
              "| mode | tokens/s | vs transformers bf16 | vs trtbuild FP8 plain | τ | tokens as reference |",
              "|---|---:|---:|---:|---:|---|"]
    for r in bench["rows"]:
        lines.append(f"| {r['mode']} | {r['tokens_per_s']} | {r['vs_transformers_bf16']:.3f} | "
                     f"{r['tokens_per_s'] / plain:.3f} | {r['tau']} | {r['tokens_equal_to_reference']} |")
    return "\n".join(lines)


def main() -> None:
    from peer_real_checkpoint import compare
    from real_checkpoint import smollm2_dir

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", type=Path, default=ROOT / "bench" / "smollm2-report.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--draft-len", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--ppl-windows", type=int, default=16, help="pydoc windows of --ppl-seq-len tokens")
    parser.add_argument("--ppl-seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None, help="torch threads of the measurements (default: torch's)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model_dir = smollm2_dir()
    result: dict[str, Any] = {"build": build(args.recipe, model_dir, args.overrides)}
    fp8_dir = artifact(result["build"], "quantize") / "hf"
    draft_dir = artifact(result["build"], "draft") / "eagle3"
    result["perplexity"] = perplexities(model_dir, fp8_dir, args.ppl_windows, args.ppl_seq_len)
    result["bench"] = compare(args.prompts, args.new, 1, fp8_dir, draft_dir, args.draft_len, before=False)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str))
    print(markdown(result))


if __name__ == "__main__":
    main()
