"""Corpus reading and windowing: determinism, special tokens, and every error path."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ground.errors import CorpusError
from moe import Corpus, MoEModel, load_corpus, make_windows, training_windows


@pytest.fixture(scope="module")
def tokenizer(minilm: MoEModel):  # type: ignore[no-untyped-def]
    return minilm.tokenizer


def test_wiki_is_real_text() -> None:
    corpus = load_corpus("wiki")
    assert len(corpus.documents) > 10_000
    assert sum(len(d) for d in corpus.documents) > 4_000_000  # about 1M tokens of English prose


def test_windows_are_deterministic_and_seeded(tokenizer) -> None:  # type: ignore[no-untyped-def]
    corpus = load_corpus("wiki")
    a = make_windows(corpus, tokenizer, tokens=1000, window=64, seed=3)
    b = make_windows(corpus, tokenizer, tokens=1000, window=64, seed=3)
    c = make_windows(corpus, tokenizer, tokens=1000, window=64, seed=4)
    assert a.shape == (16, 64)  # 1000 tokens round up to whole windows
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert (a[:, 0] == tokenizer.cls_token_id).all() and (a[:, -1] == tokenizer.sep_token_id).all()


def test_fit_split_does_not_overlap_profile_split(tokenizer) -> None:  # type: ignore[no-untyped-def]
    corpus = load_corpus("wiki")
    profile = make_windows(corpus, tokenizer, tokens=4096, window=128, seed=0)
    fit = make_windows(corpus, tokenizer, tokens=4096, window=128, seed=0, split="fit")
    rows = {tuple(r[1:-1]) for r in profile}
    assert not rows & {tuple(r[1:-1]) for r in fit}


def test_text_and_jsonl_files(tmp_path: Path, tokenizer) -> None:  # type: ignore[no-untyped-def]
    text = tmp_path / "docs.txt"
    text.write_text("The first document is here.\n\nThe second one follows it.\n")
    assert load_corpus(str(text)).documents == (
        "The first document is here.",
        "The second one follows it.",
    )
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text(json.dumps({"text": "alpha beta"}) + "\n\n" + json.dumps("gamma") + "\n")
    assert load_corpus(str(jsonl)).documents == ("alpha beta", "gamma")
    windows = make_windows(load_corpus(str(text)), tokenizer, tokens=8, window=8, seed=0)
    assert windows.shape == (1, 8)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.txt", None, "does not exist"),
        ("empty.txt", "  \n\n ", "holds no text"),
        ("bad.jsonl", '{"text": "ok"}\n{not json\n', "bad.jsonl:2 is not valid JSON"),
        ("notext.jsonl", '{"body": "x"}\n', "no 'text' string"),
    ],
)
def test_bad_corpus_files(tmp_path: Path, name: str, content: str | None, message: str) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(CorpusError, match=message):
        load_corpus(str(path))


def test_too_few_tokens(tmp_path: Path, tokenizer) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "short.txt"
    path.write_text("only a few words here")
    with pytest.raises(CorpusError, match="fewer than"):
        make_windows(load_corpus(str(path)), tokenizer, tokens=1000, window=128, seed=0)


class _DocTokenizer:
    """Document i becomes five copies of token i + 10, so every window says which documents
    it read; [CLS]=0 ... [SEP]=1, documents joined by [SEP]."""

    sep_token_id = 1
    eos_token_id = None

    def __call__(self, text, add_special_tokens=True, verbose=False):  # type: ignore[no-untyped-def]
        if isinstance(text, str):
            return {"input_ids": [0, 7, 1] if add_special_tokens else [7]}
        return {"input_ids": [[int(doc[1:]) + 10] * 5 for doc in text]}


def test_training_windows_leave_out_the_held_out_documents() -> None:
    corpus = Corpus("docs", tuple(f"d{i}" for i in range(400)))
    tokenizer = _DocTokenizer()
    train = training_windows(corpus, tokenizer, window=8, seed=2, held_out_tokens=300)
    seen = set(train[:, 1:-1].ravel().tolist()) - {1}
    for tokens in (100, 290):  # held-out windows up to held_out_tokens less one window
        held = make_windows(corpus, tokenizer, tokens=tokens, window=8, seed=2)
        assert not seen & (set(held[:, 1:-1].ravel().tolist()) - {1})
    # Everything else is trained on: the held-out documents are the profile split's first
    # batch of 64 (the reader's unit), and at most the last window's few documents are cut off.
    assert len(seen) >= 400 - 64 - 2
    assert (train[:, 0] == 0).all() and (train[:, -1] == 1).all()
    again = training_windows(corpus, tokenizer, window=8, seed=2, held_out_tokens=300)
    assert np.array_equal(train, again)
    with pytest.raises(CorpusError, match="no text beside"):
        training_windows(corpus, tokenizer, window=8, seed=2, held_out_tokens=10_000)
