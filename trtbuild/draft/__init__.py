"""EAGLE-3 draft models: training with ModelOpt, vocabulary calibration, export, compatibility checks.

Modules (heavy imports stay inside functions everywhere except train/model, which the stage
imports lazily):
    config    the draft stage's recipe section (DraftConfig, DraftEval, DraftGate)
    stage     the stage adapter
    format    the checkpoint format TRT-LLM's EAGLE-3 loader reads (names, keys, reading headers)
    vocab     draft-vocabulary calibration (most frequent target tokens -> d2t)
    compat    refuse a draft that does not fit the target, before any expensive work
    model     the target converted by `modelopt.torch.speculative` into a trainable EAGLE-3 model
    data      training sequences: text windows and the target's own greedy continuations
    draft_data  the data step: the pool as a sharded, resumable cache entry (draft-data)
    hidden    offline training: the captured hidden states dumped once into shards (draft-hidden)
    hidden_store  offline training's reader of those shards and the head-only target
    shards    the shard sets' layout, resume and commit into the cache
    plan_notes  what `trtbuild plan` says about the shard sets (reuse, disk)
    train     the training loop with resumable checkpoints
    export    ModelOpt's export, normalised to the format in `format`
    evaluate  acceptance length (tau) with the project's runtime
"""
