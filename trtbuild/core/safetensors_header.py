"""Read safetensors headers (shapes, dtypes) without loading tensors or importing torch."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any


def read_header(file: Path) -> dict[str, Any]:
    with file.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    return header


def count_parameters(directory: Path) -> int:
    total = 0
    for file in sorted(directory.glob("*.safetensors")):
        for info in read_header(file).values():
            total += math.prod(info["shape"])
    return total
