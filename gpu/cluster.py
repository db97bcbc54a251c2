"""The cluster a GPU plan runs on: the ordered list of GPU types of its ranks.

`--gpus N` of the catalogue's default type (`planner.hardware.catalogue`, the GPU types with
their speeds and prices), or the first N GPUs of a cluster file, which may also define its own
types:

    {"gpus": [{"type": "a100", "count": 4}, {"type": "t4", "count": 4}],
     "types": {"my-gpu": {...same fields as the catalogue...}}}
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationError

from ground.errors import UsageError
from ground.kinds import KINDS, detect_kind
from planner.hardware.catalogue import Catalogue, GpuType, _Strict, load_catalogue
from planner.hardware.catalogue import HardwareError as ClusterError

__all__ = ["Catalogue", "ClusterError", "GpuType", "load_catalogue", "load_cluster"]


_EXAMPLE = '{"gpus": [{"type": "t4", "count": 4}]}'
_WRITE = f"write {_EXAMPLE} (see `moelambda gpu-plan --help`)."


class _Group(_Strict):
    type: str
    count: int = Field(ge=1)


class _ClusterFile(_Strict):
    gpus: list[_Group] = Field(min_length=1)
    types: dict[str, GpuType] = {}


def load_cluster(
    path: Path | None, gpus: int, catalogue: Catalogue
) -> tuple[Catalogue, list[str]]:
    """(catalogue with the file's own types added, the type of each of the first `gpus` ranks)."""
    if gpus < 1:
        raise UsageError(f"--gpus {gpus} is not positive.", "pass --gpus 1 or more.")
    if path is None:
        return catalogue, [catalogue.default_type] * gpus
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise ClusterError(
            f"cannot read the cluster file '{path}': {err.strerror}.", "check the --cluster path."
        ) from err
    try:
        doc = _ClusterFile.model_validate_json(data)
    except ValidationError as err:
        kind = detect_kind(path)
        if kind is not None:  # another of our files: say which, not its schema errors
            raise ClusterError(
                f"'{path}' is {KINDS[kind].what}, not a cluster file: --cluster takes a JSON "
                f"file of GPU groups, e.g. {_EXAMPLE}.",
                f"{KINDS[kind].use}; for --cluster, {_WRITE}",
            ) from err
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the document"
        raise ClusterError(
            f"'{path}' is not a valid cluster file ({where}: {first['msg']}).", _WRITE
        ) from err
    merged = catalogue.model_copy(update={"types": {**catalogue.types, **doc.types}})
    ranks = [group.type for group in doc.gpus for _ in range(group.count)]
    for name in ranks:
        merged.get(name)
    if len(ranks) < gpus:
        raise ClusterError(
            f"the cluster file '{path}' holds {len(ranks)} GPUs; --gpus asks for {gpus}.",
            f"pass --gpus {len(ranks)} or fewer, or add GPUs to the file.",
        )
    return merged, ranks[:gpus]
