"""A model fitted on the user's text: what it learns from, what it is judged on, what the cache
and the manifest say about it (real conversions of a tiny Llama on real text)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ground.errors import CorpusError
from moe import _model, load_corpus, load_model, moefy_options
from moe._export import export_model
from moe._stages import StageLoader

# Whole documents of the embedded text, enough for both held-out parts (32,768 tokens each) and
# a small fit part; two disjoint sets of them are two users' texts.
DOCUMENTS = 900


def _text(path: Path, start: int) -> str:
    docs = load_corpus("wiki").documents[start : start + DOCUMENTS]
    path.write_text("\n\n".join(docs) + "\n")
    return str(path)


def _loaded(messages: list[str]) -> bool:
    return any("from the cache" in m for m in messages)


def test_a_model_fitted_on_one_text_is_never_the_cached_model_of_another(
    tiny_dirs: dict[str, Path], tmp_path: Path
) -> None:
    mine, theirs = _text(tmp_path / "mine.txt", 0), _text(tmp_path / "theirs.txt", DOCUMENTS)
    model = str(tiny_dirs["llama"])

    def load(text: str, messages: list[str]) -> object:
        options = moefy_options(4, 2, fit_tokens=256, fit_corpus=text)
        return load_model(model, options=options, quality_tokens=1024, progress=messages.append)

    first: list[str] = []
    fitted = load(mine, first)
    assert not _loaded(first)
    quality = fitted.quality  # type: ignore[attr-defined]
    sha = load_corpus(mine).sha256
    assert (quality["fit_corpus"], quality["fit_corpus_sha256"]) == (mine, sha)
    assert quality["corpus_sha256"] == sha and quality["split"] == "test"
    assert set(quality["fit_parts"]) == {"fit", "validation", "test"}
    assert quality["fit_parts"]["test"]["tokens"] >= 32768
    again: list[str] = []
    assert load(mine, again).options == fitted.options  # type: ignore[attr-defined]
    assert _loaded(again)
    other: list[str] = []
    load(theirs, other)
    assert not _loaded(other)  # converted afresh on the other text
    # The manifest pins the text; once the file changes the model is not served as fitted on it.
    manifest = export_model(fitted, tmp_path / "export").moefy  # type: ignore[arg-type]
    assert manifest is not None and manifest["fit_corpus_sha256"] == sha
    assert StageLoader(tmp_path / "export").manifest.quality["fit_corpus"] == mine
    Path(mine).write_text(Path(theirs).read_text())
    with pytest.raises(CorpusError, match="not the text the model was fitted on"):
        load_model(model, options=fitted.options)  # type: ignore[attr-defined]


def test_too_little_text_is_refused_before_the_weights_load(
    tiny_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = tmp_path / "small.txt"
    small.write_text("\n\n".join(load_corpus("wiki").documents[:300]) + "\n")

    def no_weights(*_args: object) -> None:
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(_model, "load_hf", no_weights)
    options = moefy_options(4, 2, fit_tokens=8192, fit_corpus=str(small))
    with pytest.raises(CorpusError) as refused:
        load_model(str(tiny_dirs["llama"]), options=options, cache=False)
    assert "a model fitted on it needs 32,768 of validation text" in refused.value.problem
    assert "--fit-corpus wiki" in refused.value.fix


@pytest.mark.parametrize(
    ("fit_sha", "said"),
    [
        ("aaa", "Fitted on the fit part of 'mine.txt', judged on its test part"),
        ("bbb", "Fitted on 'wiki', judged on the test part of 'mine.txt': not the text"),
    ],
)
def test_quality_says_where_the_model_was_fitted(
    fit_sha: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from moelambda.cli.quality import _print

    block = {
        "kind": "encoder",
        "corpus": "mine.txt",
        "corpus_sha256": "aaa",
        "fit_corpus": "mine.txt" if fit_sha == "aaa" else "wiki",
        "fit_corpus_sha256": fit_sha,
        "split": "test",
        "tokens": 1024,
        "windows": 16,
        "window": 64,
        "seed": 0,
        "expert_flops_share": 0.5,
        "flops_share_per_layer": [0.5],
        "cosine_mean": 0.9,
        "cosine_p05": 0.8,
        "cosine_min": 0.7,
        "neighbour_overlap_10": 0.6,
        "wall_s": 1.0,
    }
    _print({"model": "minilm", "quality": block, "measured_now": True}, "E8 k4")
    assert said in " ".join(capsys.readouterr().out.split())
