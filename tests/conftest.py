"""Every test gets an artifact cache of its own (TRTBUILD_CACHE under its tmp_path), so no test reads or
fills the user's cache or another test's. A test that needs another place sets TRTBUILD_CACHE itself;
module-scoped fixtures run before this one and see the environment pytest was started with."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRTBUILD_CACHE", str(cache))
    return cache
