"""The embedded tiny target: a byte-level BPE tokenizer and a small Llama trained on the pydoc corpus.

With `llama4` set, the target is a Llama 4 text model instead (transformers' Llama4ForCausalLM):
mixture-of-experts layers interleaved with dense ones, each with a shared expert and a top-k sigmoid
router, RoPE layers with chunked attention and NoPE layers with full attention, as Maverick's
config defines them, at a size that trains in minutes on a CPU.

Everything is deterministic for a given config on a given machine: the tokenizer trainer is
deterministic, the weights are initialised under a fixed seed, the data order comes from a seeded
generator, and training runs with a fixed thread count and torch's deterministic algorithms.
The result is a plain Hugging Face directory (config, generation config, safetensors, tokenizer)
that `AutoTokenizer` / `LlamaForCausalLM.from_pretrained` load offline.

Perplexity (`heldout_perplexity`, `train_perplexity`) is measured on fixed-length windows: the
text is tokenized as one stream (no special tokens), cut into consecutive non-overlapping windows
of `seq_len - 1` tokens (the last one may be shorter), each window is prefixed with `<s>` as in
training, and the mean next-token negative log-likelihood over every text token of every window
(the `<s>` itself is never predicted) is exponentiated. The train figure uses the same number of
windows as the held-out one, spread evenly over the training stream.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtbuild.core.data import pydoc_corpus
from trtbuild.core.errors import BuildError
from trtbuild.core.progress import Progress
from trtbuild.model.config import BOS, EOS, PAD, SPECIAL_TOKENS, TinyModelConfig

if TYPE_CHECKING:
    import torch




def build_tiny_model(cfg: TinyModelConfig, out_dir: Path, progress: Progress) -> dict[str, float]:
    """Train tokenizer + model and write an HF directory at `out_dir` (which must not exist or be empty).

    Returns heldout_perplexity, train_perplexity, train_seconds, train_tokens, parameters.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} is not empty")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # Written beside out_dir and renamed at the end, so a crash never leaves a half model there.
    work = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        with _deterministic_torch():
            metrics = _build(cfg, work, progress)
        if out_dir.exists():
            out_dir.rmdir()
        work.rename(out_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return metrics


@contextmanager
def _deterministic_torch() -> Iterator[None]:
    """One thread, deterministic kernels; the caller's settings come back afterwards."""
    import torch

    old_threads = torch.get_num_threads()
    old_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        torch.use_deterministic_algorithms(old_deterministic)


def _build(cfg: TinyModelConfig, out_dir: Path, progress: Progress) -> dict[str, float]:
    import torch

    progress.log(f"tiny: training a {cfg.vocab_size}-token byte-level BPE tokenizer on the pydoc train split")
    tokenizer = train_tokenizer(cfg.vocab_size)
    train_ids = _encode(tokenizer, pydoc_corpus.train_text())
    heldout_ids = _encode(tokenizer, pydoc_corpus.heldout_text())
    model = _new_model(cfg)
    parameters = sum(p.numel() for p in model.parameters())

    start = time.perf_counter()
    with progress.task(f"tiny: train {'Llama 4' if cfg.llama4 else 'Llama'}", total=cfg.steps) as bar:
        def on_step(loss: float) -> None:
            bar.advance(1, loss=loss)

        if cfg.processes == 1:
            _train(model, cfg, train_ids, rank=0, on_step=on_step)
        else:
            _train_with_helpers(model, cfg, train_ids, out_dir, on_step=on_step)
    train_seconds = time.perf_counter() - start

    model.eval()
    with torch.no_grad():
        heldout_windows = _windows(heldout_ids, cfg.seq_len - 1)
        heldout_ppl = perplexity(model, heldout_windows)
        train_ppl = perplexity(model, _spread_windows(train_ids, cfg.seq_len - 1, len(heldout_windows)))

    _save(model, tokenizer, cfg, out_dir)
    return {
        "heldout_perplexity": heldout_ppl,
        "train_perplexity": train_ppl,
        "train_seconds": round(train_seconds, 2),
        "train_tokens": float(cfg.steps * cfg.batch_size * cfg.seq_len),
        "parameters": float(parameters),
    }


def _new_model(cfg: TinyModelConfig) -> Any:
    """Llama (or Llama 4) with HF's standard init under `cfg.seed`, without touching the caller's RNG."""
    import torch
    from transformers import Llama4ForCausalLM, Llama4TextConfig, LlamaConfig, LlamaForCausalLM

    hf = {k: v for k, v in cfg.hf_config().items() if k not in ("torch_dtype", "rope_theta", "model_type")}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        if cfg.llama4 is None:
            model = LlamaForCausalLM(LlamaConfig(**hf))
        else:
            model = Llama4ForCausalLM(Llama4TextConfig(**hf))
    return model.to(torch.float32)


def train_tokenizer(vocab_size: int) -> Any:
    """Byte-level BPE on the pydoc train split; `<s>` is prepended to every encoded text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(pydoc_corpus.split()[0], trainer=trainer)
    for index, token in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(token) == index, f"{token} is not id {index}"
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, SPECIAL_TOKENS.index(BOS))])
    return tok


def _encode(tokenizer: Any, text: str) -> torch.Tensor:
    import torch

    return torch.tensor(tokenizer.encode(text, add_special_tokens=False).ids, dtype=torch.long)


def _with_bos(chunk: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.cat([torch.tensor([SPECIAL_TOKENS.index(BOS)], dtype=torch.long), chunk])


def _windows(ids: torch.Tensor, length: int) -> list[torch.Tensor]:
    """Consecutive non-overlapping `<s>`-prefixed windows of `length` text tokens (last may be short)."""
    return [_with_bos(ids[i:i + length]) for i in range(0, len(ids), length)]


def _spread_windows(ids: torch.Tensor, length: int, count: int) -> list[torch.Tensor]:
    """`count` full windows with evenly spaced starts over the stream."""
    last = max(len(ids) - length, 0)
    starts = [round(k * last / max(count - 1, 1)) for k in range(count)]
    return [_with_bos(ids[s:s + length]) for s in starts]


def perplexity(model: Any, windows: list[torch.Tensor], batch_size: int = 16) -> float:
    """exp(mean next-token NLL) over every non-first token of every window."""
    import torch

    total_nll, total_tokens = 0.0, 0
    with torch.no_grad():
        # Windows of equal length are batched; the (possibly shorter) last one goes alone.
        groups: dict[int, list[torch.Tensor]] = {}
        for window in windows:
            groups.setdefault(len(window), []).append(window)
        for _, group in sorted(groups.items()):
            for i in range(0, len(group), batch_size):
                batch = torch.stack(group[i:i + batch_size])
                logits = model(input_ids=batch).logits[:, :-1].float()
                nll = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum")
                total_nll += nll.item()
                total_tokens += batch[:, 1:].numel()
    return math.exp(total_nll / max(total_tokens, 1))


def _batches(ids: torch.Tensor, cfg: TinyModelConfig) -> Iterator[torch.Tensor]:
    """Endless seeded stream of (batch_size, seq_len) batches: each epoch a random phase, shuffled windows."""
    import torch

    length = cfg.seq_len - 1
    if len(ids) < length:  # a stream shorter than one window: repeat it
        ids = ids.repeat(length // max(len(ids), 1) + 1)
    gen = torch.Generator().manual_seed(cfg.seed)
    pending: list[torch.Tensor] = []
    while True:
        phase = int(torch.randint(0, length, (1,), generator=gen)) if len(ids) > length else 0
        starts = torch.arange(phase, len(ids) - length + 1, length)
        for s in starts[torch.randperm(len(starts), generator=gen)].tolist():
            pending.append(_with_bos(ids[s:s + length]))
            if len(pending) == cfg.batch_size:
                yield torch.stack(pending)
                pending = []


def _lr_factor(step: int, cfg: TinyModelConfig) -> float:
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(cfg.steps - cfg.warmup_steps, 1)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def _train(model: Any, cfg: TinyModelConfig, ids: torch.Tensor, rank: int,
           on_step: Callable[[float], None] | None = None) -> None:
    """The training loop of one process: its share of every batch; gradients summed over processes."""
    import torch
    import torch.distributed as dist

    params = list(model.parameters())
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.learning_rate, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_factor(step, cfg))
    batches = _batches(ids, cfg)
    model.train()
    for _ in range(cfg.steps):
        batch = next(batches)[rank::cfg.processes]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        loss_value = loss.detach()
        if cfg.processes > 1:
            # One flat all-reduce: every process gets the same (bitwise) mean gradient and loss.
            flat = torch.cat([p.grad.reshape(-1) for p in params] + [loss_value.reshape(1)])
            dist.all_reduce(flat)
            flat /= cfg.processes
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            loss_value = flat[-1]
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        schedule.step()
        if on_step is not None:
            on_step(round(loss_value.item(), 4))


_HELPER_TIMEOUT_S = 600  # a helper that stops answering fails the build instead of hanging it


def _train_with_helpers(model: Any, cfg: TinyModelConfig, ids: torch.Tensor, scratch: Path,
                        on_step: Callable[[float], None]) -> None:
    """Rank 0 trains here; ranks 1.. run `python -c _helper_main()` (no multiprocessing re-import of
    the caller's __main__), all joined through a file store in `scratch`."""
    import datetime

    import torch.distributed as dist
    from safetensors.torch import save_file

    comm = scratch / ".train"
    comm.mkdir()
    save_file({"ids": ids.contiguous()}, str(comm / "ids.safetensors"))  # tensors only, never a pickle
    (comm / "config.json").write_text(cfg.model_dump_json())
    package_root = str(Path(__file__).resolve().parents[2])
    python_path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": python_path, "OMP_NUM_THREADS": "1"}
    helpers = []
    try:
        for rank in range(1, cfg.processes):
            log = open(comm / f"rank{rank}.log", "wb")  # noqa: SIM115 (closed below)
            helpers.append((subprocess.Popen(
                [sys.executable, "-c", "from trtbuild.model.tiny import _helper_main; _helper_main()",
                 str(comm), str(rank)], env=env, stdout=log, stderr=subprocess.STDOUT), log))
        store = dist.FileStore(str(comm / "store"), cfg.processes)
        dist.init_process_group("gloo", store=store, rank=0, world_size=cfg.processes,
                                timeout=datetime.timedelta(seconds=_HELPER_TIMEOUT_S))
        try:
            _sync_parameters(model)
            _train(model, cfg, ids, rank=0, on_step=on_step)
        finally:
            dist.destroy_process_group()
        for proc, _ in helpers:
            if proc.wait(timeout=_HELPER_TIMEOUT_S) != 0:
                raise BuildError(f"tiny: a training process failed (exit {proc.returncode})")
    except Exception as exc:
        tails = [(comm / f"rank{r}.log").read_text(errors="replace").strip().splitlines()[-1:]
                 for r in range(1, len(helpers) + 1) if (comm / f"rank{r}.log").is_file()]
        detail = "; ".join(line for tail in tails for line in tail)
        if detail and not isinstance(exc, BuildError):
            raise BuildError(f"tiny: multi-process training failed: {exc} (helper said: {detail})") from exc
        raise
    finally:
        for proc, log in helpers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
        shutil.rmtree(comm, ignore_errors=True)


def _helper_main() -> None:
    """Entry point of training ranks 1..: same init, its share of each batch, then exit."""
    import datetime

    import torch.distributed as dist
    from safetensors.torch import load_file

    comm, rank = Path(sys.argv[1]), int(sys.argv[2])
    cfg = TinyModelConfig.model_validate_json((comm / "config.json").read_text())
    ids = load_file(str(comm / "ids.safetensors"))["ids"]
    with _deterministic_torch():
        model = _new_model(cfg)
        store = dist.FileStore(str(comm / "store"), cfg.processes)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=cfg.processes,
                                timeout=datetime.timedelta(seconds=_HELPER_TIMEOUT_S))
        try:
            _sync_parameters(model)
            _train(model, cfg, ids, rank=rank)
        finally:
            dist.destroy_process_group()


def _sync_parameters(model: Any) -> None:
    """Start every process from rank 0's weights (same seed already gives the same init; this makes sure)."""
    import torch.distributed as dist

    for p in model.parameters():
        dist.broadcast(p.data, src=0)


def _save(model: Any, tokenizer: Any, cfg: TinyModelConfig, out_dir: Path) -> None:
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    hf = cfg.hf_config()
    model.generation_config = GenerationConfig(
        bos_token_id=hf["bos_token_id"], eos_token_id=hf["eos_token_id"], pad_token_id=hf["pad_token_id"],
        do_sample=False)
    model.save_pretrained(out_dir, safe_serialization=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   model_max_length=cfg.max_position_embeddings)
    fast.save_pretrained(out_dir)
    # Older readers (transformers 4.x in TRT-LLM images) know the generic fast class and a
    # top-level rope_theta / torch_dtype; transformers 5 reads these as well.
    _update_json(out_dir / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast"})
    _update_json(out_dir / "config.json", {"rope_theta": cfg.rope_theta, "torch_dtype": "float32"})


def _update_json(path: Path, values: dict[str, Any]) -> None:
    data = json.loads(path.read_text())
    data.update(values)
    path.write_text(json.dumps(data, indent=2) + "\n")
