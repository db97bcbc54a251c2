"""Stage weights from S3, downloaded and built once per warm container.

A function downloads manifest.json once, and config/ once if it builds a head, gate or tail
(StageLoader needs the Hugging Face config to build their empty modules; an expert needs only
the manifest, so its policy grants no config/ at all), then only its own stage's safetensors
file: an expert never pays for the others.
Built stages are kept in a module-level cache keyed by (bucket, key), so a warm invocation
makes no S3 request at all for its weights: the cost model bills a request only its own data.
Each is built on the function's placement (`functions.config.Config.placement`: a GPU-backed
function's stages on its device at bfloat16, tensor by tensor, `moe.StageLoader`), which is
part of the key.

The downloaded files live in a directory of this process only, removed when the process ends
normally; a stage's file is removed as soon as the stage is built (the built stage holds its
tensors), so a long-lived process that serves many exports, as the local runner and the tests do,
never holds more than one stage file on disk. A process ended by a signal cannot remove its
directory: whoever starts such processes gives each its own TMPDIR and removes it (as Lambda
reclaims an environment's /tmp, and as `runtime.environments` does).

The price: weights re-uploaded under the same keys are not seen by warm containers. A new
export goes under a new weights prefix (`cdk deploy -c weights_prefix=weights-v2/ ...`), and
the redeploy, which changes every function's environment, starts fresh containers.
"""

from __future__ import annotations

import atexit
import hashlib
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from botocore.exceptions import ClientError

from functions import config as function_config
from ground.errors import ModelError
from ground.manifest import HEAD_KEY, TAIL_KEY, expert_key, layer_key
from moe import StageLoader
from moe._stages import ExpertStage, HeadStage, LayerStage, TailStage
from pipeline.transports import is_missing, list_keys

__all__ = ["expert", "head", "layer", "loader", "tail"]

T = TypeVar("T")
_LOCK = threading.RLock()  # one build at a time: the local runner runs handlers in threads
_LOADERS: dict[tuple[str, ...], StageLoader] = {}
_CONFIGURED: set[tuple[str, ...]] = set()  # loaders whose config/ is downloaded
_STAGES: dict[tuple[str, ...], Any] = {}
_ROOT: list[Path] = []  # the per-process cache directory, created on first use


def _cache_dir() -> Path:
    with _LOCK:
        if not _ROOT:
            _ROOT.append(Path(tempfile.mkdtemp(prefix="moelambda-weights-")))
            atexit.register(shutil.rmtree, _ROOT[0], ignore_errors=True)
        return _ROOT[0]


def _download(s3: Any, bucket: str, key: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".part")
    try:
        s3.download_file(bucket, key, str(partial))
    except ClientError as err:
        if not is_missing(s3, bucket, key, err):
            raise
        raise ModelError(
            f"the weights object s3://{bucket}/{key} is missing.",
            "upload the model export under the weights prefix (see the README's deploy section).",
        ) from err
    partial.replace(path)


def loader(s3: Any, bucket: str, prefix: str, *, config: bool = True) -> StageLoader:
    """A StageLoader on a local copy of the manifest of the export under `prefix`, and of its
    config/ unless `config` is False (an expert's)."""
    manifest_key = prefix + "manifest.json"
    placement = function_config.current().placement
    cache_key = (bucket, manifest_key, *placement.environment().values())
    with _LOCK:
        if cache_key not in _LOADERS:
            digest = hashlib.sha256("\0".join(cache_key).encode()).hexdigest()[:16]
            root = _cache_dir() / digest
            _download(s3, bucket, manifest_key, root / "manifest.json")
            _LOADERS[cache_key] = StageLoader(root, placement)
        stages = _LOADERS[cache_key]
        if config and cache_key not in _CONFIGURED:
            for key in list_keys(s3, bucket, prefix + "config/"):
                _download(s3, bucket, key, stages.root / key[len(prefix) :])
            _CONFIGURED.add(cache_key)
        return stages


def _stage(
    s3: Any,
    bucket: str,
    prefix: str,
    key: str,
    build: Callable[[StageLoader], T],
    config: bool = True,
) -> T:
    placement = function_config.current().placement
    cache_key = (bucket, prefix + key, *placement.environment().values())
    with _LOCK:
        if cache_key not in _STAGES:
            stages = loader(s3, bucket, prefix, config=config)
            path = stages.root / key
            _download(s3, bucket, prefix + key, path)
            try:
                _STAGES[cache_key] = build(stages)
            finally:
                path.unlink(missing_ok=True)
        return _STAGES[cache_key]


def head(s3: Any, bucket: str, prefix: str) -> HeadStage:
    return _stage(s3, bucket, prefix, HEAD_KEY, lambda s: s.head())


def layer(s3: Any, bucket: str, prefix: str, index: int) -> LayerStage:
    return _stage(s3, bucket, prefix, layer_key(index), lambda s: s.layer(index))


def expert(s3: Any, bucket: str, prefix: str, index: int, number: int) -> ExpertStage:
    key = expert_key(index, number)
    return _stage(s3, bucket, prefix, key, lambda s: s.expert(index, number), config=False)


def tail(s3: Any, bucket: str, prefix: str) -> TailStage:
    return _stage(s3, bucket, prefix, TAIL_KEY, lambda s: s.tail())
