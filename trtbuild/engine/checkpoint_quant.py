"""Which quantization a checkpoint directory declares, read the way TensorRT-LLM reads it.

Its own module so that the bundle, the engine checks and `plan` can all read it without importing
each other (the bundle is below the checks).
"""

from __future__ import annotations

from pathlib import Path


def quant_of_dir(directory: Path) -> tuple[str | None, str | None, str | None]:
    """(quant_algo, kv_cache_quant_algo, file) as TensorRT-LLM reads them: ModelOpt's hf_quant_config.json
    (`quantization`) first, then config.json's `quantization_config`; Nones when neither says."""
    import json

    for name, key in (("hf_quant_config.json", "quantization"), ("config.json", "quantization_config")):
        try:
            quant = json.loads((directory / name).read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(quant, dict):
            return quant.get("quant_algo"), quant.get("kv_cache_quant_algo"), name
    return None, None, None
