"""A small Llama with a real BPE tokenizer, saved as an HF dir, for the quantize / data tests.

Trained for a few dozen steps on the pydoc corpus so its perplexity is far below the vocabulary
size: quantization noise then measurably hurts it (a random-init model would not show that).
"""

from __future__ import annotations

from pathlib import Path


def make_tokenizer(vocab_size: int = 512):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from trtbuild.core.data import pydoc_corpus

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    train, _ = pydoc_corpus.split()
    tok.train_from_iterator(train[:600], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="</s>")


def make_model_dir(root: Path, *, train_steps: int = 25, seed: int = 0, rope_theta: float = 10000.0,
                   tie_word_embeddings: bool = False) -> Path:
    """Write `root/hf` (config, safetensors, tokenizer) and return `root`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from trtbuild.core.data import sources

    torch.manual_seed(seed)
    tokenizer = make_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256,
                         rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
                         bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=tie_word_embeddings)
    model = LlamaForCausalLM(config)
    if train_steps:
        texts = list(sources.load_texts(sources.TextSource.model_validate("pydoc"), "train"))
        data = sources.token_windows(tokenizer, texts[:800], n=train_steps * 8, seq_len=64, seed=seed)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        model.train()
        for step in range(train_steps):
            batch = data[step * 8:(step + 1) * 8]
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
        model.eval()
    hf = root / "hf"
    model.save_pretrained(hf)
    tokenizer.save_pretrained(hf)
    return root
