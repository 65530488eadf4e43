"""The Triton deployment behind the OpenAI front: its generate_stream endpoint (SSE), read as it arrives.

Leaving the stream early (a stop sequence, a client that went away) closes the HTTP connection;
Triton cancels the request and the local model drops it from its batch at the next step.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from trtbuild.serve.openai_api.protocol import OpenAIError


def _ids(value: Any) -> list[int]:
    """Triton's generate extension writes a one-element tensor as a bare number."""
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def _error(status: int, message: str) -> OpenAIError:
    if 400 <= status < 500:  # the model refused the values (INVALID_ARG): the client's to fix
        return OpenAIError(400, message)
    return OpenAIError(503 if status in (0, 502, 503) else 500, f"the model server failed: {message}",
                       type="server_error")


async def generate_stream(session: aiohttp.ClientSession, base_url: str, model: str, fields: dict[str, Any],
                          headers: dict[str, str] | None = None) -> AsyncIterator[tuple[str, list[int]]]:
    """(text delta, token ids) per decode step of one request; `headers` go with it (the key of
    tritonserver's restricted APIs)."""
    body = {**fields, "stream": True}
    try:
        async with session.post(f"{base_url}/v2/models/{model}/generate_stream", json=body,
                                headers=headers) as response:
            if response.status != 200:
                text = (await response.text()).strip()
                try:  # a JSON body, or (generate_stream) one server-sent event holding it
                    message = json.loads(text.removeprefix("data:")).get("error", text)
                except (ValueError, AttributeError):
                    message = text[:300]
                raise _error(response.status, str(message))
            async for line in response.content:
                if not line.startswith(b"data:"):
                    continue
                event = json.loads(line[5:])
                if "error" in event:
                    raise _error(400 if "INVALID_ARG" in str(event) else 500, str(event["error"]))
                text = event.get("text_output")
                yield ("".join(text) if isinstance(text, list) else text or ""), _ids(event.get("output_ids"))
    except aiohttp.ClientError as exc:
        raise _error(0, f"cannot reach Triton at {base_url}: {exc}") from None
