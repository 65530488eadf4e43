"""Issue 13 finding 5: >= 150 bad recipes, one per distinct rule. Each exits 2 with one line that names
`<full path of the file>:<line>:` (the line marked `#!` in the case) and the given fragment.

Cases run in process (`trtbuild validate`), so the whole table takes seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trtbuild.cli import main

BASE = "name: t\nmodel: {source: tiny}\n"
ENGINE = BASE + "engine: {}\n"
DRAFT = BASE + "draft: {max_draft_len: 3}\n"
FP8 = BASE + "quantize: {}\n"
HF = {"m/config.json": '{"model_type": "llama", "vocab_size": 300, "num_hidden_layers": 2, "hidden_size": 8, '
      '"num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 64}',
      "m/model.safetensors": "placeholder"}
PATH_MODEL = "name: t\nmodel:\n  source: path\n  path: m\n"


def R(body: str, base: str = BASE) -> str:  # noqa: N802
    return base + body


# (id, files: {"r.yaml": text, ...} or the text of r.yaml, extra CLI args, fragment of the message)
CASES: list[tuple[str, dict[str, str] | str, list[str], str]] = [
    # --- the file and its YAML --------------------------------------------------------------------
    ("yaml-unclosed-flow", "name: t\nmodel: [source\n#!", [], "not valid YAML"),
    ("yaml-tab-indent", "name: t\nmodel:\n\tsource: tiny #!\n", [], "not valid YAML"),
    ("yaml-bad-indent", "name: t\nmodel:\n  source: tiny\n bad: 1 #!\n", [], "not valid YAML"),
    ("yaml-duplicate-key", "name: t\nname: u #!\nmodel: {}\n", [], "twice"),
    ("yaml-non-string-key", BASE + "1: x #!\n", [], "keys must be strings"),
    ("yaml-nul-byte", "name: t\nmodel: {}\x00 #!\n", [], "NUL byte"),
    ("yaml-control-char", "name: t\nmodel: {}\n\x01 #!\n", [], "unacceptable character"),
    ("yaml-not-utf8", "name: t\nmodel: {} \udcff #!\n", [], "not UTF-8"),
    ("yaml-deep-nesting", "name: t\nmodel: " + "[" * 40 + "]" * 40 + " #!\n", [], "nested more than 32"),
    ("yaml-billion-laughs", "a: &a [x, x, x, x, x, x, x, x, x, x] #!\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdef", "bcdefg", strict=True)) + "name: t\n",
     [], "expands to more than"),
    ("yaml-recursive-alias", "name: t\nx: &a [*a] #!\n", [], "through aliases"),
    ("yaml-top-level-list", "- a #!\n- b\n", [], "must be a YAML mapping"),
    ("yaml-top-level-scalar", "just text #!\n", [], "must be a YAML mapping"),
    ("yaml-undefined-alias", "name: *nope #!\n", [], "not valid YAML"),
    ("yaml-empty-section", "name: t\nmodel: #!\n", [], "the section is empty"),
    ("yaml-empty-stage-section", BASE + "quantize: #!\n", [], "the section is empty"),
    ("yaml-null-without-parent", BASE + "quantize: null #!\n", [], "the section is empty"),
    # issue 24 finding 12: a tag its constructor rejects, a huge integer, a tag on a collection
    ("yaml-tag-int-float-text", R("quantize:\n  calibration:\n    num_samples: !!int 1e3 #!\n"), [],
     "quantize.calibration.num_samples: '1e3' is not a valid !!int value"),
    ("yaml-tag-float-abc", R("quantize:\n  gate:\n    max_perplexity_ratio: !!float abc #!\n"), [],
     "quantize.gate.max_perplexity_ratio: 'abc' is not a valid !!float value"),
    ("yaml-tag-bad-timestamp", "name: t\ndescription: !!timestamp 2020-99-99 #!\nmodel: {}\n", [],
     "description: '2020-99-99' is not a valid !!timestamp value"),
    ("yaml-tag-not-a-timestamp", "name: t\ndescription: !!timestamp soon #!\nmodel: {}\n", [],
     "is not a valid !!timestamp value"),
    ("yaml-tag-bool-maybe", R("quantize:\n  check_export: !!bool maybe #!\n"), [], "is not a valid !!bool value"),
    ("yaml-5000-digit-int", R("quantize:\n  calibration:\n    num_samples: " + "9" * 5000 + " #!\n"), [],
     "(5000 characters)' is not a valid !!int value"),
    ("yaml-4000-digit-int", R("quantize:\n  calibration:\n    num_samples: " + "9" * 4000 + " #!\n"), [],
     "(4000 characters)"),
    ("yaml-tag-set-on-mapping", "name: t\nmodel: !!set {source: tiny} #!\n", [],
     "model: the tag !!set on a mapping is not supported"),
    ("yaml-tag-omap-on-list", "name: t\nmodel: !!omap [{source: tiny}] #!\n", [],
     "the tag !!omap on a list is not supported"),
    ("yaml-tag-custom-on-mapping", R("quantize: !mine {} #!\n"), [], "the tag !mine on a mapping"),
    # --- top level ---------------------------------------------------------------------------------
    ("top-unknown-key", BASE + "modle: {} #!\n", [], "did you mean 'model'"),
    ("top-name-missing", "model: {source: tiny} #!\n", [], "required field is missing"),
    ("top-name-list", "name: [a, b] #!\nmodel: {}\n", [], "name"),
    ("top-name-escapes", "name: ../victim #!\nmodel: {}\n", [], "not a usable name"),
    ("top-name-empty", "name: '' #!\nmodel: {}\n", [], "not a usable name"),
    ("top-name-dotdot", "name: .. #!\nmodel: {}\n", [], "not a usable name"),
    ("top-name-absolute", "name: /etc #!\nmodel: {}\n", [], "not a usable name"),
    ("top-name-too-long", f"name: {'a' * 200} #!\nmodel: {{}}\n", [], "not a usable name"),
    ("top-name-newline", 'name: "a\\nb" #!\nmodel: {}\n', [], "not a usable name"),
    ("top-description-list", BASE + "description: [a] #!\n", [], "description"),
    ("top-output-dir-parent", BASE + "output_dir: .. #!\n", [], "holds the recipe itself"),
    ("top-output-dir-here", BASE + "output_dir: . #!\n", [], "holds the recipe itself"),
    ("top-output-dir-root", BASE + "output_dir: / #!\n", [], "filesystem root"),
    ("top-output-dir-cache", BASE + "output_dir: cache/x #!\n", [], "overlaps the artifact cache"),
    ("top-archs-unknown", BASE + "gpu_archs: [sm_42] #!\n", [], "sm_42"),
    ("top-archs-scalar", BASE + "gpu_archs: sm_90a #!\n", [], "gpu_archs"),
    ("extends-wrong-type", "extends: 5 #!\n" + BASE, [], "must be a path"),
    ("extends-missing", "extends: nope.yaml #!\n" + BASE, [], "not found"),
    ("extends-cycle", {"r.yaml": "extends: b.yaml\n" + BASE, "b.yaml": "extends: r.yaml #!\nname: b\n"}, [],
     "cycle"),
    ("extends-self", "extends: r.yaml #!\n" + BASE, [], "cycle"),
    ("extends-parent-bad", {"r.yaml": "extends: b.yaml\n" + BASE, "b.yaml": "name: b\nmodel: [\n#!"}, [],
     "not valid YAML"),
    ("env-unset", "name: ${env:TRTBUILD_SURELY_UNSET} #!\nmodel: {}\n", [], "TRTBUILD_SURELY_UNSET"),
    ("env-bad-syntax", "name: ${foo} #!\nmodel: {}\n", [], "unsupported interpolation"),
    ("env-engine-bad-syntax", ENGINE.replace("engine: {}", "engine:\n  env: {A: '${x}'} #!"), [],
     "unsupported interpolation"),
    ("stage-needs-model", "name: t\nquantize: {} #!\n", [], "has no `model:` section"),
    ("stage-needs-engine", BASE + "deploy: {} #!\n", [], "has no `engine:` section"),
    # --- model -------------------------------------------------------------------------------------
    ("model-source-literal", "name: t\nmodel:\n  source: s3 #!\n", [], "'tiny'"),
    ("model-unknown-key", "name: t\nmodel:\n  sorce: tiny #!\n", [], "did you mean 'source'"),
    ("model-path-without-path", "name: t\nmodel: #!\n  source: path\n", [], "needs `path:`"),
    ("model-hub-without-repo", "name: t\nmodel: #!\n  source: hub\n", [], "needs `repo_id:`"),
    ("model-path-not-dir", "name: t\nmodel:\n  source: path\n  path: nowhere #!\n", [], "not found"),
    ("model-path-no-config", {"r.yaml": PATH_MODEL.replace("path: m", "path: m #!"), "m/model.safetensors": "x"}, [],
     "no config.json"),
    ("model-config-not-json", {"r.yaml": PATH_MODEL.replace("path: m", "path: m #!"), "m/config.json": "{nope",
                               "m/model.safetensors": "x"}, [], "not valid JSON"),
    ("model-config-not-object", {"r.yaml": PATH_MODEL.replace("path: m", "path: m #!"), "m/config.json": "[1]",
                                 "m/model.safetensors": "x"}, [], "not a JSON object"),
    ("model-no-safetensors", {"r.yaml": PATH_MODEL.replace("path: m", "path: m #!"), "m/config.json": "{}"}, [],
     "no *.safetensors"),
    ("model-pickle-bin", {"r.yaml": PATH_MODEL.replace("path: m", "path: m #!"), **HF, "m/pytorch_model.bin": "p"},
     [], "pytorch_model.bin"),
    ("model-pickle-pt", {"r.yaml": PATH_MODEL.replace("path: m", "path: m #!"), **HF, "m/extra.pt": "p"}, [],
     "extra.pt"),
    ("model-pickle-nested", {"r.yaml": PATH_MODEL.replace("path: m", "path: m #!"), **HF,
                             "m/original/consolidated.00.pth": "p"}, [], "consolidated.00.pth"),
    ("model-pickle-pkl", {"r.yaml": PATH_MODEL.replace("path: m", "path: m #!"), **HF, "m/state.pkl": "p"}, [],
     "state.pkl"),
    ("model-remote-code", {"r.yaml": PATH_MODEL.replace("model:", "model: #!"),
                           "m/config.json": '{"auto_map": {"AutoModel": "x.Y"}}', "m/model.safetensors": "x"}, [],
     "trust_remote_code"),
    ("model-hub-not-cached", "name: t\nmodel:\n  source: hub\n  repo_id: nobody/nothing #!\n", [], "local HF cache"),
    ("model-standin-with-tiny", "name: t\nmodel: #!\n  standin_config: s.json\n", [], "standin_config is for"),
    ("model-standin-missing", "name: t\nmodel:\n  source: hub\n  repo_id: a/b\n  standin_config: s.json #!\n", [],
     "stand-in"),
    ("model-standin-lacks-keys", {"r.yaml": "name: t\nmodel:\n  source: hub\n  repo_id: a/b\n"
                                  "  standin_config: s.json #!\n", "s.json": "{}"}, [], "lacks"),
    ("model-trust-not-bool", "name: t\nmodel:\n  trust_remote_code: maybe #!\n", [], "trust_remote_code"),
    ("model-revision-list", "name: t\nmodel:\n  source: hub\n  repo_id: a/b\n  revision: [x] #!\n", [], "revision"),
    # --- model.tiny --------------------------------------------------------------------------------
    *[(f"tiny-{field}-{value}", f"name: t\nmodel:\n  tiny:\n    {field}: {value} #!\n", [], field) for field, value in [
        ("num_hidden_layers", "0"), ("num_hidden_layers", "65"), ("hidden_size", "8"), ("hidden_size", "131072"),
        ("num_attention_heads", "0"), ("num_key_value_heads", "0"), ("intermediate_size", "8"),
        ("rope_theta", "0"), ("rope_theta", ".inf"), ("rope_theta", ".nan"), ("rope_theta", "1e13"),
        ("max_position_embeddings", "8"), ("rms_norm_eps", "0"), ("rms_norm_eps", "2.0"), ("vocab_size", "100"),
        ("vocab_size", "70000"), ("seq_len", "4"), ("batch_size", "0"), ("steps", "0"), ("steps", "true"),
        ("learning_rate", "0"), ("warmup_steps", "-1"), ("min_lr_ratio", "2.0"), ("weight_decay", "-1"),
        ("grad_clip", "0"), ("seed", "-1"), ("processes", "0"), ("processes", "65"), ("layerz", "3")]],
    ("tiny-heads-divide", "name: t\nmodel:\n  tiny: #!\n    hidden_size: 100\n    num_attention_heads: 3\n", [],
     "not a multiple of num_attention_heads"),
    ("tiny-head-dim-odd", "name: t\nmodel:\n  tiny: #!\n    hidden_size: 36\n    num_attention_heads: 4\n"
     "    num_key_value_heads: 1\n", [], "must be even"),
    ("tiny-kv-divide", "name: t\nmodel:\n  tiny: #!\n    num_attention_heads: 4\n    num_key_value_heads: 3\n", [],
     "num_key_value_heads"),
    ("tiny-batch-processes", "name: t\nmodel:\n  tiny: #!\n    batch_size: 3\n    processes: 2\n", [], "processes"),
    ("tiny-seq-over-context", "name: t\nmodel:\n  tiny: #!\n    seq_len: 512\n    max_position_embeddings: 256\n",
     [], "exceeds max_position_embeddings"),
    ("tiny-memory", "name: t\nmodel:\n  tiny: #!\n    hidden_size: 65536\n    intermediate_size: 200000\n", [],
     "GiB of memory"),
    # --- quantize ----------------------------------------------------------------------------------
    ("quantize-format", R("quantize:\n  format: int4 #!\n"), [], "'fp8'"),
    ("quantize-kv-cache", R("quantize:\n  kv_cache: int8 #!\n"), [], "kv_cache"),
    ("quantize-exclude-empty", R("quantize:\n  exclude: [''] #!\n"), [], "must not be empty"),
    ("quantize-exclude-scalar", R("quantize:\n  exclude: 3 #!\n"), [], "exclude"),
    ("quantize-export", R("quantize:\n  export: onnx #!\n"), [], "export"),
    ("quantize-check-export", R("quantize:\n  check_export: perhaps #!\n"), [], "check_export"),
    ("quantize-unknown", R("quantize:\n  calibrate: {} #!\n"), [], "calibration"),
    *[(f"quantize-calibration-{field}-{value}", R(f"quantize:\n  calibration:\n    {field}: {value} #!\n"), [], field)
      for field, value in [("num_samples", "0"), ("num_samples", "true"), ("num_samples", "20000000"),
                           ("seq_len", "1"), ("batch_size", "0"), ("batch_size", "100000"), ("seed", "-3")]],
    *[(f"quantize-gate-{field}-{value}", R(f"quantize:\n  gate:\n    {field}: {value} #!\n"), [], field)
      for field, value in [("max_perplexity_ratio", "0"), ("max_perplexity_ratio", "-1"),
                           ("max_perplexity_ratio", ".inf"), ("max_perplexity_ratio", "5000"), ("eval_samples", "0"),
                           ("seq_len", "0"), ("batch_size", "0")]],
    ("quantize-calibration-over-context", R("quantize:\n  calibration:\n    seq_len: 4096 #!\n"), [], "context 2048"),
    ("quantize-gate-over-context", R("quantize:\n  gate:\n    seq_len: 4096 #!\n"), [], "context 2048"),
    ("quantize-dataset-type", R("quantize:\n  calibration:\n    dataset: data.csv #!\n"), [], "unsupported file type"),
    ("quantize-dataset-missing", R("quantize:\n  calibration:\n    dataset: nope.txt #!\n"), [], "not found"),
    ("quantize-dataset-empty", {"r.yaml": R("quantize:\n  calibration:\n    dataset: e.txt #!\n"), "e.txt": ""}, [],
     "is empty"),
    ("quantize-dataset-dir", {"r.yaml": R("quantize:\n  calibration:\n    dataset: d.txt #!\n"), "d.txt/x": "x"}, [],
     "not a regular file"),
    ("quantize-eval-missing", R("quantize:\n  gate:\n    eval_dataset: gone.jsonl #!\n"), [], "not found"),
    ("quantize-dataset-hf-empty", R("quantize:\n  calibration:\n    dataset: {kind: hf} #!\n"), [], "needs `hf:"),
    ("quantize-dataset-unknown", R("quantize:\n  calibration:\n    dataset: {kind: pydoc, colour: red} #!\n"), [],
     "colour"),
    ("quantize-dataset-records", R("quantize:\n  calibration:\n    dataset: {kind: pydoc, max_records: 0} #!\n"), [],
     "max_records"),
    ("quantize-dataset-records-bool", R("quantize:\n  calibration:\n    dataset: {kind: pydoc, max_records: true} #!\n"),
     [], "max_records"),
    ("quantize-memory", R("quantize:\n  calibration:\n    num_samples: 10000000 #!\n    seq_len: 1024\n"), [],
     "GiB of memory"),
    # --- draft -------------------------------------------------------------------------------------
    ("draft-source", R("draft:\n  source: magic #!\n"), [], "'train'"),
    ("draft-path-without-path", R("draft: #!\n  source: path\n"), [], "needs `path:`"),
    ("draft-hub-without-repo", R("draft: #!\n  source: hub\n"), [], "needs `repo_id:`"),
    ("draft-path-missing", R("draft:\n  source: path\n  path: nope #!\n"), [], "not found"),
    ("draft-path-pickle", {"r.yaml": R("draft:\n  source: path\n  path: d #!\n"), "d/config.json": "{}",
                           "d/pytorch_model.bin": "p"}, [], "pytorch_model.bin"),
    ("draft-aux-empty", R("draft: #!\n  aux_layers: []\n"), [], "at least one target layer"),
    ("draft-aux-range", R("draft:\n  aux_layers: [0, 99] #!\n"), [], "outside the target's 6 layers"),
    ("draft-aux-negative", R("draft:\n  aux_layers: [-1, 2] #!\n"), [], "outside the target's 6 layers"),
    ("draft-aux-repeat", R("draft:\n  aux_layers: [1, 1] #!\n"), [], "repeats a layer"),
    ("draft-vocab-over-target", R("draft:\n  draft_vocab_size: 99999 #!\n"), [], "exceeds the target's vocab_size"),
    ("draft-seq-over-context", R("draft:\n  seq_len: 4096 #!\n"), [], "context 2048"),
    ("draft-prompt-over-seq", R("draft:\n  prompt_len: 128 #!\n  seq_len: 128\n"), [], "prompt_len < seq_len"),
    ("draft-gate-no-prompts", R("draft:\n  gate: {min_acceptance_length: 2} #!\n  eval: {prompts: 0}\n"), [],
     "nothing measures it"),
    ("draft-eval-over-context", R("draft:\n  eval: {prompt_len: 2000, new_tokens: 100} #!\n"), [], "context 2048"),
    ("draft-eval-dataset-missing", R("draft:\n  eval:\n    dataset: none.txt #!\n"), [], "not found"),
    ("draft-dataset-missing", R("draft:\n  dataset: lost.jsonl #!\n"), [], "not found"),
    ("draft-compat-not-list", R("draft:\n  compat_ignore: rope #!\n"), [], "compat_ignore"),
    ("draft-memory", R("draft:\n  batch_size: 60000 #!\n"), [], "GiB of memory"),
    *[(f"draft-{field}-{value}", R(f"draft:\n  {field}: {value} #!\n"), [], field) for field, value in [
        ("max_draft_len", "0"), ("max_draft_len", "17"), ("draft_vocab_size", "0"), ("intermediate_size", "0"),
        ("samples", "0"), ("samples", "100000000"), ("distill_fraction", "1.5"), ("distill_fraction", "-0.1"),
        ("prompt_len", "0"), ("steps", "0"), ("steps", "true"), ("steps", "1e12"), ("epochs", "0"),
        ("epochs", ".inf"), ("epochs", "1e9"), ("lr", "0"), ("lr", "100"), ("batch_size", "0"), ("seq_len", "4"),
        ("ttt_steps", "9"), ("loss_decay", "0"), ("loss_decay", "1.5"), ("checkpoint_every", "0"),
        ("export_dtype", "int8"), ("seed", "-1")]],
    *[(f"draft-eval-{field}-{value}", R(f"draft:\n  eval:\n    {field}: {value} #!\n"), [], field)
      for field, value in [("prompts", "-1"), ("prompt_len", "0"), ("new_tokens", "0"), ("mode", "forest")]],
    ("draft-gate-below-one", R("draft:\n  gate:\n    min_acceptance_length: 0.5 #!\n"), [], "min_acceptance_length"),
    # --- engine ------------------------------------------------------------------------------------
    *[(f"engine-{field}-{value}", R(f"engine:\n  {field}: {value} #!\n"), [], field) for field, value in [
        ("backend", "onnx"), ("max_batch_size", "0"), ("max_batch_size", "true"), ("max_seq_len", "0"),
        ("max_num_tokens", "0"), ("tensor_parallel", "0"), ("pipeline_parallel", "0"), ("expert_parallel", "0"),
        ("tensor_parallel", "2048"), ("cuda_graphs", "[]"), ("cuda_graphs", "[0]"), ("cuda_graphs", "sometimes"),
        ("draft_len", "0"), ("gemm_plugin", "gemm"), ("llm_api_options", "[]")]],
    *[(f"engine-kv-{field}-{value}", R(f"engine:\n  kv_cache:\n    {field}: {value} #!\n"), [], field)
      for field, value in [("free_gpu_memory_fraction", "0"), ("free_gpu_memory_fraction", "1.5"),
                           ("dtype", "int4"), ("tokens_per_block", "0")]],
    ("engine-draft-len-without-draft", R("engine:\n  draft_len: 2 #!\n"), [], "has no draft"),
    ("engine-draft-len-over-draft", R("engine:\n  draft_len: 5 #!\n", DRAFT), [], "exceeds draft.max_draft_len"),
    ("engine-backend-tensorrt", R("engine:\n  backend: tensorrt #!\n", DRAFT), [], "is not served"),
    ("engine-plugin-unknown", R("engine:\n  gemm_plugin:\n    kernels: {sm_90a: warp_drive} #!\n", FP8), [],
     "unknown plugin"),
    ("engine-plugin-no-kernel", R("engine:\n  gemm_plugin:\n    kernels: {} #!\n", FP8), [], "at least one GPU arch"),
    ("engine-plugin-unquantized", R("engine:\n  gemm_plugin: #!\n    kernels: {sm_90a: spatial_partition}\n"), [],
     "no quantize section"),
    ("engine-plugin-linears-twice", R("engine:\n  gemm_plugin:\n    kernels: {sm_90a: spatial_partition}\n"
                                      "    linears: [dense, dense] #!\n"), [], "each once"),
    ("engine-plugin-arch-not-targeted", R("engine:\n  gemm_plugin:\n    kernels: {sm_89: spatial_partition} #!\n", FP8),
     [], "not among gpu_archs"),
    ("engine-plugin-max-tokens", R("engine:\n  gemm_plugin:\n    kernels: {sm_90a: spatial_partition}\n"
                                   "    max_tokens: 17 #!\n"), [], "max_tokens"),
    ("engine-env-name", R("engine:\n  env: {'1BAD': x} #!\n"), [], "not an environment variable name"),
    ("engine-env-newline", R('engine:\n  env: {A: "x\\ny"} #!\n'), [], "control character"),
    ("engine-options-unknown", R("engine:\n  llm_api_options: {warp: 9} #!\n"), [], "not an LLM() argument"),
    ("engine-options-owned", R("engine:\n  llm_api_options:\n    max_batch_size: 4 #!\n"), [],
     "set by the engine section itself"),
    ("engine-ep-divides-tp", R("engine:\n  expert_parallel: 3 #!\n  tensor_parallel: 4\n"), [], "does not divide"),
    ("engine-attention-dp-tp1", R("engine:\n  enable_attention_dp: true #!\n"), [], "tensor_parallel is 1"),
    ("engine-tp-heads", R("engine:\n  tensor_parallel: 8 #!\n"), [], "num_attention_heads"),
    ("engine-seq-over-context", R("engine:\n  max_seq_len: 100000 #!\n"), [], "context"),
    ("engine-pdl-arch", "name: t\ngpu_archs: [sm_89]\nmodel: {source: tiny}\nengine:\n  env:\n"
     "    TRTLLM_ENABLE_PDL: '1' #!\n", [], "TRTLLM_ENABLE_PDL"),
    ("engine-require-trtllm", R("engine:\n  require_tensorrt_llm: true #!\n"), [], "not importable"),
    *[(f"engine-launcher-{field}-{value[:12]}", R(f"engine:\n  launcher:\n    {field}: {value} #!\n"), [], field)
      for field, value in [("port", "0"), ("port", "70000"), ("host", "'$(touch x)'"), ("host", "'a b'"),
                           ("nodes", "0"), ("gpus_per_node", "0"), ("container_image", "'img; rm'"),
                           ("container_image", '"img\\nx"'), ("container_mounts", "['/a,/b:/c']"),
                           ("container_mounts", "['nocolon']")]],
    *[(f"engine-slurm-{field}-{value[:12]}", R(f"engine:\n  launcher:\n    slurm:\n      {field}: {value} #!\n"), [],
       field) for field, value in [("job_name", '"a\\nrm -rf"'), ("job_name", "'a b'"), ("partition", "'p;x'"),
                                   ("account", "'$(id)'"), ("time_limit", "forever")]],
    # issue 38 finding 9: Slurm reads ASCII digits only; \d took "٤:٠٠" (Arabic-Indic) and "４:００" (fullwidth)
    *[(f"{where}-slurm-time-limit-{name}", R(body.format(value)), [], "time_limit")
      for where, body in [("engine", "engine:\n  launcher:\n    slurm:\n      time_limit: '{}' #!\n"),
                          ("draft", "draft:\n  train:\n    slurm:\n      time_limit: '{}' #!\n")]
      for name, value in [("arabic-indic", "\u0664:\u0660\u0660"), ("fullwidth", "\uff14:\uff10\uff10"),
                          ("devanagari-days", "\u0967-04:00:00")]],
    ("engine-trtllm-version-unknown", R("engine:\n  trtllm_version: 0.9.0 #!\n"), [], "no TensorRT-LLM contract"),
    ("engine-nodes-world", R("engine:\n  launcher:\n    nodes: 2 #!\n"), [], "nodes"),
    # --- deploy ------------------------------------------------------------------------------------
    *[(f"deploy-{field}-{value[:12]}", R(f"deploy:\n  {field}: {value} #!\n", ENGINE), [], field) for field, value in [
        ("target", "[cloud]"), ("target", "[]"), ("model_name", "'bad name'"),
        ("max_batch_size", "0"), ("instance_count", "0"), ("http_port", "0"), ("grpc_port", "99999"),
        ("exit_timeout_s", "0"), ("max_queue_delay_microseconds", "-1"), ("max_queue_size", "-1"),
        ("decoupled", "often")]],
    ("deploy-batch-over-engine", R("deploy:\n  max_batch_size: 64 #!\n", ENGINE), [], "exceeds engine.max_batch_size"),
    ("deploy-ports-equal", R("deploy: #!\n  http_port: 9000\n  grpc_port: 9000\n", ENGINE), [], "must differ"),
    ("deploy-tokenizer-missing", R("deploy:\n  tokenizer:\n    path: tok #!\n", ENGINE), [], "not a directory"),
    ("deploy-schedule-and-max-batch", R("deploy:\n  local: #!\n    speculative_max_batch: 2\n"
                                        '    draft_len_schedule: {"4": 3}\n', ENGINE), [], "mutually exclusive"),
    ("deploy-default-over-limit", R("deploy:\n  local:\n    default_max_tokens: 2000 #!\n", ENGINE), [],
     "exceeds deploy.local.max_tokens_limit"),
    *[(f"deploy-trtllm-{field}-{value[:12]}", R(f"deploy:\n  trtllm:\n    {field}: {value} #!\n", ENGINE), [], field)
      for field, value in [("image", "'img x'"), ("image", '"img\\n"'), ("bundle_mount", "relative"),
                           ("all_models_dir", "'/a:b'"), ("publish_address", "everywhere"),
                           ("cancellation_check_period_ms", "0")]],
    *[(f"deploy-local-{field}-{value}", R(f"deploy:\n  local:\n    {field}: {value} #!\n", ENGINE), [], field)
      for field, value in [("speculation", "forest"), ("default_max_tokens", "0"), ("max_tokens_limit", "0"),
                           ("num_threads", "0"), ("speculative", "[1]"), ("draft_len_schedule", "{}"),
                           ("draft_len_schedule", '{"1": 5, "0": 3}'), ("draft_len_schedule", '{"1": -1}'),
                           ("draft_len_schedule", "[5, 3]")]],
    # --- issue 24 finding 11: what validate now reads ----------------------------------------------
    ("data-not-utf8", {"r.yaml": R("quantize:\n  calibration:\n    dataset: c.txt #!\n"),
                       "c.txt": "text\nmore \udcff text\n"}, [], "c.txt:2 is not UTF-8 text"),
    ("data-jsonl-not-json", {"r.yaml": R("quantize:\n  calibration:\n    dataset: c.jsonl #!\n"),
                             "c.jsonl": '{"text": "a"}\n{nope\n'}, [], "c.jsonl:2: invalid JSON"),
    ("data-jsonl-not-object", {"r.yaml": R("quantize:\n  gate:\n    eval_dataset: c.jsonl #!\n"),
                               "c.jsonl": "[1, 2]\n"}, [], "c.jsonl:1: expected a JSON object, got list"),
    ("data-jsonl-no-field", {"r.yaml": R("draft:\n  dataset: c.jsonl #!\n"), "c.jsonl": '{"body": "x"}\n'}, [],
     "record has no field 'text'"),
    ("data-jsonl-named-field-absent", {"r.yaml": R("quantize:\n  calibration:\n    dataset: {path: c.jsonl, "
                                                   "field: body} #!\n"), "c.jsonl": '{"text": "x"}\n'}, [],
     "record has no field 'body'"),
    ("data-jsonl-field-not-text", {"r.yaml": R("quantize:\n  calibration:\n    dataset: c.jsonl #!\n"),
                                   "c.jsonl": '{"text": 5}\n'}, [], "field 'text' is int"),
    ("data-jsonl-bad-chat", {"r.yaml": R("quantize:\n  calibration:\n    dataset: c.jsonl #!\n"),
                             "c.jsonl": '{"messages": [{"who": "me"}]}\n'}, [], "chat turn needs role/content"),
    ("data-no-records", {"r.yaml": R("quantize:\n  calibration:\n    dataset: c.jsonl #!\n"), "c.jsonl": "\n\n\n"},
     [], "has no records"),
    ("data-too-little-text", {"r.yaml": R("quantize:\n  calibration:\n    dataset: c.txt #!\n"), "c.txt": "hi\n"},
     [], "fewer than the 256 tokens one window needs"),
    ("data-eval-records-too-short", {"r.yaml": R("draft:\n  eval:\n    dataset: e.txt #!\n"),
                                     "e.txt": ("short record\n\n" * 40)}, [], "fewer than the 64 tokens of one prompt"),
    ("data-hf-not-cached", R("quantize:\n  calibration:\n    dataset: {hf: nobody/nothing-here} #!\n"), [],
     "'nobody/nothing-here' is not in the local cache"),
    ("deploy-tokenizer-without-tokenizer", {"r.yaml": R("deploy:\n  tokenizer:\n    path: tok #!\n", ENGINE),
                                            "tok/README": "no tokenizer here"}, [], "holds no tokenizer"),
    ("deploy-tokenizer-beyond-vocab", {"r.yaml": R("deploy:\n  tokenizer:\n    path: tok #!\n", ENGINE),
                                       "tok/tokenizer.json": '{"model": {"vocab": {"a": 0, "b": 2047}}, '
                                       '"added_tokens": [{"id": 5000, "content": "<x>"}]}'}, [],
     "token ids up to 5000, beyond the target's vocab_size 2048"),
    ("model-tokenizer-beyond-vocab", {"r.yaml": PATH_MODEL.replace("path: m", "path: m #!"), **HF,
                                      "m/tokenizer.json": '{"model": {"vocab": {"a": 0, "b": 300}}}'}, [],
     "token ids up to 300, beyond the target's vocab_size 300"),
    ("model-config-without-shapes", {"r.yaml": PATH_MODEL.replace("path: m", "path: m #!"),
                                     "m/config.json": '{"model_type": "llama"}', "m/model.safetensors": "x"}, [],
     "has no usable vocab_size, hidden_size, num_hidden_layers"),
    ("deploy-model-name-300", R(f"deploy:\n  model_name: {'m' * 300} #!\n", ENGINE), [], "300 characters"),
    ("deploy-queue-delay-1e9", R("deploy:\n  max_queue_delay_microseconds: 1000000000 #!\n", ENGINE), [],
     "at most 10000000 (10 s)"),
    ("deploy-limit-over-engine-seq", R("deploy:\n  local:\n    max_tokens_limit: 1024 #!\n",
                                       ENGINE.replace("engine: {}", "engine: {max_seq_len: 512}")), [],
     "exceeds engine.max_seq_len 512"),
    ("deploy-default-over-context", R("deploy:\n  local:\n    default_max_tokens: 300 #!\n",
                                      "name: t\nmodel: {source: tiny, tiny: {max_position_embeddings: 256}}\n"
                                      "engine: {}\n"), [], "context of 256 tokens"),
    ("top-output-dir-file", {"r.yaml": BASE + "output_dir: f.txt #!\n", "f.txt": "mine"}, [],
     "exists and is not a directory"),
    ("top-output-dir-under-file", {"r.yaml": BASE + "output_dir: f.txt/out #!\n", "f.txt": "mine"}, [],
     "is a file, not a directory"),
    ("top-output-dir-dev-null", BASE + "output_dir: /dev/null #!\n", [], "is inside /dev"),
    ("top-output-dir-proc-self", BASE + "output_dir: /proc/self #!\n", [], "is inside /proc"),
    # --- bench -------------------------------------------------------------------------------------
    ("bench-without-draft", BASE + "bench: {} #!\n", [], "has no draft"),
    ("bench-draft-len-over", R("bench:\n  max_draft_len: 5 #!\n", DRAFT), [], "exceeds draft.max_draft_len"),
    ("bench-over-context", R("bench:\n  prompt_len: 2000\n  max_new_tokens: 100 #!\n  tree: chain\n"
                             "  max_draft_len: 3\n", DRAFT), [], "context"),
    ("bench-prompts-missing", R("bench:\n  prompts: gone.txt #!\n  max_draft_len: 3\n", DRAFT), [], "not found"),
    ("bench-tree-budget", R("bench:\n  max_total_draft_tokens: 2 #!\n  max_draft_len: 3\n", DRAFT), [],
     "below max_draft_len"),
    *[(f"bench-{field}-{value}", R(f"bench:\n  {field}: {value} #!\n", DRAFT), [], field) for field, value in [
        ("num_prompts", "0"), ("prompt_len", "0"), ("max_new_tokens", "1"), ("tree", "forest"), ("topk", "0"),
        ("min_draft_prob", "2"), ("temperature", "-1"), ("draft_norm", "odd"), ("warmup", "-1"),
        ("threads", "0")]],
]


def _write(root: Path, files: dict[str, str] | str) -> tuple[Path, int]:
    """Write the case; return the file and line marked `#!` (the marker is removed)."""
    if isinstance(files, str):
        files = {"r.yaml": files}
    marked: tuple[Path, int] | None = None
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = text.split("\n")
        for number, line in enumerate(lines, 1):
            if "#!" in line:
                marked = (path, number)
                lines[number - 1] = line.replace(" #!", "").replace("#!", "")
        path.write_bytes("\n".join(lines).encode("utf-8", "surrogateescape"))
    assert marked is not None, "each case marks the line its error must name with #!"
    return marked


@pytest.mark.parametrize("case_id,files,args,fragment", CASES, ids=[c[0] for c in CASES])
def test_bad_recipe(tmp_path, monkeypatch, capsys, case_id, files, args, fragment):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.chdir(tmp_path)
    file, line = _write(tmp_path, files)
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", str(tmp_path / "r.yaml"), *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    where = str(file) if file.name == "r.yaml" else file.name
    assert f"{where}:{line}:" in lines[0], lines[0]
    assert fragment in lines[0], lines[0]


def test_at_least_150_distinct_rules():
    assert len({c[0] for c in CASES}) == len(CASES) >= 150


# Not files with lines: the command line and things that are not text files at all.
@pytest.mark.parametrize("args,fragment", [
    (["--set", "name=[unclosed"], "--set name=[unclosed: name: the value is not valid YAML"),
    (["--set", "description={a: [}"], "not valid YAML"),
    (["--set", "model.tiny.steps=true"], "boolean, not a number"),
    (["--set", "model.tiny.steps=!!int 1e3"], "model.tiny.steps: the value cannot be read"),
])
def test_bad_overrides(tmp_path, capsys, monkeypatch, args, fragment):
    (tmp_path / "r.yaml").write_text(BASE)
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", str(tmp_path / "r.yaml"), *args])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1 and fragment in err, err


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "too-big", "directory"])
def test_unreadable_recipes_are_refused_without_reading(tmp_path, capsys, monkeypatch, kind):
    import os

    target = tmp_path / "r.yaml"
    if kind == "fifo":
        os.mkfifo(target)  # nobody writes to it: reading it would hang
    elif kind == "dev-zero":
        target = Path("/dev/zero")
    elif kind == "too-big":
        target.write_text("name: t\n" + "#" * (2 << 20))
    else:
        target.mkdir()
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", str(target)])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1 and f"{target}:" in err, err


@pytest.mark.parametrize("ram_gib,instances,refused", [(24, 64, True), (24, 8, False), (128, 64, False)])
def test_local_instances_are_sized_against_memory(tmp_path, monkeypatch, capsys, ram_gib, instances, refused):
    """Issue 24 finding 11: 64 local instances of the tiny model (~38 GB measured) pass validate on a
    24 GiB machine no more; the machine's memory is set here so the case does not depend on the host."""
    from trtbuild.app import crosschecks

    monkeypatch.setattr(crosschecks, "machine_memory", lambda: ram_gib << 30)
    monkeypatch.setenv("TRTBUILD_CACHE", str(tmp_path / "cache"))
    (tmp_path / "r.yaml").write_text(ENGINE + f"deploy:\n  target: [local]\n  instance_count: {instances}\n")
    if not refused:
        main(["validate", str(tmp_path / "r.yaml")])
        assert "ok" in capsys.readouterr().out
        return
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", str(tmp_path / "r.yaml")])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1, err
    assert f"{tmp_path / 'r.yaml'}:6: deploy.instance_count: 64 local model instances need about" in err, err
    assert "more than this machine's 24.0 GiB" in err and "use at most" in err, err


def test_a_1000_deep_extends_chain_is_one_line(tmp_path, capsys, monkeypatch):
    """Issue 38 finding 8: a RecursionError traceback before."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r999.yaml").write_text(BASE)
    for i in range(999):
        (tmp_path / f"r{i}.yaml").write_text(f"extends: r{i + 1}.yaml\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", str(tmp_path / "r0.yaml")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and "extends" in lines[0], err
    assert ":1:" in lines[0] and "deep" in lines[0], lines[0]
    (tmp_path / "r0.yaml").write_text("extends: r990.yaml\n")  # 10 deep: fine
    main(["validate", str(tmp_path / "r0.yaml")])
    capsys.readouterr()


@pytest.mark.parametrize("ram_gib,processes,refused", [(24, 64, True), (24, 8, False), (128, 64, False)])
def test_training_processes_are_sized_against_memory(tmp_path, monkeypatch, capsys, ram_gib, processes, refused):
    """Issue 38 finding 4: draft.train.processes 64 passed validate on a 24 GiB machine (about 0.8 GB
    measured per process); the machine's memory is set here so the case does not depend on the host."""
    from trtbuild.app import crosschecks

    monkeypatch.setattr(crosschecks, "machine_memory", lambda: ram_gib << 30)
    monkeypatch.setenv("TRTBUILD_CACHE", str(tmp_path / "cache"))
    (tmp_path / "r.yaml").write_text(BASE + f"draft:\n  batch_size: 64\n  train:\n    device: cpu\n"
                                     f"    processes: {processes}\n")
    if not refused:
        main(["validate", str(tmp_path / "r.yaml")])
        assert "ok" in capsys.readouterr().out
        return
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", str(tmp_path / "r.yaml")])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1, err
    assert f"{tmp_path / 'r.yaml'}:7: draft.train.processes: 64 training processes need about" in err, err
    assert "more than this machine's 24.0 GiB" in err and "use at most" in err, err
    most = int(err.rsplit("use at most ", 1)[1].rstrip(")"))
    assert 8 <= most < 64, err  # the 8 processes the case above accepts fit, 64 do not
