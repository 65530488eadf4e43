"""The offline draft's hidden-state dump on this CPU: the whole causal LM (as the dump ran until
2026-12-06) against the decoder alone, in float32 and under bf16 autocast, side by side in one run
(issue 34: the dump is the long run's third cost).

    python bench/draft_hidden_dump.py TARGET_HF_DIR [--data SHARD.safetensors] [--rows 32]

Rows: the first `--rows` of a draft data shard (`input_ids`, what the stage dumps), or else chat requests
(tests/data/chat_train.jsonl) continued greedily by the target to 256 tokens. Each setting captures the
draft's three default aux layers and the final hidden state of the same rows, after a warm-up. Prints
seconds per 128-row shard, the speedup over the whole LM, and what bf16 costs in accuracy against float32
compute: relative error of the stored tensors, and how often the target's top-1 token from the final
hidden state (the draft's label) agrees, beside what storing float32's result in bf16 alone gives.
One JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

SHARD_ROWS = 128


def whole_lm_capture(target: Any, input_ids: torch.Tensor, aux_layers: list[int]) -> dict[str, torch.Tensor]:
    """The dump's forward before 2026-12-06: the causal LM with output_hidden_states (lm_head and logits too)."""
    from trtbuild.draft.hidden import AUX, FINAL, FORWARD_ROWS

    layers = target.get_decoder().layers
    captured: list[torch.Tensor] = []
    handles = [layers[i].register_forward_hook(lambda m, a, o: captured.append(o[0] if isinstance(o, tuple) else o))
               for i in sorted(aux_layers)]
    aux, final = [], []
    with torch.no_grad():
        for start in range(0, len(input_ids), FORWARD_ROWS):
            captured.clear()
            out = target(input_ids=input_ids[start:start + FORWARD_ROWS], output_hidden_states=True)
            aux.append(torch.cat(captured, dim=-1))
            final.append(out.hidden_states[-1])
    for handle in handles:
        handle.remove()
    return {AUX: torch.cat(aux), FINAL: torch.cat(final)}


def rows_to_dump(target_dir: Path, data: Path | None, rows: int, seq_len: int = 256) -> torch.Tensor:
    if data is not None:
        from safetensors.torch import load_file

        return load_file(str(data))["input_ids"][:rows]
    from draft_generation import chat_prompts

    from trtbuild.draft.data import greedy_fill, load_target

    return greedy_fill(load_target(target_dir), chat_prompts(target_dir, rows), seq_len)


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return float((value.float() - reference).norm() / reference.norm())


def main() -> None:
    from trtbuild.draft.data import load_target
    from trtbuild.draft.format import default_aux_layers
    from trtbuild.draft.hidden import AUX, FINAL, capture

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", type=Path)
    parser.add_argument("--data", type=Path, help="a draft data shard (input_ids); default: chat requests answered now")
    parser.add_argument("--rows", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(2)
    target = load_target(args.target)
    aux_layers = default_aux_layers(target.config.num_hidden_layers)
    ids = rows_to_dump(args.target, args.data, args.rows)
    settings = {
        "whole LM float32": lambda rows: whole_lm_capture(target, rows, aux_layers),
        "decoder float32": lambda rows: capture(target, rows, aux_layers, compute="float32"),
        "decoder bf16 autocast": lambda rows: capture(target, rows, aux_layers, compute="bfloat16"),
    }
    results: dict[str, dict[str, float]] = {}
    outputs: dict[str, dict[str, torch.Tensor]] = {}
    for name, run in settings.items():
        run(ids[:2, :32])  # warm-up
        start = time.perf_counter()
        outputs[name] = run(ids)
        seconds = time.perf_counter() - start
        results[name] = {"seconds_per_shard": round(seconds * SHARD_ROWS / len(ids), 1)}
    reference = outputs["decoder float32"]
    with torch.no_grad():
        labels = target.lm_head(reference[FINAL]).argmax(-1)
        for name, result in results.items():
            result["speedup"] = round(results["whole LM float32"]["seconds_per_shard"] / result["seconds_per_shard"], 2)
            result["aux_rel_error"] = round(relative_error(outputs[name][AUX], reference[AUX]), 5)
            result["final_rel_error"] = round(relative_error(outputs[name][FINAL], reference[FINAL]), 5)
            stored = outputs[name][FINAL].bfloat16().float()
            result["top1_agree_stored_bf16"] = round(float((target.lm_head(stored).argmax(-1) == labels)
                                                           .float().mean()), 4)
    print(f"{len(ids)} rows x {ids.shape[1]} tokens, aux layers {aux_layers}; errors against decoder float32")
    for name, result in results.items():
        print(f"{name:>22}: {result}")
    print(json.dumps({"target": str(args.target), "rows": len(ids), "seq_len": ids.shape[1],
                      "aux_layers": aux_layers, "settings": results}))


if __name__ == "__main__":
    main()
