"""Stand-in for TensorRT-LLM 1.1.0 (not TensorRT-LLM): only what the GEMM-plugin module touches."""
import standin_ops  # noqa: F401  (registers the stand-in ops)

__version__ = "1.1.0"
