"""Stand-in for tensorrt_llm/_torch/models/modeling_llama.py (not TensorRT-LLM): what matters here is
that importing it imports the linear module (`from ..modules.linear import Linear`)."""
from ..modules.linear import Linear


class LlamaDecoderLayerStandin:
    linear_class = Linear
