"""Below everything: what stages, the runtime and serving share, importing no other trtbuild layer.

Modules:
    stage_api, stage  StageConfig/StageContext/StageResult/Artifact and the Stage base class
    recipe_info  RecipeInfo: a recipe's top-level fields, paths, positions, typed `section(cls)` access
    cache, code_version  the artifact cache and the import-closure hash in every stage key
    errors, progress, safepaths, shell, yaml_positions, layout  one-line errors, progress, safe paths,
                 shell quoting, YAML with line numbers, the folders inside artifacts
    hf_files     the local HF cache, config.json, pickle refusal (no huggingface_hub, no transformers)
    bundle_info, llm_args, pbtxt, safetensors_header  formats of artifacts several sections read
    plugins      the GEMM-plugin registry (kernels live in the top-level `plugins/` package)
    contract/    versioned TensorRT-LLM release contracts (path@commit facts) and their checks
    data/        text and chat data sources
"""
