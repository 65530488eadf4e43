"""The deploy section: Triton Inference Server model repositories and their launchers.

Modules:
    config       the deploy stage's recipe section (DeployConfig and its target options)
    stage        the stage adapter
    deploy       the deploy stage's work: read the bundle, write repositories + launchers, check them
    repo_trtllm  the repository for TensorRT-LLM's Triton backend (the LLM-API model)
    repo_local   the repository that serves the project's own runtime (CPU rehearsal)
    local_model  the python-backend model.py of the local repository (copied into it; it runs in the
                 server, where it uses trtbuild.serve's text generation)
    launch       container / local launch scripts
What the stage reads from the engine bundle (core/bundle_info.py) and config.pbtxt (core/pbtxt.py) are
formats in core; serving the repositories is trtbuild/serve/.
"""
