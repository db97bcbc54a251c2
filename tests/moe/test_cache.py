"""The model cache's key changes whenever the model it names would: options, the text it is
fitted on, conversion code, the constants that cut its text, the corpus package, the
distillation recipe and the numeric libraries; and only then: not for another spelling or copy of
the same fit text, the same weights at another path (a reinstalled venv), or a docstring."""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import os
import shutil
import time
from pathlib import Path

import pytest

from ground.errors import CorpusError
from moe import (
    _cache,
    _corpus,
    _distil,
    _model,
    _quality,
    load_corpus,
    load_model,
    moefy_options,
    quality_of,
    resolve_model,
)
from moe._registry import ModelSource


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


@pytest.fixture
def code(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A copy of moe/ whose conversion code the key digests, for a test to edit."""
    copy = tmp_path / "moe"
    shutil.copytree(Path(_cache.__file__).parent, copy)
    digest = _cache._conversion_digest
    monkeypatch.setattr(_cache, "_conversion_digest", functools.partial(digest, copy))
    return copy


def test_the_conversion_code_is_in_the_key(key, code: Path) -> None:  # type: ignore[no-untyped-def]
    before = key()
    assert "_export.py" in _cache.CONVERSION_MODULES  # how the weights are written
    for name in _cache.CONVERSION_MODULES:
        file = code / name
        original = file.read_bytes()
        file.write_bytes(original + b"\n_A_CHANGE = 1\n")
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


def _docstring_lines(source: str) -> list[int]:
    """The first line of every docstring of a module (its own, its classes', its functions')."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    lines.append(first.lineno)
    return lines


def test_docstrings_and_comments_are_not_in_the_key(key, code: Path) -> None:  # type: ignore[no-untyped-def]
    """Rewording the documentation of the conversion code converts nothing again."""
    before = key()
    for name in _cache.CONVERSION_MODULES:
        file = code / name
        lines = file.read_text().splitlines(keepends=True)
        docstrings = _docstring_lines("".join(lines))
        assert docstrings, name
        for number in docstrings:
            line = lines[number - 1]
            quote = '"""' if '"""' in line else "'''"
            lines[number - 1] = line.replace(quote, quote + "Reworded. ", 1)
        lines.insert(0, "# a new comment\n")
        lines.append("# and another one\n")
        file.write_text("".join(lines))
        assert key() == before, name
    # A function whose docstring is its whole body still does the same.
    (code / "_export.py").write_text(
        (code / "_export.py").read_text() + '\n\ndef _only_doc():\n    """Nothing."""\n'
    )
    with_doc = key()
    (code / "_export.py").write_text(
        (code / "_export.py").read_text().replace('"""Nothing."""', "pass")
    )
    assert key() == with_doc != before


@pytest.mark.parametrize("library", ["torch", "transformers", "gguf", "numpy", "tokenizers"])
def test_each_numeric_library_version_is_in_the_key(  # type: ignore[no-untyped-def]
    key, monkeypatch: pytest.MonkeyPatch, library: str
) -> None:
    before = key()
    real = importlib.metadata.version

    def version(name: str) -> str:
        return "999.0" if name == library else real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert key() != before


def test_every_spelling_and_copy_of_one_fit_text_is_one_key(  # type: ignore[no-untyped-def]
    key, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`data/corp.txt`, `./data/corp.txt`, its absolute path and a byte-identical copy name one
    text: one model. The embedded text stays "wiki", another text is another model."""
    (tmp_path / "data").mkdir()
    text = tmp_path / "data" / "corp.txt"
    text.write_text("A request of mine.\n\nAnother request.\n")
    copy = tmp_path / "elsewhere.txt"
    shutil.copyfile(text, copy)
    monkeypatch.chdir(tmp_path)
    keys = {
        spelling: key(moefy_options(4, 1, fit_corpus=spelling))
        for spelling in ("data/corp.txt", "./data/corp.txt", str(text), str(copy))
    }
    assert len(set(keys.values())) == 1, keys
    assert key(moefy_options(4, 1, fit_corpus="wiki")) == key() != keys[str(text)]
    copy.write_text("Another text altogether.\n")
    assert key(moefy_options(4, 1, fit_corpus=str(copy))) != keys[str(text)]


def _copy(src: Path, dst: Path) -> Path:
    """A copy of `src` at `dst` with fresh modification times (as a reinstall writes it)."""
    shutil.copytree(src, dst, copy_function=shutil.copyfile)
    later = time.time_ns() + 10**9
    for file in dst.rglob("*"):
        os.utime(file, ns=(later, later))
    return dst


def test_the_same_weights_at_another_path_are_one_key(
    tiny_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """A model directory is keyed by its files' content, not their path or times: a copy (or a
    reinstalled venv) converts nothing again; a changed weight does."""
    options = moefy_options(4, 1)
    original = resolve_model(str(tiny_dirs["llama"]))
    moved = resolve_model(str(_copy(original.path, tmp_path / "elsewhere" / "llama")))
    assert _cache._key(moved, options) == _cache._key(original, options)
    weights = next(moved.path.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert _cache._key(moved, options) != _cache._key(original, options)


def test_a_weight_file_is_hashed_once_per_size_and_time(
    tiny_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hashes are remembered beside the cache, so a large GGUF is not read on every command;
    a file written again is hashed again."""
    monkeypatch.setenv(_cache.CACHE_ENV, str(tmp_path / "cache"))
    source = resolve_model(str(_copy(tiny_dirs["llama"], tmp_path / "llama")))
    read: list[object] = []
    real = hashlib.file_digest

    def counted(file, digest):  # type: ignore[no-untyped-def]
        read.append(file)
        return real(file, digest)

    monkeypatch.setattr(hashlib, "file_digest", counted)
    options = moefy_options(4, 1)
    before = _cache._key(source, options)
    files = len(read)
    assert files >= 2 and (tmp_path / "cache" / _cache.HASHES_FILE).is_file()
    _cache._sha256_of.cache_clear()  # a new process: only the sidecar remembers
    assert _cache._key(source, options) == before
    assert len(read) == files
    config = source.path / "config.json"
    config.write_text(config.read_text())  # same content, new time: read again, same key
    assert _cache._key(source, options) == before
    assert len(read) == files + 1


def _fake_distribution(site: Path, version: str) -> Path:
    """A model shipped in an installed distribution `weights-pkg` under `site`."""
    model = site / "weights_pkg" / "model"
    model.mkdir(parents=True)
    (site / "weights_pkg" / "__init__.py").write_text("")
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    info = site / f"weights_pkg-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: weights-pkg\nVersion: {version}\n"
    )
    record = [
        f"{p.relative_to(site).as_posix()},,{p.stat().st_size}"
        for p in sorted((site / "weights_pkg").rglob("*"))
        if p.is_file()
    ]
    (info / "RECORD").write_text("\n".join([*record, f"{info.name}/RECORD,,"]) + "\n")
    return model


def test_a_packaged_model_is_keyed_by_its_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model from an installed package is its distribution's name and version: a reinstall
    elsewhere (new venv, new times) is the same key without reading the weights; another
    version is another key; a weight edited in place is hashed like any directory."""

    def key(model: Path) -> str:
        return _cache._key(ModelSource(str(model), model, "llama"), moefy_options(4, 1))

    def not_read(*_args: object) -> str:
        raise AssertionError("a packaged model's weights were hashed")

    first = _fake_distribution(tmp_path / "venv1" / "site-packages", "1.0")
    again = _fake_distribution(tmp_path / "venv2" / "site-packages", "1.0")
    later = time.time_ns() + 10**9
    for file in again.rglob("*"):
        os.utime(file, ns=(later, later))
    newer = _fake_distribution(tmp_path / "venv3" / "site-packages", "1.1")
    for site in ("venv1", "venv2", "venv3"):
        monkeypatch.syspath_prepend(str(tmp_path / site / "site-packages"))
    with monkeypatch.context() as patched:
        patched.setattr(_cache, "_sha256_of", not_read)
        assert _cache._distribution_of(first) == {
            "distribution": "weights-pkg",
            "version": "1.0",
            "directory": "weights_pkg/model",
        }
        assert key(first) == key(again) != key(newer)
    (again / "model.safetensors").write_bytes(b"\1" * 65)
    assert _cache._distribution_of(again) is None
    assert key(again) != key(first)


def _fit_file(path: Path) -> str:
    # Whole documents of the embedded text, enough for both held-out parts and a fit part.
    path.write_text("\n\n".join(load_corpus("wiki").documents[:900]) + "\n")
    return str(path)


def test_a_cache_hit_names_the_text_and_model_as_asked_now(
    tiny_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same fit text at another path, and the same model at another path, are a cache hit,
    and the model, its options and its quality block name the paths given now, not those of
    the conversion."""
    monkeypatch.setenv(_cache.CACHE_ENV, str(tmp_path / "cache"))
    # The code is not what this test changes (an edit to the tree while it runs must not miss).
    digest = _cache._conversion_digest()
    monkeypatch.setattr(_cache, "_conversion_digest", lambda: digest)
    first_text = _fit_file(tmp_path / "first.txt")
    second_text = str(tmp_path / "second.txt")
    shutil.copyfile(first_text, second_text)
    first_model = str(_copy(tiny_dirs["llama"], tmp_path / "first-model"))
    second_model = str(_copy(tiny_dirs["llama"], tmp_path / "second-model"))

    def load(model: str, text: str, messages: list[str]):  # type: ignore[no-untyped-def]
        options = moefy_options(4, 2, fit_tokens=256, fit_corpus=text)
        return load_model(model, options=options, quality_tokens=1024, progress=messages.append)

    converted: list[str] = []
    load(first_model, first_text, converted)
    assert not any("from the cache" in m for m in converted)
    shutil.rmtree(first_model)
    Path(first_text).unlink()  # the files of the conversion are gone: nothing may name them
    hit: list[str] = []
    model = load(second_model, second_text, hit)
    assert any("from the cache" in m for m in hit), hit
    assert model.name == second_model
    assert model.options.fit_corpus == second_text
    assert model.options.fit_corpus_sha256 == load_corpus(second_text).sha256
    assert model.quality["fit_corpus"] == second_text
    assert model.quality["corpus"] == second_text
    quality, measured = quality_of(model, corpus=second_text, tokens=1024)
    assert not measured
    assert quality.where() == (
        f"Fitted on the fit part of '{second_text}', judged on its test part (documents no "
        "fit or choice read)."
    )
    assert "first" not in repr(model.quality)
    # The stored block read back for the judged text spelled another way names that spelling.
    monkeypatch.chdir(tmp_path)
    quality, measured = quality_of(model, corpus="second.txt", tokens=1024)
    assert not measured
    assert quality.corpus == "second.txt"


def test_a_model_another_process_is_converting_is_waited_for_not_converted_again(
    tiny_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the entry's lock is held (another command, or another test worker sharing the
    cache, converting the same model), `load_model` says it waits, converts nothing, and loads
    what the holder cached once it lets go."""
    import threading

    import filelock

    monkeypatch.setenv(_cache.CACHE_ENV, str(tmp_path / "cache"))
    digest = _cache._conversion_digest()  # an edit to the tree while this runs must not miss
    monkeypatch.setattr(_cache, "_conversion_digest", lambda: digest)
    path = str(tiny_dirs["llama"])
    options = moefy_options(4, 1, fit_tokens=256)
    entry = _cache._entry(resolve_model(path), options)
    holder = filelock.FileLock(entry.with_name(entry.name + ".lock"))
    entry.parent.mkdir(parents=True)
    holder.acquire()
    built = load_model(path, options=options, cache=False, quality_tokens=0)
    builds: list[str] = []
    real_build = _cache.build_model

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        builds.append(str(args))
        return real_build(*args, **kwargs)

    monkeypatch.setattr(_cache, "build_model", counted)
    messages: list[str] = []
    waiting = threading.Event()

    def progress(message: str) -> None:
        messages.append(message)
        if message.startswith("waiting for another process"):
            waiting.set()

    loaded: list[object] = []
    waiter = threading.Thread(
        target=lambda: loaded.append(
            load_model(path, options=options, quality_tokens=0, progress=progress)
        )
    )
    waiter.start()
    try:
        deadline = time.monotonic() + 300
        while not waiting.wait(timeout=0.05) and waiter.is_alive():  # waits, or went ahead
            assert time.monotonic() < deadline, messages
        assert waiting.is_set(), f"converted beside the holder instead of waiting: {messages}"
        _cache.export_model(built, entry)  # what the holder converts, then it lets go
    finally:
        holder.release()
        waiter.join(timeout=120)
    assert builds == [] and any("from the cache" in m for m in messages), messages
    (model,) = loaded
    assert model.routers[0].linear.weight.equal(built.routers[0].linear.weight)  # type: ignore[attr-defined]


def test_a_cache_that_cannot_hold_a_lock_still_converts(
    tiny_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache path that is not a directory (a read-only or mistaken setting): no lock, no
    entry, a warning, and the converted model all the same."""
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    monkeypatch.setenv(_cache.CACHE_ENV, str(blocked))
    with pytest.warns(UserWarning, match="could not cache the MoEfied model"):
        model = load_model(
            str(tiny_dirs["llama"]), experts=4, top_k=1, fit_tokens=256, quality_tokens=0
        )
    assert model.experts == 4 and blocked.is_file()
