"""AIPerf through NVIDIA Dynamo (1 and 2 workers) and through the Triton path, same deployment, same prompts,
same run: `bench --server`'s AIPerf load (trtbuild.serve.commands.bench_openai) against each OpenAI endpoint in
turn, in rounds whose order alternates (T, D1, D2, then D2, D1, T, ...) so drift on the shared machine falls on
every server alike. Prints and writes medians over rounds per server and concurrency, and the ratios.

    .venv/bin/python bench/dynamo_serving.py build/tiny-cpu/deploy --rounds 2 --out build/dynamo-serving.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from trtbuild.serve.commands import bench_openai, default_prompts, local_model_dir, openai_front, read_deployment
from trtbuild.serve.dynamo.server import DynamoServe, remove_stale_state
from trtbuild.serve.server import TritonServer

METRICS = ("tokens_per_s_per_user", "tokens_per_s_per_user_p50", "ttft_ms_p50", "itl_ms_p50", "throughput_tokens_per_s", "errors")


def run_triton(deploy: Path, prompts: list[str], levels: list[int], max_tokens: int, out: Path) -> dict[str, Any]:
    model_dir, info = local_model_dir(deploy)
    with TritonServer([model_dir.parent], http_port=0, grpc_port=0, metrics_port=0,
                      exit_timeout_s=info.get("exit_timeout_s", 30)) as server, \
            openai_front(model_dir, 0)(server) as front_lines:
        url = front_lines[0].split()[1]
        return bench_openai(deploy, url, concurrency=levels, max_tokens=max_tokens, prompts=prompts, baseline=False,
                            out_dir=out)


def run_dynamo(deploy: Path, workers: int, prompts: list[str], levels: list[int], max_tokens: int,
               out: Path) -> dict[str, Any]:
    model_dir, info = local_model_dir(deploy)
    remove_stale_state()
    served = DynamoServe(model_dir, str(info["model_name"]), workers=workers, http_port=0,
                         exit_timeout_s=int(info.get("exit_timeout_s", 30)))
    try:
        served.start(ready_timeout_s=600)
        return bench_openai(deploy, served.url, concurrency=levels, max_tokens=max_tokens, prompts=prompts,
                            baseline=False, out_dir=out)
    finally:
        served.stop()
        served.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("deploy", type=Path, help="a built deployment directory with a local repository")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("build/dynamo-serving.json"))
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    prompts = default_prompts(32)
    read_deployment(args.deploy)
    servers = {"triton": lambda out: run_triton(args.deploy, prompts, levels, args.max_tokens, out),
               "dynamo-1": lambda out: run_dynamo(args.deploy, 1, prompts, levels, args.max_tokens, out),
               "dynamo-2": lambda out: run_dynamo(args.deploy, 2, prompts, levels, args.max_tokens, out)}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
    work = args.out.parent / (args.out.stem + "-runs")
    for round_no in range(args.rounds):
        order = list(servers) if round_no % 2 == 0 else list(reversed(servers))
        for name in order:
            started = time.monotonic()
            report = servers[name](work / f"r{round_no}-{name}")
            runs[name].append({row["concurrency"]: {m: row[m] for m in METRICS} for row in report["levels"]})
            print(f"round {round_no} {name}: {time.monotonic() - started:.0f} s "
                  + "; ".join(f"c{c} {r['tokens_per_s_per_user_p50']:.1f} tok/s/user p50, TTFT {r['ttft_ms_p50']:.0f} ms, "
                              f"{r['errors']} errors" for c, r in runs[name][-1].items()), flush=True)
    medians = {name: {c: {m: statistics.median(run[c][m] for run in rs) for m in METRICS} for c in levels}
               for name, rs in runs.items()}
    # p50, not AIPerf's mean: a stream whose tokens arrive in one burst has a near-zero decode time and an
    # enormous per-user rate, which dominates the mean (the Triton path at concurrency 1 here: 60911 tokens/s).
    ratios = {c: {"dynamo-1/triton tokens/s/user p50": medians["dynamo-1"][c]["tokens_per_s_per_user_p50"]
                  / medians["triton"][c]["tokens_per_s_per_user_p50"],
                  "dynamo-2/dynamo-1 throughput": medians["dynamo-2"][c]["throughput_tokens_per_s"]
                  / medians["dynamo-1"][c]["throughput_tokens_per_s"],
                  "dynamo-1/triton TTFT p50": medians["dynamo-1"][c]["ttft_ms_p50"] / medians["triton"][c]["ttft_ms_p50"]}
              for c in levels}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"levels": levels, "max_tokens": args.max_tokens, "prompts": len(prompts),
                                    "rounds": args.rounds, "runs": runs, "medians": medians, "ratios": ratios},
                                   indent=2) + "\n")
    for c in levels:
        print(f"c{c}: " + "  ".join(f"{name} {medians[name][c]['tokens_per_s_per_user_p50']:.1f} tok/s/user p50 "
                                    f"(TTFT {medians[name][c]['ttft_ms_p50']:.0f} ms, "
                                    f"{medians[name][c]['throughput_tokens_per_s']:.0f} tok/s, "
                                    f"{medians[name][c]['errors']:.0f} err)" for name in servers)
              + "  " + ", ".join(f"{k} {v:.2f}" for k, v in ratios[c].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
