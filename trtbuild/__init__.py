"""trtbuild: one declarative recipe from a Hugging Face LLM to a deployed TensorRT-LLM / Triton service."""

__version__ = "0.1.0"
