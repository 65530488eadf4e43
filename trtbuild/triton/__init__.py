"""Triton Inference Server: model repositories, the server launcher, clients and the load test.

Modules:
    config       the deploy stage's recipe section (DeployConfig and its target options)
    deploy       the deploy stage's work: read the bundle, write repositories + launchers, check them
    bundle_info  what the deploy stage reads from the engine bundle (paths, batch size, draft length)
    pbtxt        write config.pbtxt from plain data; parse every file back into Triton's ModelConfig
    repo_trtllm  the repository for TensorRT-LLM's Triton backend (the LLM-API model)
    repo_local   the repository that serves the project's own runtime (CPU rehearsal)
    local_model  the python-backend model.py of the local repository (copied into it)
    launch       container / local launch scripts
    textgen      text in, text out around the runtime: the one path both the server and bench use
    server       run the tritonserver bundled in nvidia-pytriton on repositories, stop it cleanly
    client       HTTP generate / generate_stream / infer and gRPC streaming clients
    bench        tokens/s/user, TTFT and inter-token latency through the server, vs in-process
    commands     `trtbuild serve` / `trtbuild bench --server` entry points on a deploy artifact
"""
