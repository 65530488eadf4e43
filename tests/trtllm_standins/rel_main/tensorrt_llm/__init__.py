"""Stand-in for TensorRT-LLM main@00bbf71 (a 1.3.0rc; not TensorRT-LLM): only what the module touches."""
import standin_ops  # noqa: F401  (registers the stand-in ops)

__version__ = "1.3.0rc0"
