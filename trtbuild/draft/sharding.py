"""FSDP2 for the frozen target of online draft training, when it does not fit one device.

Each training rank holds 1/world of every target decoder layer (`torch.distributed.fsdp.fully_shard`
per layer, one device mesh over all ranks); a layer's forward all-gathers its weights and frees them
after (reshard_after_forward), so a rank's peak is its shards plus one whole layer. The target is
frozen, so nothing is reduce-scattered back. Embeddings, final norm and lm_head stay whole on every
rank: ModelOpt's EAGLE module calls them directly outside the base model's forward, and a tied
lm_head shares its weight with the embeddings. The draft itself is small and replicated (DDP).
"""

from __future__ import annotations

from torch import nn

from trtbuild.core.fsdp_shards import held, shard_target, target_layers  # noqa: F401 (moved there)

# Sharding pays for itself only when the whole target would not fit: below this share of one GPU's
# memory `auto` keeps a whole copy per rank (no all-gather per layer and step).
AUTO_SHARE_OF_GPU = 0.5


def resolve(setting: str, device: str, world: int, target_bytes: int, gpu_bytes: int | None) -> str:
    """fsdp or none: `auto` shards on CUDA when the target's weights take more than AUTO_SHARE_OF_GPU of
    one GPU and there is more than one rank to share them."""
    if setting != "auto":
        return setting
    if device != "cuda" or world == 1 or not gpu_bytes:
        return "none"
    return "fsdp" if target_bytes > AUTO_SHARE_OF_GPU * gpu_bytes else "none"


def frozen_names(model: nn.Module) -> list[str]:
    """Parameters and buffers outside the draft, for DDP to leave alone: every rank loaded the same target
    from disk (broadcasting it would send the whole model over the network), and sharded ones are
    FSDP's."""
    names = [n for n, _ in model.named_parameters() if not n.startswith("eagle_module.")]
    return names + [n for n, _ in model.named_buffers() if not n.startswith("eagle_module.")]


def ignore_for_ddp(model: nn.Module) -> None:
    from torch.nn.parallel import DistributedDataParallel

    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, frozen_names(model))
