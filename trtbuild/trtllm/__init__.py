"""Everything trtbuild knows about TensorRT-LLM, without importing it.

Modules:
    config      the engine stage's recipe section (EngineConfig and its settings)
    llm_args    a typed model of the `LLM()` arguments we write (llm_api_options.yaml); unknown keys
                are errors, and write -> read gives the same object back
    launchers   trtllm-serve on one node, under mpirun, and an sbatch script for Slurm
    facts       the target's architecture facts (heads, experts, context) read from config.json
    checks      cross-stage preflight checks of an engine section against the rest of the recipe
    bundle      assembling the engine bundle directory (hard links, the GEMM-plugin module)
    plugin_module  the out-of-tree module TensorRT-LLM's server imports (conventions: trtbuild/contract)
    conformance the bundle and the recipe's rendered bundle against the release's contract
    recipe_conformance  the bundle a recipe would write, rendered and checked before any build
    boundary    the only place that imports `tensorrt_llm`, lazily: the load check
"""
