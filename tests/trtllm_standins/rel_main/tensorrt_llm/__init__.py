"""Stand-in for TensorRT-LLM main@00bbf71 (a 1.3.0rc; not TensorRT-LLM): only what the module touches.
Newer mains import the version first (tensorrt_llm/__init__.py@083a7415, lazy public surface); this
stand-in has no dist-info, like a source checkout, so the module reads tensorrt_llm/version.py."""
import standin_ops  # noqa: F401  (registers the stand-in ops)

from .version import __version__  # noqa: E402,F401
