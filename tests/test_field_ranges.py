"""Issue 24 finding 9: integers that a C cast would wrap are refused with the field, at every parse."""

from __future__ import annotations

import numpy as np
import pytest

from trtbuild.serve.field_ranges import INT_RANGES, field_problem
from trtbuild.serve.openai_api.protocol import ChatCompletionRequest, CompletionRequest, OpenAIError, parse


def _id(value) -> str:
    """A test id; Python's str() refuses integers over 4300 digits."""
    if isinstance(value, dict):
        return ",".join(f"{k}={_id(v)}" for k, v in value.items())
    if isinstance(value, int) and abs(value) >= 10**40:
        return "huge"
    return str(value)[:30]


@pytest.mark.parametrize("datatype", sorted(INT_RANGES))
def test_every_integer_that_fits_is_taken_and_every_one_that_would_wrap_is_not(datatype):
    low, high = INT_RANGES[datatype]
    dtype = np.dtype(datatype.removeprefix("TYPE_").lower())
    assert (np.iinfo(dtype).min, np.iinfo(dtype).max) == (low, high)  # the reference: numpy's own limits
    for value in (low, high, 0 if low == 0 else -1, 1):
        assert field_problem("x", value, datatype) is None
        assert int(np.array(value).astype(dtype)) == value  # kept exactly by the cast
    for value in (low - 1, high + 1, high + 2**32 + 8, 10**5000):
        assert "x must be a whole number in" in field_problem("x", value, datatype)


@pytest.mark.parametrize("value,datatype,fragment", [
    (2**32 + 8, "TYPE_INT32", "max_tokens must be a whole number in [-2147483648, 2147483647]"),
    (2**31, "TYPE_INT32", "in [-2147483648, 2147483647]"),
    (True, "TYPE_INT32", "max_tokens must be a whole number, got True"),
    (5.0, "TYPE_INT32", "must be a whole number"),
    (2**64, "TYPE_UINT64", "in [0, 18446744073709551615]"),
    (-1, "TYPE_UINT64", "in [0, "),
    (1e300, "TYPE_FP32", "finite number within the range of FP32"),
    (True, "TYPE_FP32", "must be a number"),
    ([1, 2**40], "TYPE_INT32", "got 1099511627776"),
    (10**5000, "TYPE_INT32", "got an integer of 16610 bits"),
], ids=lambda v: _id(v))
def test_field_problems_name_the_field(value, datatype, fragment):
    assert fragment in field_problem("max_tokens", value, datatype)


def _openai(body):
    try:
        parse(CompletionRequest, {"model": "m", "prompt": "p", **body})
    except OpenAIError as exc:
        return exc.status, exc.message
    return 200, ""


@pytest.mark.parametrize("body,fragment", [
    ({"max_tokens": 2**32 + 8}, "max_tokens: Input should be less than or equal to 2147483647"),
    ({"max_tokens": 2**31}, "less than or equal to 2147483647"),
    ({"max_tokens": True}, "max_tokens: Input should be a valid integer"),
    ({"max_tokens": 8.0}, "max_tokens: Input should be a valid integer"),
    ({"max_tokens": "8"}, "max_tokens: Input should be a valid integer"),
    ({"max_tokens": 10**5000}, "max_tokens"),
    ({"seed": 10**5000}, "seed"),
    ({"seed": 2**64}, "seed: Input should be less than 18446744073709551616"),
    ({"seed": True}, "seed: Input should be a valid integer"),
    ({"temperature": True}, "temperature"),
], ids=lambda v: _id(v))
def test_openai_integers_are_bounded_and_typed(body, fragment):
    status, message = _openai(body)
    assert status == 400 and fragment in message, message


def test_openai_chat_budget_is_bounded():
    with pytest.raises(OpenAIError) as info:
        parse(ChatCompletionRequest, {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                      "max_completion_tokens": 2**32 + 8})
    assert info.value.status == 400 and "max_completion_tokens" in info.value.message
    assert _openai({"max_tokens": 2**31 - 1, "seed": 2**64 - 1}) == (200, "")


def test_a_5000_digit_json_integer_is_a_400_from_the_openai_front():
    """Python's json refuses integers over 4300 digits with a ValueError; the front answers 400."""
    import asyncio

    from aiohttp.test_utils import make_mocked_request

    from trtbuild.serve.openai_api.app import _body

    body = b'{"model": "m", "prompt": "p", "max_tokens": ' + b"9" * 5000 + b"}"

    async def read():
        request = make_mocked_request("POST", "/v1/completions", headers={"Content-Type": "application/json"})
        request._read_bytes = body  # the body aiohttp has read from the socket
        return await _body(request)

    with pytest.raises(OpenAIError) as info:
        asyncio.run(read())
    assert info.value.status == 400 and "not valid JSON" in info.value.message and "4300 digits" in info.value.message
