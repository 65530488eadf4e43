"""Versioned contracts: what each supported TensorRT-LLM release (and its Triton image) accepts.

One YAML data file per release (`trtllm-<version>.yaml`), written by hand from upstream source,
each fact naming the upstream file it was read from (path@commit). `load_contract(version)` reads
one; `trtbuild.core.contract.validate` checks what trtbuild emits (options YAML, launcher argv, Triton
model.yaml / config.pbtxt, requests, draft checkpoint, FP8 config.json) against it. Emitters read
the names they write (decoding type, draft key, options flag, request fields) from the contract.
"""

from trtbuild.core.contract.model import (
    DEFAULT_VERSION,
    Contract,
    Violation,
    available_versions,
    contract_files,
    load_contract,
    module_conventions,
)

__all__ = ["DEFAULT_VERSION", "Contract", "Violation", "available_versions", "contract_files", "load_contract",
           "module_conventions"]
