"""Tensor lists of TensorRT-LLM's inflight-batcher Triton models, as data.

The model.py files of preprocessing, postprocessing and tensorrt_llm_bls come from the Triton
TRT-LLM container (all_models/inflight_batcher_llm/<model>/1/model.py) and look their inputs and
outputs up in the model config by name, so each config here declares the same tensors as the
release's config.pbtxt templates (TensorRT-LLM triton_backend/all_models/inflight_batcher_llm).
Only the values that were `${...}` template parameters are ours; those are filled in
repo_trtllm from the recipe.

A row is (name, data_type, dims, flags) with flags a set of: "opt" (optional), "ragged"
(allow_ragged_batch), "scalar" (reshape to a scalar: `reshape { shape: [] }`).
"""

from __future__ import annotations

from typing import Any

from trtbuild.triton.pbtxt import Enum

Row = tuple[str, str, list[int], frozenset[str]]
LOGITS = "LOGITS"  # stands for the recipe's logits data type
TABLE = "TABLE"  # stands for the prompt-table / encoder-feature data type (fp16 in the templates)
_N: frozenset[str] = frozenset()
OPT = frozenset({"opt"})
OPT_S = frozenset({"opt", "scalar"})
OPT_R = frozenset({"opt", "ragged"})
S = frozenset({"scalar"})


def tensors(rows: list[Row], logits_type: str = "TYPE_FP32",
            table_type: str = "TYPE_FP16") -> list[dict[str, Any]]:
    """Config entries for `rows`; LOGITS / TABLE stand for the recipe's logits and table dtypes."""
    chosen = {LOGITS: logits_type, TABLE: table_type}
    out = []
    for name, dtype, dims, flags in rows:
        entry: dict[str, Any] = {"name": name, "data_type": Enum(chosen.get(dtype, dtype)), "dims": dims}
        if "scalar" in flags:
            entry["reshape"] = {"shape": []}
        if "ragged" in flags:
            entry["allow_ragged_batch"] = True
        if "opt" in flags:
            entry["optional"] = True
        out.append(entry)
    return out


PREPROCESSING_INPUTS: list[Row] = [
    ("QUERY", "TYPE_STRING", [1], _N),
    ("DECODER_QUERY", "TYPE_STRING", [1], OPT),
    ("IMAGE_BYTES", "TYPE_UINT8", [-1, -1, -1, -1], OPT),
    ("IMAGE_URL", "TYPE_STRING", [1], OPT),
    ("IMAGES", "TYPE_STRING", [-1], OPT),
    ("VIDEO_BYTES", "TYPE_UINT8", [-1, -1, -1, -1], OPT),
    ("REQUEST_OUTPUT_LEN", "TYPE_INT32", [1], _N),
    ("BAD_WORDS_DICT", "TYPE_STRING", [-1], OPT),
    ("STOP_WORDS_DICT", "TYPE_STRING", [-1], OPT),
    ("EMBEDDING_BIAS_WORDS", "TYPE_STRING", [-1], OPT),
    ("EMBEDDING_BIAS_WEIGHTS", "TYPE_FP32", [-1], OPT),
    ("END_ID", "TYPE_INT32", [1], OPT),
    ("PAD_ID", "TYPE_INT32", [1], OPT),
    ("PROMPT_TABLE_EXTRA_ID", "TYPE_UINT64", [1], OPT),
]

PREPROCESSING_OUTPUTS: list[Row] = [
    ("INPUT_ID", "TYPE_INT32", [-1], _N),
    ("REQUEST_INPUT_LEN", "TYPE_INT32", [1], _N),
    ("DECODER_INPUT_ID", "TYPE_INT32", [-1], _N),
    ("REQUEST_DECODER_INPUT_LEN", "TYPE_INT32", [1], _N),
    ("BAD_WORDS_IDS", "TYPE_INT32", [2, -1], _N),
    ("STOP_WORDS_IDS", "TYPE_INT32", [2, -1], _N),
    ("EMBEDDING_BIAS", "TYPE_FP32", [-1], _N),
    ("REQUEST_OUTPUT_LEN", "TYPE_INT32", [-1], _N),
    ("OUT_END_ID", "TYPE_INT32", [1], _N),
    ("OUT_PAD_ID", "TYPE_INT32", [1], _N),
    ("OUT_PROMPT_TABLE_EXTRA_IDS", "TYPE_UINT64", [-1], _N),
    ("PIXEL_VALUES", "TYPE_FP16", [-1, -1, -1, -1], _N),
    ("ASPECT_RATIO_IDS", "TYPE_INT64", [-1], _N),
    ("ASPECT_RATIO_MASK", "TYPE_INT64", [-1, -1], _N),
    ("CROSS_ATTENTION_MASK", "TYPE_INT64", [-1, -1, -1], _N),
    ("IMAGE_SIZES", "TYPE_INT64", [-1, 2], _N),
    ("IS_VIDEO_INPUT", "TYPE_BOOL", [1], _N),
    ("ATTENTION_MASK", "TYPE_INT64", [-1], _N),
    ("IMAGE_GRID_THW", "TYPE_INT64", [3], _N),
    ("VISION_INPUT_ID", "TYPE_INT32", [-1], _N),
]

POSTPROCESSING_INPUTS: list[Row] = [
    ("TOKENS_BATCH", "TYPE_INT32", [-1, -1], _N),
    ("SEQUENCE_LENGTH", "TYPE_INT32", [-1], _N),
]
POSTPROCESSING_OUTPUTS: list[Row] = [("OUTPUT", "TYPE_STRING", [-1], _N)]

_SCALAR_OPTIONAL = {
    "TYPE_INT32": ["num_return_sequences", "end_id", "pad_id", "beam_width", "runtime_top_k",
                   "runtime_top_p_reset_ids", "min_tokens", "prompt_vocab_size"],
    "TYPE_FP32": ["draft_acceptance_threshold", "temperature", "runtime_top_p", "runtime_top_p_min",
                  "runtime_top_p_decay", "len_penalty", "repetition_penalty", "beam_search_diversity_rate",
                  "presence_penalty", "frequency_penalty"],
    "TYPE_BOOL": ["early_stopping", "return_log_probs", "return_context_logits", "return_generation_logits",
                  "return_perf_metrics", "return_num_input_tokens", "return_num_output_tokens",
                  "exclude_input_in_output", "stop", "streaming"],
    "TYPE_UINT64": ["seed", "lora_task_id"],
}

TENSORRT_LLM_INPUTS: list[Row] = [
    ("input_ids", "TYPE_INT32", [-1], OPT_R),
    ("encoder_input_features", TABLE, [-1, -1], OPT_R),
    ("encoder_output_lengths", "TYPE_INT32", [1], OPT_S),
    ("input_lengths", "TYPE_INT32", [1], S),
    ("request_output_len", "TYPE_INT32", [1], S),
    ("draft_input_ids", "TYPE_INT32", [-1], OPT_R),
    ("decoder_input_ids", "TYPE_INT32", [-1], OPT_R),
    ("decoder_input_lengths", "TYPE_INT32", [1], OPT_S),
    ("draft_logits", LOGITS, [-1, -1], OPT_R),
    ("stop_words_list", "TYPE_INT32", [2, -1], OPT_R),
    ("bad_words_list", "TYPE_INT32", [2, -1], OPT_R),
    ("embedding_bias", "TYPE_FP32", [-1], OPT_R),
    *[(name, dtype, [1], OPT_S) for dtype, names in _SCALAR_OPTIONAL.items() for name in names],
    ("prompt_embedding_table", TABLE, [-1, -1], OPT_R),
    ("prompt_table_extra_ids", "TYPE_UINT64", [-1], OPT_R),
    ("cross_attention_mask", "TYPE_BOOL", [-1, -1], OPT_R),
    ("mrope_rotary_cos_sin", "TYPE_FP32", [-1], OPT),
    ("mrope_position_deltas", "TYPE_INT64", [1], OPT),
    ("lora_weights", "TYPE_FP16", [-1, -1], OPT_R),
    ("lora_config", "TYPE_INT32", [-1, 3], OPT_R),
    ("context_phase_params", "TYPE_UINT8", [-1], OPT_R),
    ("skip_cross_attn_blocks", "TYPE_BOOL", [1], OPT_R),
    ("retention_token_range_starts", "TYPE_INT32", [-1], OPT_R),
    ("retention_token_range_ends", "TYPE_INT32", [-1], OPT_R),
    ("retention_token_range_priorities", "TYPE_INT32", [-1], OPT_R),
    ("retention_token_range_durations_ms", "TYPE_INT32", [-1], OPT_R),
    ("retention_decode_priority", "TYPE_INT32", [1], OPT_R),
    ("retention_decode_duration_ms", "TYPE_INT32", [1], OPT_R),
    ("guided_decoding_guide_type", "TYPE_STRING", [1], OPT_R),
    ("guided_decoding_guide", "TYPE_STRING", [1], OPT_R),
    ("lookahead_window_size", "TYPE_INT32", [1], OPT_R),
    ("lookahead_ngram_size", "TYPE_INT32", [1], OPT_R),
    ("lookahead_verification_set_size", "TYPE_INT32", [1], OPT_R),
]

_STATS_OUTPUTS: list[Row] = [
    ("batch_index", "TYPE_INT32", [1], _N),
    ("sequence_index", "TYPE_INT32", [1], _N),
    ("kv_cache_alloc_new_blocks", "TYPE_INT32", [1], _N),
    ("kv_cache_reused_blocks", "TYPE_INT32", [1], _N),
    ("kv_cache_alloc_total_blocks", "TYPE_INT32", [1], _N),
    ("arrival_time_ns", "TYPE_INT64", [1], _N),
    ("first_scheduled_time_ns", "TYPE_INT64", [1], _N),
    ("first_token_time_ns", "TYPE_INT64", [1], _N),
    ("last_token_time_ns", "TYPE_INT64", [1], _N),
    ("acceptance_rate", "TYPE_FP32", [1], _N),
    ("total_accepted_draft_tokens", "TYPE_INT32", [1], _N),
    ("total_draft_tokens", "TYPE_INT32", [1], _N),
    ("num_input_tokens", "TYPE_INT32", [1], _N),
    ("num_output_tokens", "TYPE_INT32", [1], _N),
]

TENSORRT_LLM_OUTPUTS: list[Row] = [
    ("output_ids", "TYPE_INT32", [-1, -1], _N),
    ("sequence_length", "TYPE_INT32", [-1], _N),
    ("cum_log_probs", "TYPE_FP32", [-1], _N),
    ("output_log_probs", "TYPE_FP32", [-1, -1], _N),
    ("context_logits", LOGITS, [-1, -1], _N),
    ("generation_logits", LOGITS, [-1, -1, -1], _N),
    ("context_phase_params", "TYPE_UINT8", [-1], _N),
    *_STATS_OUTPUTS,
]

# What a client sends to the ensemble / BLS (text in, text out).
TEXT_INPUTS: list[Row] = [
    ("text_input", "TYPE_STRING", [1], _N),
    ("decoder_text_input", "TYPE_STRING", [1], OPT),
    ("max_tokens", "TYPE_INT32", [1], _N),
    ("num_return_sequences", "TYPE_INT32", [1], OPT),
    ("bad_words", "TYPE_STRING", [-1], OPT),
    ("stop_words", "TYPE_STRING", [-1], OPT),
    ("exclude_input_in_output", "TYPE_BOOL", [1], OPT),
    ("end_id", "TYPE_INT32", [1], OPT),
    ("pad_id", "TYPE_INT32", [1], OPT),
    ("top_k", "TYPE_INT32", [1], OPT),
    ("top_p", "TYPE_FP32", [1], OPT),
    ("temperature", "TYPE_FP32", [1], OPT),
    ("length_penalty", "TYPE_FP32", [1], OPT),
    ("repetition_penalty", "TYPE_FP32", [1], OPT),
    ("min_tokens", "TYPE_INT32", [1], OPT),
    ("presence_penalty", "TYPE_FP32", [1], OPT),
    ("frequency_penalty", "TYPE_FP32", [1], OPT),
    ("seed", "TYPE_UINT64", [1], OPT),
    ("return_log_probs", "TYPE_BOOL", [1], OPT),
    ("return_context_logits", "TYPE_BOOL", [1], OPT),
    ("return_generation_logits", "TYPE_BOOL", [1], OPT),
    ("return_perf_metrics", "TYPE_BOOL", [1], OPT),
    ("return_num_input_tokens", "TYPE_BOOL", [1], OPT),
    ("return_num_output_tokens", "TYPE_BOOL", [1], OPT),
    ("beam_width", "TYPE_INT32", [1], OPT),
    ("stream", "TYPE_BOOL", [1], OPT),
    ("prompt_embedding_table", "TYPE_FP16", [-1, -1], OPT),
    ("prompt_table_extra_id", "TYPE_UINT64", [1], OPT),
    ("prompt_vocab_size", "TYPE_INT32", [1], OPT),
    ("embedding_bias_words", "TYPE_STRING", [-1], OPT),
    ("embedding_bias_weights", "TYPE_FP32", [-1], OPT),
    ("lora_task_id", "TYPE_UINT64", [1], OPT),
    ("lora_weights", "TYPE_FP16", [-1, -1], OPT_R),
    ("lora_config", "TYPE_INT32", [-1, 3], OPT_R),
    ("guided_decoding_guide_type", "TYPE_STRING", [1], OPT),
    ("guided_decoding_guide", "TYPE_STRING", [1], OPT),
]

BLS_EXTRA_INPUTS: list[Row] = [
    ("image_input", "TYPE_FP16", [-1, 3, -1, -1], OPT),
    ("image_bytes_input", "TYPE_UINT8", [-1, -1, -1, -1], OPT),
    ("image_url_input", "TYPE_STRING", [1], OPT),
    ("video_bytes_input", "TYPE_UINT8", [-1, -1, -1, -1], OPT),
    ("num_draft_tokens", "TYPE_INT32", [1], OPT),
    ("use_draft_logits", "TYPE_BOOL", [1], OPT_S),
]

TEXT_OUTPUTS: list[Row] = [
    ("text_output", "TYPE_STRING", [-1], _N),
    ("cum_log_probs", "TYPE_FP32", [-1], _N),
    ("output_log_probs", "TYPE_FP32", [-1, -1], _N),
    ("context_logits", LOGITS, [-1, -1], _N),
    ("generation_logits", LOGITS, [-1, -1, -1], _N),
    *_STATS_OUTPUTS,
]

# Ensemble wiring: client tensor -> preprocessing input, and client tensor -> tensorrt_llm input.
ENSEMBLE_TO_PREPROCESSING = {
    "QUERY": "text_input", "DECODER_QUERY": "decoder_text_input", "REQUEST_OUTPUT_LEN": "max_tokens",
    "BAD_WORDS_DICT": "bad_words", "STOP_WORDS_DICT": "stop_words",
    "EMBEDDING_BIAS_WORDS": "embedding_bias_words", "EMBEDDING_BIAS_WEIGHTS": "embedding_bias_weights",
    "END_ID": "end_id", "PAD_ID": "pad_id", "PROMPT_TABLE_EXTRA_ID": "prompt_table_extra_id",
}
PREPROCESSING_TO_ENSEMBLE = {
    "REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN", "INPUT_ID": "_INPUT_ID",
    "REQUEST_DECODER_INPUT_LEN": "_REQUEST_DECODER_INPUT_LEN", "DECODER_INPUT_ID": "_DECODER_INPUT_ID",
    "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN", "STOP_WORDS_IDS": "_STOP_WORDS_IDS",
    "BAD_WORDS_IDS": "_BAD_WORDS_IDS", "EMBEDDING_BIAS": "_EMBEDDING_BIAS",
    "OUT_END_ID": "_PREPROCESSOR_END_ID", "OUT_PAD_ID": "_PREPROCESSOR_PAD_ID",
    "OUT_PROMPT_TABLE_EXTRA_IDS": "_OUT_PROMPT_TABLE_EXTRA_IDS",
}
ENSEMBLE_TO_TENSORRT_LLM = {
    "input_ids": "_INPUT_ID", "decoder_input_ids": "_DECODER_INPUT_ID",
    "input_lengths": "_REQUEST_INPUT_LEN", "decoder_input_lengths": "_REQUEST_DECODER_INPUT_LEN",
    "exclude_input_in_output": "exclude_input_in_output",
    "request_output_len": "_REQUEST_OUTPUT_LEN", "end_id": "_PREPROCESSOR_END_ID",
    "pad_id": "_PREPROCESSOR_PAD_ID", "embedding_bias": "_EMBEDDING_BIAS", "runtime_top_k": "top_k",
    "runtime_top_p": "top_p", "temperature": "temperature", "len_penalty": "length_penalty",
    "repetition_penalty": "repetition_penalty", "min_tokens": "min_tokens",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "seed": "seed", "return_log_probs": "return_log_probs",
    "return_context_logits": "return_context_logits", "return_generation_logits": "return_generation_logits",
    "return_perf_metrics": "return_perf_metrics", "return_num_input_tokens": "return_num_input_tokens",
    "return_num_output_tokens": "return_num_output_tokens", "num_return_sequences": "num_return_sequences",
    "beam_width": "beam_width", "streaming": "stream", "prompt_embedding_table": "prompt_embedding_table",
    "prompt_vocab_size": "prompt_vocab_size", "stop_words_list": "_STOP_WORDS_IDS",
    "bad_words_list": "_BAD_WORDS_IDS", "prompt_table_extra_ids": "_OUT_PROMPT_TABLE_EXTRA_IDS",
    "lora_task_id": "lora_task_id", "lora_weights": "lora_weights", "lora_config": "lora_config",
    "guided_decoding_guide_type": "guided_decoding_guide_type",
    "guided_decoding_guide": "guided_decoding_guide",
}
TENSORRT_LLM_TO_ENSEMBLE = {
    "output_ids": "_TOKENS_BATCH", "sequence_length": "_SEQUENCE_LENGTH",
    **{name: name for name in ("cum_log_probs", "output_log_probs", "context_logits", "generation_logits")},
    **{row[0]: row[0] for row in _STATS_OUTPUTS},
}
