"""Clients of a served model: HTTP generate / generate_stream (SSE), KServe v2 infer, gRPC streaming.

Every call returns the text, the token ids and the arrival time of each piece, so the load test
can measure time to first token and inter-token latency from what a user would see.

Request field names differ by model: trtbuild's local model takes `max_tokens` / `stream`;
TRT-LLM's LLM-API model takes `sampling_param_max_tokens` / `streaming` and ignores the others
(contract: triton_llmapi.request). `fields` maps trtbuild's names to the
model's; the deploy stage records the mapping of the repository it wrote (deploy.json).
"""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trtbuild.core.errors import TrtbuildError


class RequestFailed(TrtbuildError):
    """The server answered with an error (status is the HTTP status, or None for gRPC)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Streamed:
    """One request's answer: text pieces with their arrival times (seconds after sending)."""

    pieces: list[str] = field(default_factory=list)
    ids: list[list[int]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    total_s: float = 0.0

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def token_ids(self) -> list[int]:
        return [i for chunk in self.ids for i in chunk]

    @property
    def num_tokens(self) -> int:
        return sum(len(c) for c in self.ids)

    def add(self, text: str, ids: list[int], t: float) -> None:
        self.pieces.append(text)
        self.ids.append(ids)
        self.times.append(t)

    @property
    def ttft_s(self) -> float:
        for chunk, t in zip(self.ids, self.times, strict=True):
            if chunk:
                return t
        return self.total_s

    @property
    def last_token_s(self) -> float:
        token_times = [t for chunk, t in zip(self.ids, self.times, strict=True) if chunk]
        return token_times[-1] if token_times else self.total_s

    @property
    def tokens_per_s_per_user(self) -> float:
        """(tokens - 1) / (last token time - first token time): the runtime's own definition."""
        span = self.last_token_s - self.ttft_s
        return (self.num_tokens - 1) / span if self.num_tokens > 1 and span > 0 else 0.0

    @property
    def inter_token_s(self) -> float:
        span = self.last_token_s - self.ttft_s
        return span / (self.num_tokens - 1) if self.num_tokens > 1 else 0.0


def _ids(value: Any) -> list[int]:
    """Triton's generate extension writes a one-element tensor as a bare number."""
    if value is None:
        return []
    if isinstance(value, list):
        return [int(v) for v in value]
    return [int(value)]


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "".join(str(v) for v in value)
    return "" if value is None else str(value)


def request_body(prompt: str, max_tokens: int, fields: Mapping[str, str] | None = None, *,
                 stream: bool | None = None, **params: Any) -> dict[str, Any]:
    """A generate request with the model's names for max_tokens, stream and sampling parameters."""
    names = dict(fields or {})
    body: dict[str, Any] = {"text_input": prompt, names.get("max_tokens", "max_tokens"): max_tokens}
    if stream is not None:
        body[names.get("stream", "stream")] = stream
    body.update({names.get(key, key): value for key, value in params.items()})
    return body


def _base(url: str) -> str:
    return url if url.startswith(("http://", "https://")) else f"http://{url}"


def generate(url: str, model: str, prompt: str, max_tokens: int, timeout_s: float = 300.0,
             fields: Mapping[str, str] | None = None, **params: Any) -> Streamed:
    """POST /v2/models/<model>/generate: the whole answer in one response."""
    import requests

    body = request_body(prompt, max_tokens, fields, **params)
    start = time.perf_counter()
    response = requests.post(f"{_base(url)}/v2/models/{model}/generate", json=body, timeout=timeout_s)
    elapsed = time.perf_counter() - start
    data = _json_or_error(response)
    out = Streamed(total_s=elapsed)
    out.add(_text(data.get("text_output")), _ids(data.get("output_ids")), elapsed)
    return out


def generate_stream(url: str, model: str, prompt: str, max_tokens: int, timeout_s: float = 300.0,
                    session: Any = None, fields: Mapping[str, str] | None = None, **params: Any) -> Streamed:
    """POST /v2/models/<model>/generate_stream with stream=true: one server-sent event per decode step."""
    import requests

    body = request_body(prompt, max_tokens, fields, stream=True, **params)
    http = session or requests
    start = time.perf_counter()
    out = Streamed()
    with http.post(f"{_base(url)}/v2/models/{model}/generate_stream", json=body, stream=True,
                   timeout=timeout_s) as response:
        if response.status_code != 200:
            _json_or_error(response)
        for line in response.iter_lines(chunk_size=None):
            if not line or not line.startswith(b"data:"):
                continue
            event = json.loads(line[5:])
            if "error" in event:
                raise RequestFailed(f"server error: {event['error']}", response.status_code)
            arrived = time.perf_counter() - start
            out.add(_text(event.get("text_output")), _ids(event.get("output_ids")), arrived)
    out.total_s = time.perf_counter() - start
    return out


def infer(url: str, model: str, prompt: str, max_tokens: int, timeout_s: float = 300.0,
          fields: Mapping[str, str] | None = None) -> Streamed:
    """KServe v2 POST /v2/models/<model>/infer (models without the decoupled policy)."""
    import requests

    max_name = (fields or {}).get("max_tokens", "max_tokens")
    body = {"inputs": [
        {"name": "text_input", "shape": [1, 1], "datatype": "BYTES", "data": [prompt]},
        {"name": max_name, "shape": [1, 1], "datatype": "INT32", "data": [max_tokens]},
    ]}
    start = time.perf_counter()
    response = requests.post(f"{_base(url)}/v2/models/{model}/infer", json=body, timeout=timeout_s)
    data = _json_or_error(response)
    elapsed = time.perf_counter() - start
    outputs = {o["name"]: o["data"] for o in data.get("outputs", [])}
    out = Streamed(total_s=elapsed)
    out.add(_text(outputs.get("text_output")), _ids(outputs.get("output_ids")), elapsed)
    return out


def _json_or_error(response: Any) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        data = {"error": response.text[:300]}
    if response.status_code != 200 or "error" in data:
        raise RequestFailed(f"HTTP {response.status_code}: {data.get('error', data)}", response.status_code)
    return data


def stream_grpc(url: str, model: str, prompt: str, max_tokens: int, timeout_s: float = 300.0,
                stream: bool = True, fields: Mapping[str, str] | None = None, **params: Any) -> Streamed:
    """KServe v2 gRPC bidirectional stream (ModelStreamInfer), as decoupled models need."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    events: queue.Queue[tuple[Any, Any, float]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    try:
        text = np.array([[prompt.encode()]], dtype=np.object_)
        names = dict(fields or {})
        inputs = [_grpc_input(grpcclient, "text_input", text, "BYTES"),
                  _grpc_input(grpcclient, names.get("max_tokens", "max_tokens"),
                              np.array([[max_tokens]], dtype=np.int32), "INT32"),
                  _grpc_input(grpcclient, names.get("stream", "stream"), np.array([[stream]], dtype=np.bool_),
                              "BOOL")]
        for name, value in params.items():
            inputs.append(_grpc_param(grpcclient, names.get(name, name), value))
        start = time.perf_counter()
        client.start_stream(callback=lambda result, error: events.put((result, error, time.perf_counter())))
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        out = Streamed()
        while True:
            result, error, arrived = events.get(timeout=timeout_s)
            if error is not None:
                raise RequestFailed(f"gRPC error: {error}")
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            if response.outputs:
                text = result.as_numpy("text_output")
                ids = result.as_numpy("output_ids")
                piece = b"".join(text.reshape(-1)).decode("utf-8") if text is not None else ""
                out.add(piece, [int(i) for i in ids.reshape(-1)] if ids is not None else [], arrived - start)
            if final:
                out.total_s = arrived - start
                return out
    finally:
        client.stop_stream()
        client.close()


def _grpc_input(grpcclient: Any, name: str, value: Any, dtype: str) -> Any:
    tensor = grpcclient.InferInput(name, list(value.shape), dtype)
    tensor.set_data_from_numpy(value)
    return tensor


def _grpc_param(grpcclient: Any, name: str, value: Any) -> Any:
    import numpy as np

    kinds = {bool: (np.bool_, "BOOL"), int: (np.int32, "INT32"), float: (np.float32, "FP32")}
    np_type, dtype = kinds[type(value)]
    if name.endswith("seed"):
        np_type, dtype = np.uint64, "UINT64"
    return _grpc_input(grpcclient, name, np.array([[value]], dtype=np_type), dtype)
