"""The model cache's key changes whenever the model it names would: options, the text it is
fitted on, conversion code, the constants that cut its text, the corpus package and the
distillation recipe."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import pytest

from ground.errors import CorpusError
from moe import _cache, _corpus, _distil, _model, _quality, moefy_options, resolve_model


@pytest.fixture
def key(tiny_dirs: dict[str, Path]):  # type: ignore[no-untyped-def]
    source = resolve_model(str(tiny_dirs["llama"]))
    return lambda options=None: _cache._key(source, options or moefy_options(4, 1))


def test_options_and_the_recipe_are_in_the_key(key) -> None:  # type: ignore[no-untyped-def]
    assert key() == key()
    assert key(moefy_options(4, 2)) != key()
    assert key(moefy_options(4, 1, seed=1)) != key()
    distilled = moefy_options(4, 1, distil_steps=10)
    before = key(distilled)
    recipe = dict(_distil.RECIPE)
    try:
        _distil.RECIPE["lr"] = 1e-3
        assert key(distilled) != before
    finally:
        _distil.RECIPE.clear()
        _distil.RECIPE.update(recipe)


@pytest.mark.parametrize(
    ("module", "name"),
    [
        (_model, "FIT_WINDOW"),
        (_quality, "QUALITY_TOKENS"),
        (_quality, "QUALITY_WINDOW"),
        (_corpus, "SPLIT_SEED"),
        (_corpus, "VALIDATION_TOKENS"),
        (_corpus, "TEST_TOKENS"),
    ],
)
def test_each_text_constant_is_in_the_key(  # type: ignore[no-untyped-def]
    key, monkeypatch: pytest.MonkeyPatch, module: object, name: str
) -> None:
    before = key()
    value = getattr(module, name)
    monkeypatch.setattr(module, name, value + 1 if isinstance(value, int) else value + "x")
    assert key() != before


def test_the_conversion_code_is_in_the_key(  # type: ignore[no-untyped-def]
    key, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    code = tmp_path / "moe"
    shutil.copytree(Path(_cache.__file__).parent, code)
    digest = _cache._conversion_digest
    monkeypatch.setattr(_cache, "_conversion_digest", functools.partial(digest, code))
    before = key()
    for name in _cache.CONVERSION_MODULES:
        file = code / name
        original = file.read_bytes()
        file.write_bytes(original + b"\n# a change\n")
        assert key() != before, name
        file.write_bytes(original)
    assert key() == before
    (code / "_stages.py").write_bytes(b"# serving code, not conversion\n")
    assert key() == before


def test_the_corpus_package_version_is_in_the_key(  # type: ignore[no-untyped-def]
    key, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = key()
    monkeypatch.setattr(_cache, "_corpus_version", lambda: "0.0.8")
    assert key() != before


def test_the_fit_text_is_in_the_key(key, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A model fitted on one text is never the cached model of another: not the embedded text,
    not another file, not the same file once it changed."""
    text = tmp_path / "mine.txt"
    text.write_text("A request of mine.\n\nAnother request.\n")
    mine = moefy_options(4, 1, fit_corpus=str(text))
    before = key(mine)
    assert before != key()
    text.write_text("A request of mine.\n\nAnother request, edited.\n")
    assert key(mine) != before
    edited = key(mine)
    pinned = mine.model_copy(update={"fit_corpus_sha256": _corpus.load_corpus(str(text)).sha256})
    assert key(pinned) == edited  # pinning the hash names the same model
    text.write_text("Yet another text.\n")
    with pytest.raises(CorpusError, match="not the text the model was fitted on"):
        key(pinned)
