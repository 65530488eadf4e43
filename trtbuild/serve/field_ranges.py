"""What a JSON value must be to become a Triton input of a given datatype without changing.

tritonserver's /generate converts JSON numbers into the input's datatype by a C cast: 2^32 + 8
becomes 8 in an INT32 input, 2^31 becomes -2^31, a float 1e300 becomes inf in FP32 (issue 24
finding 9). A front checks each field with `field_problem` before forwarding, so such a request is
a 400 naming the field instead of a different request.
"""

from __future__ import annotations

import math
from typing import Any

INT_RANGES: dict[str, tuple[int, int]] = {
    **{f"TYPE_INT{bits}": (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) for bits in (8, 16, 32, 64)},
    **{f"TYPE_UINT{bits}": (0, 2**bits - 1) for bits in (8, 16, 32, 64)},
}
FLOAT_MAX = {"TYPE_FP16": 65504.0, "TYPE_BF16": 3.3895313892515355e38, "TYPE_FP32": 3.4028234663852886e38,
             "TYPE_FP64": 1.7976931348623157e308}


def field_problem(name: str, value: Any, datatype: str) -> str | None:
    """Why `value` (a scalar or a list of them) cannot be the input `name` of `datatype` exactly,
    or None when it can. Booleans are not numbers here (JSON `true` is not 1)."""
    for item in value if isinstance(value, list) else [value]:
        problem = _item_problem(item, datatype)
        if problem is not None:
            return f"{name} {problem}, got {_shown(item)}"
    return None


def _shown(item: Any) -> str:
    """A short repr; an integer over Python's 4300-digit str() limit is described, not printed."""
    if isinstance(item, int) and not isinstance(item, bool) and abs(item) >= 10**40:
        return f"an integer of {item.bit_length()} bits"
    text = repr(item)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


def _item_problem(item: Any, datatype: str) -> str | None:
    if datatype in INT_RANGES:
        low, high = INT_RANGES[datatype]
        if isinstance(item, bool) or not isinstance(item, int):
            return "must be a whole number"
        if not low <= item <= high:
            return f"must be a whole number in [{low}, {high}] (a {datatype.removeprefix('TYPE_')} input)"
        return None
    if datatype in FLOAT_MAX:
        if isinstance(item, bool) or not isinstance(item, int | float):
            return "must be a number"
        if isinstance(item, float) and not math.isfinite(item) or abs(item) > FLOAT_MAX[datatype]:
            return f"must be a finite number within the range of {datatype.removeprefix('TYPE_')}"
        return None
    if datatype == "TYPE_BOOL" and not isinstance(item, bool):
        return "must be true or false"
    if datatype == "TYPE_STRING" and not isinstance(item, str):
        return "must be a string"
    return None
