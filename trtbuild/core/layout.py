"""The folder names inside each stage's artifact, and which checkpoint is served: one place for both.

Every module that writes or reads an artifact's folders takes the names from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

# The cache's stage directories, in pipeline order (trtbuild.app.stages registers a Stage for each).
STAGE_ORDER = ("model", "quantize", "draft", "engine", "deploy")
# Cache directories of the draft stage's shard sets (trtbuild/draft/shards.py), entries like a stage's:
# the target's regenerated training data, and the captured hidden states of offline training.
DRAFT_DATA = "draft-data"
DRAFT_HIDDEN = "draft-hidden"
SHARD_SETS = (DRAFT_DATA, DRAFT_HIDDEN)

MODEL_HF = "hf"  # model stage: the target's Hugging Face directory (a link for path / hub sources)
QUANTIZED_HF = "hf"  # quantize stage: ModelOpt's unified Hugging Face export
DRAFT_EAGLE3 = "eagle3"  # draft stage: the EAGLE-3 checkpoint (absent for ngram / none)
BUNDLE = "bundle"  # engine stage: the TensorRT-LLM bundle; deploy stage: a relative link to it


def served_checkpoint(artifacts: Mapping[str, Path]) -> Path:
    """What is served and benchmarked: the quantize stage's export when the recipe quantizes, else the
    model stage's directory (`artifacts`: stage name -> artifact directory)."""
    if "quantize" in artifacts:
        return artifacts["quantize"] / QUANTIZED_HF
    return artifacts["model"] / MODEL_HF
