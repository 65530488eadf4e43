"""The engine section: everything trtbuild knows about TensorRT-LLM, without importing it.

Modules:
    config      the engine stage's recipe section (EngineConfig and its settings)
    stage       the stage adapter
    launchers   trtllm-serve on one node, under mpirun, and an sbatch script for Slurm
    facts       the target's architecture facts (heads, experts, context) read from config.json
    checks      cross-stage preflight checks of an engine section against the rest of the recipe
    bundle      assembling the engine bundle directory (hard links, the GEMM-plugin module)
    plugin_module  the out-of-tree module TensorRT-LLM's server imports (conventions: trtbuild/core/contract)
    conformance the bundle and the recipe's rendered bundle against the release's contract
    boundary    the only place that imports `tensorrt_llm`, lazily: the load check
The typed `LLM()` arguments (llm_api_options.yaml) are core/llm_args.py, read by deploy and serve too;
the bundle a recipe would write, checked before any build, is app/recipe_conformance.py.
"""
