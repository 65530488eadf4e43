"""The load generator's figures as a table, the in-process runtime's beside them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

COLUMNS = ("concurrency", "requests", "throughput tok/s", "tok/s/user", "TTFT p50 ms", "TTFT p90 ms",
           "TTFT p99 ms", "ITL p50 ms", "ITL p90 ms", "ITL p99 ms", "errors")


def rows(report: dict[str, Any]) -> list[list[str]]:
    out = [list(COLUMNS)]
    for row in report["levels"]:
        out.append([str(row["concurrency"]), str(row["requests"]), f"{row['throughput_tokens_per_s']:.1f}",
                    f"{row['tokens_per_s_per_user']:.1f}", f"{row['ttft_ms_p50']:.1f}", f"{row['ttft_ms_p90']:.1f}",
                    f"{row['ttft_ms_p99']:.1f}", f"{row['itl_ms_p50']:.2f}", f"{row['itl_ms_p90']:.2f}",
                    f"{row['itl_ms_p99']:.2f}", str(row["errors"])])
    base = report.get("in_process")
    if base:
        out.append(["in-process", str(base["requests"]), "", f"{base['tokens_per_s_per_user']:.1f}",
                    f"{base['ttft_ms_p50']:.1f}", f"{base['ttft_ms_p90']:.1f}", "", f"{base['itl_ms_p50']:.2f}",
                    f"{base['itl_ms_p90']:.2f}", "", ""])
    return out


def print_report(report: dict[str, Any], echo: Callable[[str], None] = print) -> None:
    table = rows(report)
    widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]
    echo(f"AIPerf against {report['url']} (model {report['model']}, {report['max_tokens']} tokens per request, "
         "streaming chat, greedy); in-process: the runtime alone, one request at a time")
    for r in table:
        echo("  ".join(cell.rjust(width) for cell, width in zip(r, widths, strict=True)))
    crit = report.get("criteria") or {}
    if "throughput_c8_over_c1" in crit:
        echo(f"concurrency 8 vs 1: throughput {crit['throughput_c8_over_c1']:.2f}x, "
             f"TTFT p50 {crit['ttft_p50_c8_over_c1']:.2f}x")
    if "errors_c32" in crit:
        echo(f"errors at concurrency 32: {crit['errors_c32']}")
    if "ratio_c1" in report:
        echo(f"served / in-process tokens/s/user at concurrency 1: {report['ratio_c1']:.3f}")
