"""The FSDP2-sharded target of online draft training, built without any rank holding all of it.

Loading the whole checkpoint on every rank and sharding it afterwards puts one full copy per rank in
host memory (8 per node): for the models sharding exists for, more than a node has. Here the target
is built with its parameters on the meta device (no memory; buffers such as RoPE's inverse
frequencies are computed for real), converted to EAGLE-3 and sharded there (eagle3/sharding.py);
then each rank allocates its own shards and reads just those rows from the safetensors files
(`safe_open(...).get_slice`: a memory-mapped read of the rows asked for). Embeddings, final norm and
lm_head stay whole (see sharding.py) and are read whole. The draft starts from the stage's init
weights, as in the unsharded path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from trtbuild.core.fsdp_shards import materialize, read_target_weights  # shared with the quantize ranks


def build_sharded_target(target_dir: Path, dtype: torch.dtype, arch: Any, init: dict[str, torch.Tensor],
                         device: str) -> tuple[nn.Module, dict[str, int]]:
    """The converted model with its decoder layers FSDP2-sharded over the default process group,
    target weights read shard by shard, the draft loaded from `init`. Returns it and what this rank
    read (target_bytes_read_per_rank) next to the shard counts of sharding.shard_target."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    from trtbuild.core.fsdp_shards import shard_target
    from trtbuild.draft.model import convert_to_eagle3

    config = AutoConfig.from_pretrained(str(target_dir))
    with init_empty_weights():  # parameters on meta, buffers real
        target = AutoModelForCausalLM.from_config(config, dtype=dtype)
    target.eval()
    model = convert_to_eagle3(target, arch, init.get("d2t"))  # its copies from the meta target are no-ops
    stats = shard_target(model, torch.device(device).type)
    materialize(model, torch.device(device))
    model.tie_weights()  # materializing gave a tied head storage of its own; transformers re-ties it
    model.eagle_module.float()  # the draft trains in float32, as in the unsharded path
    model.eagle_module.load_state_dict(init)
    stats["target_bytes_read_per_rank"] = read_target_weights(model, target_dir)
    return model, stats


