"""The built-in text corpus: CPython's `pydoc_data.topics`, split once into train and held-out.

Every stage that needs "the pydoc corpus" reads it from here so the held-out split is the same
for the tiny target's training, calibration, the accuracy gate and draft evaluation.
"""

from __future__ import annotations

import functools
import re

HELDOUT_EVERY = 10  # every 10th paragraph is held out for evaluation


@functools.cache
def paragraphs() -> tuple[str, ...]:
    """All paragraphs of the pydoc topics, in a fixed order (sorted topic names)."""
    from pydoc_data.topics import topics

    result: list[str] = []
    for name in sorted(topics):
        for para in re.split(r"\n\s*\n", topics[name]):
            para = para.strip("\n")
            if para.strip():
                result.append(para)
    return tuple(result)


@functools.cache
def split() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(train, heldout) paragraphs; deterministic, independent of the Python hash seed."""
    paras = paragraphs()
    train = tuple(p for i, p in enumerate(paras) if i % HELDOUT_EVERY != HELDOUT_EVERY - 1)
    heldout = tuple(p for i, p in enumerate(paras) if i % HELDOUT_EVERY == HELDOUT_EVERY - 1)
    return train, heldout


def train_text() -> str:
    return "\n\n".join(split()[0])


def heldout_text() -> str:
    return "\n\n".join(split()[1])
