"""In-flight batching through `serve`'s OpenAI front: this tree against an older commit, side by side.

    git worktree add /tmp/old 65149ab
    python bench/serve_batching.py --old /tmp/old --rounds 9
    python bench/serve_batching.py --old /tmp/old --fp8 --from-build build/tiny-cpu   # the recipe's own draft

Both trees build the same deployment with their own code (the repository's model.py is each tree's
copy): a tiny model and an EAGLE-3 draft trained once, briefly, by this tree, served by the local
Triton model with recipes/tiny-cpu.yaml's draft_len_schedule (--fp8 quantizes the target as that
recipe does; --no-draft decodes without speculation). Both `serve`s run at once on free ports. Each
round measures, old and new alternately (which goes first alternates too): one completion of
--tokens tokens alone, and --concurrency completions of --tokens tokens sent at once. Reported per
tree: the medians, and the batch's throughput as a multiple of one stream's (concurrency x alone /
batch time); then new/old ratios of the medians. Timings on a shared machine are noisy: compare
the ratios of one run, not absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
PROMPT = "def parse(text):"
MODEL = "name: batching-model\noutput_dir: out\nmodel:\n  source: tiny\n  tiny: {steps: 40, seq_len: 64, processes: 1}\n"
DRAFT = """  source: train
  max_draft_len: 5
  draft_vocab_size: 1024
  samples: 64
  seq_len: 64
  batch_size: 8
  steps: 30
  aux_layers: [1, 3, 5]
  eval: {prompts: 0}
"""
RECIPE = """name: batching
output_dir: out
model:
  source: path
  path: {model}
{quantize}{draft}engine: {{backend: pytorch, max_batch_size: 8}}
deploy:
  target: [local]
  local: {{num_threads: 1{schedule}}}
"""
FP8 = """quantize:  # FP8 as in recipes/tiny-cpu.yaml; the gate only has to pass on a briefly trained model
  calibration: {num_samples: 16, seq_len: 64}
  gate: {max_perplexity_ratio: 1000, eval_samples: 4, seq_len: 64}
"""
# The module is chosen by the tree's layout on disk, not by trying imports: the .venv's editable install
# finds trtbuild.serve in this repository for an old tree that lacks it.
SERVE = ("import sys\nfrom pathlib import Path\nfrom {module} import serve_deployment\n"
         "sys.exit(serve_deployment(Path(sys.argv[1]), http_port=0, grpc_port=0, metrics_port=0, "
         "openai_port=int(sys.argv[2])))")


def _serve_module(tree: Path) -> str:
    return "trtbuild.serve.commands" if (tree / "trtbuild" / "serve").is_dir() else "trtbuild.triton.commands"


def _env(tree: Path, cache: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree), "TRTBUILD_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}


def _build(tree: Path, recipe: Path, cache: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", "from trtbuild.cli import main; main()", "build", str(recipe),
                           "--json"], env=_env(tree, cache), capture_output=True, text=True, cwd=recipe.parent)
    if done.returncode != 0:
        sys.exit(f"build with {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def _artifact(report: dict, stage: str) -> Path:
    return Path(next(s["artifact"] for s in report["stages"] if s["name"] == stage))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Served:
    def __init__(self, name: str, tree: Path, deploy: Path, cache: Path) -> None:
        self.name, self.port = name, _free_port()
        script = SERVE.format(module=_serve_module(tree))
        self.proc = subprocess.Popen([sys.executable, "-c", script, str(deploy), str(self.port)],
                                     env=_env(tree, cache), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True,
                                     cwd=tree)  # `-c` puts the cwd first on sys.path: it must be this tree
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stdout.readline, "")), daemon=True).start()
        deadline = time.monotonic() + 300
        while not any("OpenAI " in line for line in self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"{name} serve did not start:\n" + "".join(self.lines)[-3000:])
            time.sleep(0.2)
        self.model = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models").read())["data"][0]["id"]

    def complete(self, tokens: int) -> int:
        body = json.dumps({"model": self.model, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            return int(json.loads(response.read())["usage"]["completion_tokens"])

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def pids(self) -> str:
        """serve's pid and tritonserver's (its model process is tritonserver's child)."""
        found = re.findall(r"ready \(pid (\d+)\)", "".join(self.lines))
        return f"serve {self.proc.pid}, tritonserver {found[0] if found else '?'}"


def _timed(served: Served, tokens: int, concurrency: int, pool: ThreadPoolExecutor) -> tuple[float, float, int]:
    started = time.perf_counter()
    one = served.complete(tokens)
    alone = time.perf_counter() - started
    started = time.perf_counter()
    counts = list(pool.map(lambda _: served.complete(tokens), range(concurrency)))
    batch = time.perf_counter() - started
    return alone, batch, min([one, *counts])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, required=True, help="worktree of the older commit")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--workdir", type=Path, default=None, help="kept between runs (the builds are reused)")
    parser.add_argument("--draft", action=argparse.BooleanOptionalAction, default=True,
                        help="speculate with an EAGLE-3 draft (trained here, briefly) as recipes/tiny-cpu.yaml does")
    parser.add_argument("--fp8", action=argparse.BooleanOptionalAction, default=False,
                        help="quantize the target to FP8 first (recipes/tiny-cpu.yaml does; ~5x slower on CPU)")
    parser.add_argument("--from-build", type=Path, default=None,
                        help="serve this build's model and draft instead of training them briefly (the output_dir "
                        "of `trtbuild build recipes/tiny-cpu.yaml`: its model/hf and draft/eagle3, the recipe's "
                        "fully trained draft)")
    parser.add_argument("--hold", type=float, default=0.0, help="seconds to keep both servers up before "
                        "measuring (to attach a profiler: their pids are printed)")
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="trtbuild-batching-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.from_build is not None:
        model, eagle3 = args.from_build.resolve() / "model" / "hf", args.from_build.resolve() / "draft" / "eagle3"
    else:
        (work / "model.yaml").write_text(MODEL)
        if args.draft:  # trained once, by this tree, like the model: both trees serve the same weights
            (work / "model.yaml").write_text(MODEL + "draft:\n" + DRAFT)
        built = _build(HERE, work / "model.yaml", work / "cache-new")
        model = _artifact(built, "model") / "hf"
        eagle3 = _artifact(built, "draft") / "eagle3" if args.draft else model
    draft = (f"draft: {{source: path, path: {eagle3}, max_draft_len: 5}}\n"
             if args.draft else "draft: {source: none}\n")
    schedule = ', draft_len_schedule: {"4": 5, "8": 4}' if args.draft else ""  # recipes/tiny-cpu.yaml's
    (work / "recipe.yaml").write_text(RECIPE.format(model=model, quantize=FP8 if args.fp8 else "", draft=draft,
                                                    schedule=schedule))
    trees = {"old": args.old.resolve(), "new": HERE}
    servers: dict[str, Served] = {}
    try:
        for name, tree in trees.items():
            deploy = _artifact(_build(tree, work / "recipe.yaml", work / f"cache-{name}"), "deploy")
            servers[name] = Served(name, tree, deploy, work / f"cache-{name}")
            print(f"{name}: {tree} ({servers[name].pids()})", flush=True)
        time.sleep(args.hold)
        results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in trees}
        with ThreadPoolExecutor(args.concurrency) as pool:
            for served in servers.values():  # warm-up: first requests load lazily
                _timed(served, args.tokens, args.concurrency, pool)
            for round_index in range(args.rounds):
                order = ["old", "new"] if round_index % 2 == 0 else ["new", "old"]
                for name in order:
                    results[name].append(_timed(servers[name], args.tokens, args.concurrency, pool))
                line = "  ".join(f"{n}: alone {results[n][-1][0]:.3f} s, {args.concurrency} at once "
                                 f"{results[n][-1][1]:.3f} s" for n in trees)
                print(f"round {round_index + 1}: {line}", flush=True)
        medians = {}
        for name, rows in results.items():
            alone = statistics.median(r[0] for r in rows)
            batch = statistics.median(r[1] for r in rows)
            speedup = statistics.median(args.concurrency * r[0] / r[1] for r in rows)
            medians[name] = (alone, batch, speedup)
            print(f"{name}: median alone {alone:.3f} s, {args.concurrency} at once {batch:.3f} s; "
                  f"batch throughput {speedup:.2f}x one stream's (fewest tokens in a reply: "
                  f"{min(r[2] for r in rows)})")
        old, new = medians["old"], medians["new"]
        print(f"new/old: alone {new[0] / old[0]:.2f}, {args.concurrency} at once {new[1] / old[1]:.2f}, "
              f"batch throughput multiple {new[2] / old[2]:.2f}")
    finally:
        for served in servers.values():
            served.stop()
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
