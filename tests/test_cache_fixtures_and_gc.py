"""Issue 38 finding 7: the tests' real-checkpoint fixture lives outside the user's artifact cache (so
`cache gc` / `clean --cache` still act there after `make test`), and `cache gc` on a cache it cannot
write says what it could not remove: never "removed" for what is still there, never "a running server
uses it" when no server runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from real_checkpoint import fixture_root

from trtbuild.core.cache import LAST_USED, RESUME, ArtifactCache


def test_fixture_root_is_a_temporary_directory_never_the_users_cache(tmp_path, monkeypatch):
    """Without TRTBUILD_TEST_FIXTURES the fixture is made in a temporary directory of the test process;
    nothing lands in the artifact cache or anywhere under the user's home, so gc and clean --cache still
    act on a cache that holds only what trtbuild wrote."""
    monkeypatch.delenv("TRTBUILD_TEST_FIXTURES", raising=False)
    monkeypatch.setenv("TRTBUILD_CACHE", str(tmp_path / "cache"))
    store = ArtifactCache()
    fixtures = fixture_root().resolve()
    assert fixtures.is_relative_to(Path(tempfile.gettempdir()).resolve()), fixtures
    assert not fixtures.is_relative_to(store.root.resolve())
    assert not fixtures.is_relative_to((Path.home() / ".cache").resolve())
    (fixtures / "smollm2-x").mkdir(parents=True, exist_ok=True)
    store.root.mkdir(parents=True, exist_ok=True)
    assert store.unmarked_reason() is None, store.unmarked_reason()
    monkeypatch.setenv("TRTBUILD_TEST_FIXTURES", str(tmp_path / "kept"))
    assert fixture_root() == tmp_path / "kept"  # a developer's opt-in to keep it across runs


def _read_only(root: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run `trtbuild argv` with `root` read-only: a read-only bind mount as root (chmod does not stop
    root), permissions otherwise."""
    env = {**os.environ, "TRTBUILD_CACHE": str(root),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    code = f"import sys; from trtbuild.cli import main; sys.argv = ['trtbuild', *{argv!r}]; main({argv!r})"
    if os.geteuid() == 0:
        if shutil.which("unshare") is None:
            pytest.skip("needs unshare to make a read-only cache as root")
        probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
        if probe.returncode != 0:
            pytest.skip("cannot make a mount namespace here for a read-only cache")
        script = (f'mount --bind "{root}" "{root}" && mount -o remount,bind,ro "{root}" && '
                  f'exec "{sys.executable}" -c "$0"')
        return subprocess.run(["unshare", "-m", "sh", "-c", script, code], env=env, capture_output=True, text=True)
    subprocess.run(["chmod", "-R", "a-w", str(root)], check=True)
    try:
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(root)], check=True)


def test_gc_on_a_read_only_cache_claims_nothing_it_did_not_do(isolated_cache):
    store = ArtifactCache(isolated_cache)
    work = store.new_workdir("model", "k1")
    (work / "w.bin").write_bytes(b"x" * 64)
    entry = store.commit(work, "model", "k1", {"recipe": {"name": "r", "file": ""}, "created": "now"})
    old = time.time() - 90 * 86400
    (entry.path / LAST_USED).write_text(str(old))
    resume = store.root / RESUME / "r-draft"
    resume.mkdir(parents=True)
    (resume / "step.pt").write_bytes(b"y")
    os.utime(resume / "step.pt", (old, old))
    os.utime(resume, (old, old))
    leftover = store.root / "model" / ".tmp-k2-999999999-abcd"  # no such pid: a killed build's
    leftover.mkdir()
    before = sorted(str(p.relative_to(store.root)) for p in store.root.rglob("*"))

    result = _read_only(store.root, ["cache", "gc", "--older-than", "1"])

    out = result.stdout + result.stderr
    assert sorted(str(p.relative_to(store.root)) for p in store.root.rglob("*")) == before
    assert result.returncode != 0, out
    assert "running server" not in out, out
    assert not [line for line in out.splitlines() if line.startswith("removed")], out
    assert "could not remove model/k1" in out and "could not remove resume/r-draft" in out, out
    assert "could not remove incomplete model/.tmp-k2-999999999-abcd" in out, out
    assert "Traceback" not in out, out
    # Writable again: the same gc removes all three and says so.
    result = subprocess.run([sys.executable, "-c", "from trtbuild.cli import main; main(['cache', 'gc', "
                             "'--older-than', '1'])"], capture_output=True, text=True,
                            env={**os.environ, "TRTBUILD_CACHE": str(store.root)})
    assert result.returncode == 0, result.stderr
    assert "removed model/k1" in result.stdout and "removed resume/r-draft" in result.stdout, result.stdout
    assert not entry.path.exists() and not resume.exists() and not leftover.exists()
