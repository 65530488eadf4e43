"""Stand-in for tensorrt_llm/_torch/models/__init__.py (not TensorRT-LLM): imports the model files,
whose layers import the linear module."""
from .modeling_llama import LlamaDecoderLayerStandin

__all__ = ["LlamaDecoderLayerStandin"]
