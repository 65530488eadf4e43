"""The OpenAI request bodies this front accepts, and its error bodies.

Field names, defaults and ranges are OpenAI's (platform.openai.com/docs/api-reference:
completions and chat). Unknown fields are refused, as OpenAI and trtllm-serve do (TensorRT-LLM's
openai_protocol.py forbids extra fields), so a client never believes a parameter took effect
when it did not; parameters OpenAI defines but this deployment cannot honour are refused by name
only when set to something other than their no-op value.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

MAX_STOP = 4  # OpenAI: up to 4 stop sequences
SEED_RANGE = 2**64  # the local model's seed input is UINT64
MAX_TOKENS_FIELD = 2**31 - 1  # the local model's max_tokens input is INT32: bounded here, never wrapped
# JSON integers only: no `true` (lax pydantic reads it as 1), no 5.0, no "5".
Int = Annotated[int, Field(strict=True)]


class OpenAIError(Exception):
    """Answered as {"error": {"message", "type", "param", "code"}} with this HTTP status."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _Sampling(BaseModel):
    """What completions and chat share."""

    model_config = ConfigDict(extra="forbid")

    model: str
    max_tokens: Int | None = Field(default=None, ge=1, le=MAX_TOKENS_FIELD)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = Field(default=None, validate_default=True)
    seed: Int | None = Field(default=None, ge=0, lt=SEED_RANGE)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    @field_validator("temperature", "top_p", "presence_penalty", "frequency_penalty", mode="before")
    @classmethod
    def _not_a_boolean(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("must be a number, not true/false")
        return value

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences")
        if any(not s for s in stops):
            raise ValueError("stop sequences must not be empty")
        return stops

    @field_validator("presence_penalty", "frequency_penalty", "logit_bias")
    @classmethod
    def _unsupported(cls, value: Any) -> Any:
        if value:
            raise ValueError("not supported by this deployment (only its no-op value)")
        return value

    @property
    def stops(self) -> list[str]:
        return self.stop  # type: ignore[return-value]  (normalized by the validator)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    echo: Literal[False] = False
    logprobs: None = None
    best_of: Literal[1] | None = None
    suffix: None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: str | list[str]) -> str:
        if isinstance(value, list):
            if len(value) != 1:
                raise ValueError(f"send one prompt per request (got {len(value)})")
            value = value[0]
        if not value:
            raise ValueError("prompt is empty")
        return value


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")  # name, tool_call_id ...: not used by a chat template here
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: Int | None = Field(default=None, ge=1, le=MAX_TOKENS_FIELD)
    logprobs: Literal[False] | None = None

    @property
    def token_budget(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def parse(model: type[BaseModel], body: Any) -> Any:
    """Validates a JSON body; the first problem becomes an OpenAI 400 naming the parameter."""
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(part) for part in first["loc"] if not str(part).startswith(("function-", "literal"))]
        param = ".".join(loc) or None
        if first["type"] == "extra_forbidden":
            message = f"unrecognized request argument supplied: {param}"
        elif first["type"] == "missing":
            message = f"missing required parameter: {param}"
        else:
            message = f"{param}: {first['msg']}" if param else first["msg"]
            if first["type"] == "literal_error":
                message += f" (got {first.get('input')!r})"
        raise OpenAIError(400, message, param=param,
                          code="unsupported_parameter" if first["type"] == "literal_error" else None) from None
