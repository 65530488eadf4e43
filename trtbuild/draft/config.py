"""The draft stage's recipe section (`draft:`): how the EAGLE-3 draft is made, checked and gated."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from trtbuild.core.data.sources import TextSource
from trtbuild.core.stage_api import StageConfig


class DraftGate(StageConfig):
    min_acceptance_length: float | None = Field(
        default=None, ge=1.0, description="Fail the build when the measured mean acceptance length tau "
        "(tokens per target step, bonus token included) is below this. Unset: no gate.")


class DraftEval(StageConfig):
    dataset: TextSource | None = Field(
        default=None, description="Held-out text the prompts come from (its eval split: pydoc's held-out "
        "paragraphs). Default: for a target with a chat template, requests the target writes itself "
        "(seeded apart from training's), rendered as the served endpoint renders them; otherwise pydoc.")
    prompts: int = Field(default=8, ge=0, le=10**5, description="Number of prompts: the first prompt_len "
                         "tokens (BOS included) of records evenly spaced over the eval split, as `trtbuild "
                         "bench` makes them; 0 skips the evaluation (then no gate can be checked).")
    prompt_len: int = Field(default=64, ge=1, le=1 << 20, description="Prompt length in tokens.")
    new_tokens: int = Field(default=128, ge=1, le=1 << 20, description="Tokens generated per prompt (greedy target).")
    mode: Literal["chain", "tree"] = Field(default="chain", description="Speculation shape used by the "
                                           "runtime: one chain of max_draft_len tokens, or a tree.")


_SLURM_WORD = r"^[A-Za-z0-9][A-Za-z0-9._,+-]*$"  # anchored: pydantic patterns search
_SLURM_TIME = r"^([0-9]+-)?[0-9]+(:[0-9]{1,2}){0,2}$"  # ASCII digits: \d also takes ٤ or ４


class DraftTrainSlurm(StageConfig):
    partition: str | None = Field(default=None, pattern=_SLURM_WORD, max_length=128, description="#SBATCH -p.")
    account: str | None = Field(default=None, pattern=_SLURM_WORD, max_length=128, description="#SBATCH -A.")
    time_limit: str = Field(default="04:00:00", pattern=_SLURM_TIME,
                            description="#SBATCH -t ([D-]HH:MM:SS).")
    job_name: str = Field(default="trtbuild-draft", pattern=_SLURM_WORD, max_length=128, description="#SBATCH -J.")
    rdzv_port: int = Field(default=29500, ge=1024, le=65535, description="Port of torchrun's c10d rendezvous "
                           "on the first node of the allocation.")


class DraftTraining(StageConfig):
    """How `source: train` runs: processes, nodes, device and dtype (torchrun + DDP when more than one)."""

    processes: int = Field(default=1, ge=1, le=64, description="Training processes per node (one per GPU on "
                           "a GPU host). > 1: the stage launches them itself with torchrun, each trains on "
                           "its shard of every global batch (draft.batch_size sequences) and DDP averages the "
                           "draft's gradients; the target stays frozen in every process.")
    nodes: int = Field(default=1, ge=1, le=4096, description="Nodes; > 1 runs under Slurm (srun + torchrun, "
                       "c10d rendezvous): inside an allocation the stage runs srun itself, elsewhere it writes "
                       "the sbatch script and says where.")
    backend: Literal["auto", "gloo", "nccl"] = Field(default="auto", description="torch.distributed backend; "
                                                     "auto: nccl on CUDA, gloo on CPU.")
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="Where the target and draft run; "
                                                   "auto: CUDA when a GPU is visible, else the CPU.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto", description="Compute dtype of the training forward: auto is bfloat16 autocast on "
        "CUDA (weights and optimizer stay float32) and float32 on the CPU.")
    micro_batch_size: int | None = Field(default=None, ge=1, le=1 << 16, description="Sequences per forward "
                                         "in one process (gradient accumulation up to its shard of the "
                                         "global batch). Default: the whole shard.")
    slurm: DraftTrainSlurm = Field(default_factory=DraftTrainSlurm, description="sbatch settings (nodes > 1).")
    target_sharding: Literal["auto", "none", "fsdp"] = Field(
        default="auto", description="Online training with several processes: fsdp shards every frozen target "
        "decoder layer over all ranks with FSDP2 (each rank holds 1/world of them and all-gathers one layer at "
        "a time), for a target that does not fit one GPU; none keeps a whole copy per rank. auto: fsdp on CUDA "
        "when the target's weights take more than half of one GPU's memory, else none.")

    def world_size(self) -> int:
        return self.processes * self.nodes


class DraftConfig(StageConfig):
    source: Literal["train", "path", "hub", "ngram", "none"] = Field(
        default="train", description="train: EAGLE-3 training with ModelOpt against the target; path: a "
        "local draft directory; hub: a repo id in the local HF cache (offline); ngram: no draft model, "
        "prompt lookup (TRT-LLM's NGram speculative decoding; the stage measures its tau); none: no "
        "speculative decoding.")
    path: str | None = Field(default=None, description="source: path: the EAGLE-3 draft directory.")
    repo_id: str | None = Field(default=None,
                                description="source: hub: e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B.")
    revision: str = Field(default="main", description="source: hub: branch, tag or commit.")
    sha256: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}$")],
                 Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]] = Field(
        default_factory=dict, description="source: path / hub: the draft's files pinned by sha256 (file name "
        "-> hex digest, as `sha256sum` prints it); the stage refuses a draft whose pinned files differ or "
        "are missing, before it loads them.")
    compat_ignore: list[str] = Field(default_factory=list, description="Compatibility checks to waive for a "
                                     "loaded draft (names from trtbuild.draft.compat.CHECKS, e.g. rope).")
    max_draft_len: int = Field(default=3, ge=1, le=16, description="Draft tokens per step, as the engine "
                               "(speculative_config.max_draft_len) and the runtime use it.")
    max_matching_ngram_size: int = Field(default=2, ge=1, le=16, description="source: ngram: longest suffix "
                                         "of the context looked up (TRT-LLM's max_matching_ngram_size).")
    aux_layers: list[int] | None = Field(
        default=None, description="Target layers whose hidden states feed the draft. Default: TRT-LLM's "
        "{1, L/2-1, L-4}, clipped and de-duplicated.")
    draft_vocab_size: int | None = Field(
        default=None, ge=1, le=1 << 24, description="Draft vocabulary: the most frequent target tokens of the training "
        "data (d2t). Default: the full vocab.")
    intermediate_size: int | None = Field(default=None, ge=1, le=1 << 20, description="Draft MLP width. Default: the "
                                          "target's.")
    dataset: TextSource = Field(
        default=TextSource(kind="pydoc"), description="Training text (train split): pydoc, a .txt/.jsonl "
        "file (chat jsonl rendered with the chat template), or hf.")
    samples: int = Field(default=512, ge=1, le=10**7, description="Training sequences in the pool.")
    train_samples: int | None = Field(
        default=None, ge=1, le=10**7, description="Train on the first N sequences of the pool only (the pool "
        "and its hidden states stay as they are in the cache, keyed by `samples`): a data-size curve from one "
        "pool. Default: the whole pool.")
    distill_fraction: float = Field(default=0.5, ge=0.0, le=1.0, description="Share of the pool that is the "
                                    "target's own greedy continuation of training-text prompts.")
    synthetic_requests: int = Field(
        default=0, ge=0, le=10**7, description="Chat requests the target writes itself (Magpie: its chat "
        "template up to an open user turn, continued with sampling), added to the dataset's chat requests; "
        "the distilled share of the pool is the target's answers to all of them. For a chat model whose "
        "dataset has few requests: a draft trained on a few dozen memorises them.")
    synthetic_request_tokens: int = Field(default=64, ge=4, le=4096, description="Longest synthetic request "
                                          "in tokens (longer ones are cut).")
    prompt_len: int = Field(default=16, ge=1, le=1 << 20, description="Prompt tokens of each generated sequence.")
    steps: int | None = Field(default=None, ge=1, le=10**8, description="Optimizer steps; default: epochs x samples / "
                              "batch_size.")
    epochs: float = Field(default=1.0, gt=0, le=1e4, description="Passes over the pool when `steps` is unset.")
    lr: float = Field(default=1e-3, gt=0, le=10, description="Peak learning rate (AdamW, warmup then cosine).")
    batch_size: int = Field(default=8, ge=1, le=1 << 16, description="Sequences per step.")
    seq_len: int = Field(default=128, ge=8, le=1 << 20, description="Tokens per training sequence.")
    ttt_steps: int = Field(default=3, ge=1, le=8, description="Training-time-test unroll length (draft "
                           "steps trained on its own outputs).")
    loss_decay: float = Field(default=0.9, gt=0, le=1, description="Loss weight decay per unroll step.")
    seed: int = Field(default=0, ge=0, le=2**63 - 1, description="Seed of data sampling, initialisation and batch order.")
    train_seed: int | None = Field(
        default=None, ge=0, le=2**63 - 1, description="Seed of the draft's initialisation and batch order only; "
        "default: `seed`. Another value keeps the pool and its hidden states (keyed by `seed`): the seed "
        "spread of a training at one data size, without regenerating the data.")
    checkpoint_every: int = Field(default=25, ge=1, le=10**8, description="Steps between resume checkpoints.")
    export_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="dtype of the exported draft; auto: the target's.")
    gate: DraftGate = Field(default_factory=DraftGate, description="Build gate on the acceptance length.")
    eval: DraftEval = Field(default_factory=DraftEval, description="Acceptance evaluation on held-out text.")
    hidden_states: Literal["online", "offline"] = Field(
        default="online", description="online: the frozen target runs in every training step (ModelOpt's "
        "default); offline: the captured layers' hidden states and the target's final hidden state are "
        "computed once into safetensors shards in the cache (reused when only training settings change) "
        "and training loads only the target's embeddings, final norm and lm_head.")
    hidden_states_dtype: Literal["float32", "bfloat16"] = Field(
        default="float32", description="hidden_states: offline: how the shards store the hidden states, "
        "and the dump computes them: bfloat16 halves the disk and runs the target in bf16 (CPU: under "
        "autocast, 2.2x over float32 on SmolLM2; its top-1 from the stored final state agrees with "
        "float32 compute's on 99.4 % of tokens). Training computes as draft.train.dtype says.")
    shard_samples: int = Field(default=128, ge=1, le=1 << 20, description="Sequences per shard of the "
                               "regenerated data and of the hidden-state dump (the unit a killed run keeps).")

    @model_validator(mode="after")
    def _source_fields(self) -> DraftConfig:
        if self.source == "path" and not self.path:
            raise ValueError("source: path needs `path:` (a local EAGLE-3 draft directory)")
        if self.source == "hub" and not self.repo_id:
            raise ValueError("source: hub needs `repo_id:` (an EAGLE-3 draft in the local HF cache)")
        if self.sha256 and self.source not in ("path", "hub"):
            raise ValueError("sha256 pins the files of a loaded draft: it is for source: path or hub")
        if self.synthetic_requests and not self.distill_fraction:
            raise ValueError("synthetic_requests are answered by the target in the distilled share of the "
                             "pool: set distill_fraction above 0")
        if self.aux_layers is not None and not self.aux_layers:
            raise ValueError("aux_layers must name at least one target layer (or be left unset)")
        return self

    train: DraftTraining = Field(default_factory=DraftTraining, description="source: train: processes, "
                                 "nodes, device and dtype of the training.")

    @model_validator(mode="after")
    def _train_split(self) -> DraftConfig:
        world = self.train.world_size()
        if self.batch_size % world:
            raise ValueError(f"batch_size {self.batch_size} does not split over train.processes x train.nodes = "
                             f"{world} (each process takes an equal shard of every global batch)")
        if self.train.target_sharding == "fsdp" and world == 1:
            raise ValueError("train.target_sharding fsdp shards the target over several processes: set "
                             "train.processes (or nodes) above 1, or target_sharding auto")
        if self.train.target_sharding == "fsdp" and self.hidden_states == "offline":
            raise ValueError("train.target_sharding fsdp shards the target's layers, which offline training "
                             "does not load (hidden_states: offline): use one of the two")
        micro = self.train.micro_batch_size
        if micro is not None and (self.batch_size // world) % micro:
            raise ValueError(f"train.micro_batch_size {micro} does not divide the per-process shard "
                             f"{self.batch_size // world} (batch_size / processes / nodes)")
        return self

    def training_seed(self) -> int:
        return self.seed if self.train_seed is None else self.train_seed

    def used_samples(self) -> int:
        return min(self.train_samples or self.samples, self.samples)

    def total_steps(self) -> int:
        return self.steps or max(1, round(self.epochs * self.used_samples() / self.batch_size))
