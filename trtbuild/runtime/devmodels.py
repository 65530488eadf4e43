"""Small real models for the runtime's tests and benchmarks, built in seconds on a CPU.

- `random_llama`: a random-init LlamaForCausalLM saved as an HF directory.
- `random_llama4`: a random-init Llama4ForCausalLM (MoE, shared expert, NoPE, chunked attention).
- `train_byte_llama`: a byte-level Llama trained briefly on the pydoc corpus (predictable enough
  for a draft to learn, unlike a random model).
- `train_eagle3_draft`: an EAGLE-3 draft trained with ModelOpt's own speculative plugin on a
  target's outputs and exported with ModelOpt's exporter, i.e. the format the draft stage ships.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from trtbuild.core.data import pydoc_corpus


def _llama_config(vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int,
                  max_positions: int, init_range: float):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       max_position_embeddings=max_positions, initializer_range=init_range,
                       architectures=["LlamaForCausalLM"], bos_token_id=None, eos_token_id=None,
                       pad_token_id=None, tie_word_embeddings=False)


def random_llama(out_dir: Path, *, seed: int = 0, vocab: int = 256, hidden: int = 64, layers: int = 2,
                 heads: int = 4, kv_heads: int = 2, intermediate: int = 128, max_positions: int = 512,
                 init_range: float = 0.2):
    """Saves a random Llama; a wide init keeps greedy choices far from ties. Returns the model."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(_llama_config(vocab, hidden, layers, heads, kv_heads, intermediate,
                                           max_positions, init_range)).eval()
    model.save_pretrained(out_dir)
    return model


def random_llama4(out_dir: Path, *, seed: int = 0, vocab: int = 256, hidden: int = 64, layers: int = 4,
                  heads: int = 4, kv_heads: int = 2, intermediate: int = 64, intermediate_mlp: int = 128,
                  experts: int = 4, top_k: int = 1, chunk: int = 8, floor_scale: int = 4, attn_scale: float = 0.5,
                  qk_norm: bool = False, max_positions: int = 512, init_range: float = 0.2):
    """Saves a random Llama 4 text model, Maverick's structure at toy size: MoE on odd layers, a NoPE
    layer every 4th, chunked attention on the RoPE layers. A small chunk and temperature floor make
    both act within test lengths. Returns the model."""
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    config = Llama4TextConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, intermediate_size_mlp=intermediate_mlp,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=hidden // heads, num_local_experts=experts, num_experts_per_tok=top_k, interleave_moe_layer_step=2,
        use_qk_norm=qk_norm, attention_chunk_size=chunk, attn_temperature_tuning=True, floor_scale=floor_scale,
        attn_scale=attn_scale, max_position_embeddings=max_positions, initializer_range=init_range,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, bos_token_id=None, eos_token_id=None,
        pad_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = Llama4ForCausalLM(config).eval()
    model.save_pretrained(out_dir)
    return model


def corpus_bytes(split: str = "train") -> torch.Tensor:
    text = pydoc_corpus.train_text() if split == "train" else pydoc_corpus.heldout_text()
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()


def train_byte_llama(out_dir: Path, *, steps: int = 200, seed: int = 0, hidden: int = 64, layers: int = 4,
                     heads: int = 4, kv_heads: int = 2, intermediate: int = 192, seq: int = 64,
                     batch: int = 16, lr: float = 3e-3):
    """A byte-level (vocab 256) Llama trained `steps` steps on the pydoc train split."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    data = corpus_bytes("train")
    model = LlamaForCausalLM(_llama_config(256, hidden, layers, heads, kv_heads, intermediate, 1024, 0.02))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, data.numel() - seq - 1, (batch,), generator=gen)
        ids = torch.stack([data[s:s + seq] for s in starts.tolist()])
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    model.save_pretrained(out_dir)
    return model


def train_eagle3_draft(target_dir: Path, out_dir: Path, *, steps: int = 150, seed: int = 0,
                       draft_vocab: int | None = None, intermediate: int | None = None, seq: int = 64,
                       batch: int = 8, lr: float = 3e-3, ttt_steps: int = 3,
                       export_rope_scaling: dict | None = None) -> Path:
    """Trains an EAGLE-3 draft for `target_dir` with ModelOpt and exports it to `out_dir`.

    Training text is the target's own greedy continuation of pydoc snippets would be ideal; the
    corpus itself is close enough for a byte model. `draft_vocab` < vocab builds d2t from the
    corpus' most frequent tokens (what ModelOpt's calibrate_draft_vocab does).
    """
    import modelopt.torch.speculative as mtsp
    from modelopt.torch.export.unified_export_hf import export_speculative_decoding
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float32, use_safetensors=True)
    cfg = model.config
    vocab = cfg.vocab_size
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    econf = copy.deepcopy(mtsp.config.EAGLE3_DEFAULT_CFG["config"])
    econf["eagle_architecture_config"].update(
        head_dim=head_dim, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        intermediate_size=intermediate or cfg.intermediate_size,
        draft_vocab_size=draft_vocab or vocab, initializer_range=0.02)
    econf["eagle_use_torch_compile"] = False
    econf["eagle_ttt_steps"] = ttt_steps
    econf["eagle_export_rope_scaling"] = {} if export_rope_scaling is None else export_rope_scaling
    mtsp.convert(model, [("eagle", econf)])
    data = corpus_bytes("train") if vocab == 256 else None
    if data is None:
        raise ValueError("train_eagle3_draft trains byte-level targets only")
    if draft_vocab and draft_vocab < vocab:
        counts = torch.bincount(data, minlength=vocab)
        keep = counts.topk(draft_vocab).indices.sort().values
        model.eagle_module.d2t.copy_(keep - torch.arange(draft_vocab))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, data.numel() - seq - 1, (batch,), generator=gen)
        ids = torch.stack([data[s:s + seq] for s in starts.tolist()])
        loss = model(input_ids=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    export_speculative_decoding(model, export_dir=out_dir)
    return Path(out_dir)
