"""Stand-in for TensorRT-LLM 1.2.1's package __init__ (not TensorRT-LLM): only what the module touches,
in upstream's import order (trtbuild/core/contract/trtllm-1.2.1.yaml, package_import: tensorrt_llm/__init__.py
imports `tensorrt_llm._torch.models` (-> modeling_llama -> _torch.modules.linear) before
`from .version import __version__`), so code run while the linear module loads meets a package
without __version__, as in the real server."""
import standin_ops  # noqa: F401  (registers the stand-in ops)

import tensorrt_llm._torch.models as torch_models  # noqa: F401,E402  (before the version, as upstream)

from .version import __version__  # noqa: E402,F401
