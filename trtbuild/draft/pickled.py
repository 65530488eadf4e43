"""Drafts published as a pickle (`pytorch_model.bin`), read with torch's weights-only unpickler.

The EAGLE authors publish their drafts (e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B) as config.json plus
one `pytorch_model.bin`: a flat state dict of 15 tensors (fc, midlayer.*, norm, lm_head, d2t, t2d). That
file is read here and nowhere else, with torch.load and weights_only=True: the restricted unpickler that
builds tensors and plain containers and refuses any other global (no code runs). Anything that needs
more than a flat name -> tensor mapping is refused; what loads is written as `model.safetensors` into
the draft stage's artifact (in the cache), and only that copy is read afterwards.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from trtbuild.core.cache import sha256_file
from trtbuild.core.errors import UserError

PUBLISHED = "pytorch_model.bin"  # the one pickle name a published draft may carry


def is_published_pickle_draft(directory: Path, pickles: list[Path]) -> bool:
    """The draft's only weights are one top-level pytorch_model.bin (no safetensors to prefer)."""
    return ([p.relative_to(directory) for p in pickles] == [Path(PUBLISHED)]
            and not any(directory.glob("*.safetensors")))


def check_archive(path: Path, where: str) -> None:
    """Cheap, before any work (validate / plan): the file is a torch.save zip archive with one data.pkl.
    Its contents are judged by the weights-only loader when the draft stage runs."""
    import zipfile

    ok = zipfile.is_zipfile(path)
    if ok:
        with zipfile.ZipFile(path) as archive:
            ok = sum(name.endswith("/data.pkl") or name == "data.pkl" for name in archive.namelist()) == 1
    if not ok:
        raise UserError(f"{path} is not a torch.save archive (a zip holding one data.pkl), so it is not read",
                        field=where, fix="use a draft whose weights are safetensors, or re-save the state dict "
                        "with a current torch.save")


def _load_tensors(path: Path, where: str) -> dict[str, Any]:
    import pickle

    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=False)
    except (pickle.UnpicklingError, RuntimeError, AttributeError, TypeError, ValueError, EOFError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise UserError(f"{path} needs more than tensors to unpickle and is refused ({first})", field=where,
                        fix="use a draft whose weights are safetensors or a plain tensor state dict") from None
    if not isinstance(state, dict) or not state or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise UserError(f"{path} is not a flat mapping of tensor names to tensors", field=where,
                        fix="use a draft whose weights are safetensors or a plain tensor state dict")
    return state


def convert_into(source: Path, out: Path, where: str, log: Any = None) -> dict[str, Any]:
    """Copy the draft in `source` into `out` with its pytorch_model.bin as model.safetensors; returns what
    was converted (file, sha256, tensors) for the manifest."""
    from safetensors.torch import save_file

    pickled = source / PUBLISHED
    state = _load_tensors(pickled, where)
    out.mkdir(parents=True)
    for file in sorted(source.iterdir()):
        if file.is_file() and not file.name.startswith(".") and file.name != PUBLISHED:
            shutil.copyfile(file.resolve(), out / file.name)
    digest = sha256_file(pickled)
    save_file({k: v.detach().contiguous() for k, v in state.items()}, str(out / "model.safetensors"),
              metadata={"converted_from": PUBLISHED, "sha256": digest})
    if log is not None:
        log(f"draft: {pickled} is a pickle; read with torch's weights-only loader ({len(state)} tensors) "
            "and written as model.safetensors in the cache")
    return {"file": PUBLISHED, "sha256": digest, "tensors": len(state)}
