"""Text sources: recipe shorthands, .txt / .jsonl parsing, errors, splits, token windows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from trtbuild.core.data import pydoc_corpus
from trtbuild.core.data.sources import (
    TextSource,
    fingerprint,
    joiner,
    load_records,
    load_texts,
    render,
    sequential_windows,
    token_stream,
    token_windows,
)
from trtbuild.core.errors import UserError


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_shorthands() -> None:
    assert TextSource.model_validate("pydoc").kind == "pydoc"
    src = TextSource.model_validate("data/chat.jsonl")
    assert (src.kind, src.path) == ("file", "data/chat.jsonl")
    src = TextSource.model_validate("hf:org/name")
    assert (src.kind, src.hf) == ("hf", "org/name")
    src = TextSource.model_validate({"hf": "org/name", "config": "c", "split": "test"})
    assert (src.kind, src.config, src.split) == ("hf", "c", "test")
    with pytest.raises(ValidationError, match="unsupported file type"):
        TextSource.model_validate("data/notes.csv")
    with pytest.raises(ValidationError):
        TextSource.model_validate({"kind": "pydoc", "colour": "red"})


def test_pydoc_splits_are_the_corpus_splits() -> None:
    train, heldout = pydoc_corpus.split()
    src = TextSource.model_validate("pydoc")
    assert load_texts(src, "train") == list(train)
    assert load_texts(src, "eval") == list(heldout)


def test_txt_paragraphs(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("first paragraph\nstill first\n\n\n  \nsecond\n\nthird\n")
    assert load_texts(TextSource(kind="file", path=str(path)), "train") == [
        "first paragraph\nstill first", "second", "third"]


def test_relative_path_starts_at_base_dir(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("alpha")
    src = TextSource.model_validate("data/a.txt")
    assert load_texts(src, "train", base_dir=tmp_path) == ["alpha"]
    assert fingerprint(src, base_dir=tmp_path)["file_sha256"] != fingerprint(src)["file_sha256"]


def test_jsonl_text_and_custom_field(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": "one"}, {"text": "two", "id": 2}])
    assert load_texts(TextSource.model_validate(str(path)), "train") == ["one", "two"]
    path = write_jsonl(tmp_path / "b.jsonl", [{"body": "x"}, {"body": "y"}])
    src = TextSource(kind="file", path=str(path), field="body", max_records=1)
    assert load_texts(src, "eval") == ["x"]


def test_jsonl_conversations(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", [
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q"}]},
    ])
    records = load_records(TextSource.model_validate(str(path)), "train")
    assert records == [
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q"}],
    ]
    # Without a chat template the transcript keeps every turn's words.
    assert load_texts(TextSource.model_validate(str(path)), "train")[0] == "user: hi\nassistant: hello"


def test_chat_rendered_with_tokenizer_template(tmp_path: Path) -> None:
    from quantize_fixtures import make_tokenizer

    tokenizer = make_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert render(chat, tokenizer) == "<user>hi<assistant>yo"


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found") as err:
        load_texts(TextSource.model_validate(str(tmp_path / "nope.jsonl")), "train")
    assert "nope.jsonl" in err.value.one_line()
    assert "\n" not in err.value.one_line()


def test_bad_field_names_file_line_and_keys(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [{"text": "ok"}, {"prompt": "p", "answer": "a"}])
    with pytest.raises(UserError) as err:
        load_texts(TextSource.model_validate(str(path)), "train")
    line = err.value.one_line()
    assert f"{path}:2" in line and "'text'" in line and "answer, prompt" in line
    path = write_jsonl(tmp_path / "named.jsonl", [{"text": "ok"}])
    with pytest.raises(UserError, match="no field 'body'"):
        load_texts(TextSource(kind="file", path=str(path), field="body"), "train")


def test_bad_json_and_bad_types(tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(UserError, match="invalid JSON") as err:
        load_texts(TextSource.model_validate(str(path)), "train")
    assert err.value.line == 2
    path = write_jsonl(tmp_path / "num.jsonl", [{"text": 5}])
    with pytest.raises(UserError, match="expected a string"):
        load_texts(TextSource.model_validate(str(path)), "train")
    path = write_jsonl(tmp_path / "turn.jsonl", [{"messages": [{"speaker": "x"}]}])
    with pytest.raises(UserError, match="role/content"):
        load_texts(TextSource.model_validate(str(path)), "train")
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(UserError, match="no records"):
        load_texts(TextSource.model_validate(str(path)), "train")


@pytest.fixture(scope="module")
def tokenizer():
    from quantize_fixtures import make_tokenizer

    return make_tokenizer()


def test_token_windows_deterministic(tokenizer) -> None:
    texts = load_texts(TextSource.model_validate("pydoc"), "train")[:200]
    a = token_windows(tokenizer, texts, n=16, seq_len=32, seed=3)
    b = token_windows(tokenizer, texts, n=16, seq_len=32, seed=3)
    c = token_windows(tokenizer, texts, n=16, seq_len=32, seed=4)
    assert a.shape == (16, 32) and a.dtype.is_floating_point is False
    assert (a == b).all()
    assert not (a == c).all()
    # Every window is a contiguous slice of the token stream.
    stream = token_stream(tokenizer, texts)
    joined = ",".join(map(str, stream))
    for row in a.tolist():
        assert ",".join(map(str, row)) in joined


def test_token_windows_independent_of_global_rng(tokenizer) -> None:
    import torch

    texts = ["alpha beta gamma delta " * 20]
    torch.manual_seed(1)
    a = token_windows(tokenizer, texts, n=4, seq_len=8, seed=0)
    torch.manual_seed(2)
    torch.rand(100)
    b = token_windows(tokenizer, texts, n=4, seq_len=8, seed=0)
    assert (a == b).all()


def test_sequential_windows(tokenizer) -> None:
    texts = ["one two three four five six seven eight nine ten"] * 5
    stream = token_stream(tokenizer, texts)
    windows = sequential_windows(tokenizer, texts, seq_len=7)
    assert windows.shape == (len(stream) // 7, 7)
    assert windows.flatten().tolist() == stream[: windows.numel()]
    assert sequential_windows(tokenizer, texts, seq_len=7, n=2).shape == (2, 7)
    with_bos = sequential_windows(tokenizer, texts, seq_len=7, bos=True)
    assert (with_bos[:, 0] == tokenizer.bos_token_id).all()
    assert with_bos[:, 1:].flatten().tolist() == stream[: with_bos.shape[0] * 6]
    sampled = token_windows(tokenizer, texts, n=3, seq_len=7, seed=0, bos=True)
    assert sampled.shape == (3, 7) and (sampled[:, 0] == tokenizer.bos_token_id).all()
    with pytest.raises(UserError, match="fewer than seq_len"):
        sequential_windows(tokenizer, ["hi"], seq_len=1000)
    with pytest.raises(UserError, match="fewer than seq_len"):
        token_windows(tokenizer, ["hi"], n=1, seq_len=1000, seed=0)


def _cache_dataset(cache: Path, name: str, splits: dict[str, list[dict]]) -> None:
    """Fill a `datasets` cache the way a Hub download leaves it: <name>/<config>/<version>/<hash>/."""
    from datasets.packaged_modules.json.json import Json

    files = {split: str(write_jsonl(cache.parent / f"{name}-{split}.jsonl", rows))
             for split, rows in splits.items()}
    Json(cache_dir=str(cache), dataset_name=name, hash="0123abcd", data_files=files).download_and_prepare()
    # A packaged builder names its config dir after its data files; a Hub dataset's is the config name.
    (config_dir,) = (cache / name).iterdir()
    config_dir.rename(cache / name / "default")


def test_hf_dataset_from_local_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    cache = tmp_path / "datasets"
    _cache_dataset(cache, "tinyset", {"train": [{"text": "t1"}, {"text": "t2"}],
                                      "validation": [{"text": "v1"}]})
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    src = TextSource.model_validate("hf:tinyset")
    assert load_texts(src, "train") == ["t1", "t2"]
    assert load_texts(src, "eval") == ["v1"]
    with pytest.raises(UserError, match="has no split nosuch"):
        load_texts(TextSource(kind="hf", hf="tinyset", split="nosuch"), "train")


def test_hf_dataset_missing_is_one_line_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "empty")
    with pytest.raises(UserError) as err:
        load_texts(TextSource.model_validate("hf:nobody/not-cached"), "train")
    line = err.value.one_line()
    assert "'nobody/not-cached'" in line and "not in the local cache" in line and "\n" not in line


def test_joiner_and_text_separator(tokenizer, tmp_path: Path) -> None:
    assert joiner(TextSource.model_validate("pydoc")) == "\n\n"
    assert joiner(TextSource.model_validate("notes.txt")) == "\n\n"
    assert joiner(TextSource.model_validate("rows.jsonl")) is None
    assert joiner(TextSource.model_validate("hf:org/set")) is None
    texts = ["first paragraph", "second one"]
    joined = token_stream(tokenizer, texts, separator="\n\n")
    assert joined == tokenizer("first paragraph\n\nsecond one", add_special_tokens=False)["input_ids"]
    assert tokenizer.eos_token_id not in joined
    assert token_stream(tokenizer, texts).count(tokenizer.eos_token_id) == 2
    windows = sequential_windows(tokenizer, texts, seq_len=3, separator="\n\n")
    assert windows.flatten().tolist() == joined[: windows.numel()]
