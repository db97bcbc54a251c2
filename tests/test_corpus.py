"""Corpus reading and windowing: determinism, special tokens, and every error path."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ground.errors import CorpusError
from moe import Corpus, MoEModel, load_corpus, make_windows, partition, training_windows


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


def test_the_profile_reads_no_held_out_document(tokenizer) -> None:  # type: ignore[no-untyped-def]
    """Issue 52: `choose`'s default 40,960-token profile of the embedded text read 448 whole
    documents, 331 of them validation and 117 test, so each option's bill depended on test text.
    Now every document it reads is in the fit part, and the fit split (read from the far end)
    reads others for the same seed."""
    from moe._corpus import _content, _order, _stream

    corpus = load_corpus("wiki")
    parts = partition(corpus, tokenizer)
    held = set(parts.validation.tolist()) | set(parts.test.tolist())
    _, _, content = _content(tokenizer, 128)
    for seed in (0, 1):
        order = _order(corpus, tokenizer, np.random.default_rng(seed), "profile")
        _, read = _stream(corpus, tokenizer, order, 320 * content)  # 40,960 tokens
        profiled = set(order[:read].tolist())
        assert read > 400 and not profiled & held and profiled <= set(parts.fit.tolist())
        fit = _order(corpus, tokenizer, np.random.default_rng(seed), "fit")
        _, fitted = _stream(corpus, tokenizer, fit, 64 * content)  # 8,192 fit tokens
        assert not profiled & set(fit[:fitted].tolist())


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


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Held-out parts of 300 tokens, so that 400 six-token documents have all three parts."""
    from moe import _corpus

    monkeypatch.setattr(_corpus, "VALIDATION_TOKENS", 300)
    monkeypatch.setattr(_corpus, "TEST_TOKENS", 300)


def _docs_of(windows: np.ndarray) -> set[int]:
    """The documents (_DocTokenizer's token value less 10) a window array holds."""
    return {t - 10 for t in windows[:, 1:-1].ravel().tolist() if t >= 10}


def test_the_parts_are_documents_and_the_same_for_every_seed(small_parts: None) -> None:
    corpus = Corpus("docs", tuple(f"d{i}" for i in range(400)))
    tokenizer = _DocTokenizer()
    parts = partition(corpus, tokenizer)
    validation, test, fit = (set(p.tolist()) for p in (parts.validation, parts.test, parts.fit))
    assert len(validation) == 50 and len(test) == 50  # 6 tokens each (5 + the joiner)
    assert validation | test | fit == set(range(400)) and not validation & test
    assert not (validation | test) & fit
    for seed in (0, 1, 2):
        train = _docs_of(training_windows(corpus, tokenizer, window=8, seed=seed))
        assert train <= fit and len(train) >= len(fit) - 2  # all but the last window's cut
        judged = make_windows(corpus, tokenizer, tokens=240, window=8, seed=seed, split="test")
        assert _docs_of(judged) <= test
        chosen = make_windows(
            corpus, tokenizer, tokens=240, window=8, seed=seed, split="validation"
        )
        assert _docs_of(chosen) <= validation
    a = training_windows(corpus, tokenizer, window=8, seed=2)
    assert np.array_equal(a, training_windows(corpus, tokenizer, window=8, seed=2))
    assert (a[:, 0] == 0).all() and (a[:, -1] == 1).all()


def test_a_small_corpus_is_halved_and_has_nothing_to_fit_on() -> None:
    corpus = Corpus("docs", tuple(f"d{i}" for i in range(10)))
    tokenizer = _DocTokenizer()
    parts = partition(corpus, tokenizer)
    assert (len(parts.validation), len(parts.test), len(parts.fit)) == (5, 5, 0)
    with pytest.raises(CorpusError, match="no text beside its validation and test"):
        training_windows(corpus, tokenizer, window=8, seed=0)
    with pytest.raises(CorpusError, match="the fit part") as refused:
        make_windows(
            corpus, tokenizer, tokens=64, window=8, seed=0, split="fit", option="--fit-tokens"
        )
    assert refused.value.fix == "use more text: one window of 8 holds 6 tokens of text."
    with pytest.raises(CorpusError, match="the test part") as refused:
        make_windows(corpus, tokenizer, tokens=64, window=8, seed=0, split="test")
    assert refused.value.fix == "pass --tokens 40 or fewer, or use more text."
    # Nothing to fit on: the profile reads the validation part, never the test part.
    profiled = make_windows(corpus, tokenizer, tokens=40, window=8, seed=0)
    assert _docs_of(profiled) <= set(parts.validation.tolist())
    with pytest.raises(CorpusError, match="outside its test part") as refused:
        make_windows(corpus, tokenizer, tokens=64, window=8, seed=0)
    assert "in 5 of its 10 documents" in refused.value.problem
    assert refused.value.fix == "pass --tokens 40 or fewer, or use more text."


def test_no_seed_judges_on_text_any_seed_fitted_on(tokenizer) -> None:  # type: ignore[no-untyped-def]
    """The audit's finding: seed-1 quality windows shared about 11 % of their 12-grams with the
    seed-0 fit text. Now the test part is the same documents whatever the seed."""
    corpus = load_corpus("wiki")

    def grams(windows: np.ndarray) -> set[tuple[int, ...]]:
        return {
            tuple(row[i : i + 12]) for row in windows[:, 1:-1].tolist() for i in range(0, 50, 7)
        }

    judged = set().union(
        *(
            grams(make_windows(corpus, tokenizer, tokens=16384, window=64, seed=s, split="test"))
            for s in (0, 1)
        )
    )
    for seed in (0, 1):
        fit = make_windows(corpus, tokenizer, tokens=32768, window=128, seed=seed, split="fit")
        assert not judged & {
            tuple(row[i : i + 12]) for row in fit[:, 1:-1].tolist() for i in range(len(row) - 11)
        }


def test_three_readings_and_a_hash_of_the_documents(tmp_path: Path) -> None:
    """Blank lines separate documents; a file without one has a document per line; JSONL has one
    per line. The hash is of the documents: the same text in another file or format is the same
    corpus, one changed word is another."""
    paragraphs = tmp_path / "a.txt"
    paragraphs.write_text("First document,\nstill the first.\n \nThe second.\n")
    lines = tmp_path / "b.txt"
    lines.write_text("First document,\nstill the first.\nThe second.\n")
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text(json.dumps("First document,\nstill the first.") + "\n" + '"The second."\n')
    a, b, c = (load_corpus(str(p)) for p in (paragraphs, lines, jsonl))
    assert (a.reading, b.reading, c.reading) == ("paragraphs", "lines", "jsonl")
    assert a.documents == c.documents == ("First document,\nstill the first.", "The second.")
    assert len(b.documents) == 3
    assert a.sha256 == c.sha256 != b.sha256
    assert load_corpus("wiki").reading == "embedded"
    paragraphs.write_text("First document,\nstill the first.\n\nThe second!\n")
    assert load_corpus(str(paragraphs)).sha256 != a.sha256  # a changed file is read again


def test_too_little_text_to_fit_on_names_what_a_model_needs(small_parts: None) -> None:
    from moe._corpus import check_fit_text, part_sizes

    corpus = Corpus("docs", tuple(f"d{i}" for i in range(150)))
    tokenizer = _DocTokenizer()
    sizes = part_sizes(corpus, tokenizer)
    assert sizes == {
        "fit": {"documents": 50, "tokens": 300},
        "validation": {"documents": 50, "tokens": 300},
        "test": {"documents": 50, "tokens": 300},
    }
    assert check_fit_text(corpus, tokenizer, fit_tokens=128, window=8)["fit"]["tokens"] == 300
    with pytest.raises(CorpusError) as refused:
        check_fit_text(corpus, tokenizer, fit_tokens=1024, window=8)
    problem, fix = refused.value.problem, refused.value.fix
    assert "holds 900 tokens in 150 documents" in problem
    assert "300 of validation text, 300 of test text" in problem and "768 to fit on" in problem
    assert fix.startswith("pass --fit-tokens 400 or fewer, bring about 1,368 tokens")
    assert "--fit-corpus wiki" in fix


def test_the_profile_reads_the_fit_part_then_validation_never_test(small_parts: None) -> None:
    corpus = Corpus("docs", tuple(f"d{i}" for i in range(400)))
    tokenizer = _DocTokenizer()
    parts = partition(corpus, tokenizer)
    fit, validation = set(parts.fit.tolist()), set(parts.validation.tolist())
    for seed in (0, 1, 2):
        assert _docs_of(make_windows(corpus, tokenizer, tokens=240, window=8, seed=seed)) <= fit
    # More than the fit part (300 fit documents, 6 tokens each): validation follows, not test.
    everything = make_windows(corpus, tokenizer, tokens=2800, window=8, seed=0)
    assert _docs_of(everything) <= fit | validation and len(_docs_of(everything)) > 300
    with pytest.raises(CorpusError, match="outside its test part"):
        make_windows(corpus, tokenizer, tokens=3200, window=8, seed=0)


def test_a_repeated_paragraph_is_one_document(tmp_path: Path, small_parts: None) -> None:
    """Issue 52: a repeated paragraph of a user's file could land in the fit part and in the
    test part. Repeats (equal after stripping) are dropped before partitioning, the first kept."""
    text = tmp_path / "docs.txt"
    text.write_text("One.\n\nTwo.\n\n  One.\n\nThree.\n\nTwo.\n")
    corpus = load_corpus(str(text))
    assert corpus.documents == ("One.", "Two.", "Three.") and corpus.duplicates_dropped == 2
    assert load_corpus("wiki").duplicates_dropped == 0  # its SHA-256, so the cache, unchanged
    # 100 copies of each of 8 documents among 400 others: every copy but the first is dropped,
    # so no text is in two parts.
    docs = tuple(f"d{i}" for i in range(400)) + tuple(f"d{i % 8}" for i in range(800))
    repeated = Corpus("docs", docs)
    assert len(repeated.documents) == 400 and repeated.duplicates_dropped == 800
    parts = partition(repeated, _DocTokenizer())
    texts = [{repeated.documents[i] for i in p.tolist()} for p in (parts.fit, parts.test)]
    assert not texts[0] & texts[1]
    assert not set(parts.validation.tolist()) & set(parts.test.tolist())


def test_fit_and_judged_texts_sharing_documents_are_refused(small_parts: None) -> None:
    from moe._corpus import check_disjoint

    tokenizer = _DocTokenizer()
    judged = Corpus("judged", tuple(f"d{i}" for i in range(400)))
    check_disjoint(judged, judged, tokenizer)  # one text: its parts never share a document
    check_disjoint(Corpus("other", tuple(f"d{i}" for i in range(400, 800))), judged, tokenizer)
    held = partition(judged, tokenizer)
    # Another file holding three of the judged text's test documents among its own.
    shared = [f"d{i}" for i in held.test[:3].tolist()]
    fit = Corpus("fit", tuple(shared) + tuple(f"d{i}" for i in range(400, 800)))
    learnt = {fit.documents[i] for i in partition(fit, tokenizer).fit.tolist()}
    inside = [doc for doc in shared if doc in learnt]
    assert inside  # the seed puts some of them in its fit part
    with pytest.raises(CorpusError) as refused:
        check_disjoint(fit, judged, tokenizer)
    problem = refused.value.problem
    assert f"{len(inside)} of its 50 test documents are in the fit part" in problem
    assert "of 'fit', the text the model is fitted on" in problem
    assert "remove the shared documents" in refused.value.fix
    # A test document in the fit text's validation part (where distillation keeps its step) is
    # refused too; a validation document there is not (both parts are for choices).
    chosen = [f"d{i}" for i in range(800, 1200)]
    other = Corpus("other fit", tuple(chosen) + tuple(f"d{i}" for i in range(400, 800)))
    chosen_on = {other.documents[i] for i in partition(other, tokenizer).validation.tolist()}
    assert len(chosen_on) >= 2
    test_doc = held.test[0].item()
    valid_doc = held.validation[0].item()
    swapped = {doc: f"d{test_doc}" for doc in list(chosen_on)[:1]}
    swapped |= {doc: f"d{valid_doc}" for doc in list(chosen_on)[1:2]}
    leaky = Corpus("leaky", tuple(swapped.get(doc, doc) for doc in other.documents))
    assert partition(leaky, tokenizer).validation.tolist() == (
        partition(other, tokenizer).validation.tolist()
    )
    with pytest.raises(CorpusError) as refused:
        check_disjoint(leaky, judged, tokenizer)
    problem = refused.value.problem
    assert "1 of its 50 test documents are in the validation part of 'leaky'" in problem
    assert "validation documents" not in problem


def test_quality_on_a_shuffled_copy_of_its_fit_text_is_refused_before_the_weights_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 52: `--corpus docs.txt --fit-corpus` a line-shuffled copy of it judged on test
    documents the model was fitted on, as if they were held out."""
    from typer.testing import CliRunner

    from moe import _model
    from moelambda.cli import app

    docs = [" ".join(d.split()) for d in load_corpus("wiki").documents[:900]]
    judged, fit = tmp_path / "docs.txt", tmp_path / "shuffled.txt"
    judged.write_text("\n".join(docs) + "\n")
    fit.write_text("\n".join(np.random.default_rng(0).permutation(docs).tolist()) + "\n")

    def no_weights(*_args: object) -> None:
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(_model, "load_hf", no_weights)
    args = ["quality", "--experts", "8", "--top-k", "4", "--corpus", str(judged)]
    result = CliRunner().invoke(app, [*args, "--fit-corpus", str(fit), "--no-cache"])
    assert result.exit_code == 2, result.output
    problem = " ".join(result.stderr.split())
    assert "of its 311 test documents are in the fit part" in problem and "To fix:" in problem
    assert "validation documents are in the fit part of" in problem
    assert sorted(tmp_path.iterdir()) == [judged, fit]
