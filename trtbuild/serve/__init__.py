"""Serving a built deployment (beside the sections: it reads their artifacts, imports runtime and core).

Modules:
    server       run the tritonserver bundled in nvidia-pytriton on repositories, stop it cleanly
    front, grpc_front, field_ranges  the HTTP and gRPC fronts and their request-field limits
    listener     sockets the fronts listen on
    openai_api/  the OpenAI-compatible API
    textgen, textbatch  text in, text out around the runtime: the one path both the server and bench use
    client       HTTP generate / generate_stream / infer and gRPC streaming clients
    bench        tokens/s/user, TTFT and inter-token latency through the server, vs in-process
    loadgen/     AIPerf and the load-test report
    commands     `trtbuild serve` / `demo` / `bench --server` on a deploy artifact
"""
