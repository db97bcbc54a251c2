"""Writing output so that a failure never leaves half of it behind or loses the user's data."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from ground.errors import MoelambdaError, OutputExistsError

__all__ = ["read_document", "write_atomically", "write_file_atomically"]

Document = TypeVar("Document", bound=BaseModel)


def read_document(
    cls: type[Document], path: str | Path, error: type[MoelambdaError], what: str, fix: str
) -> Document:
    """Read and validate a JSON document; errors name the file, the first bad field and `fix`."""
    path = Path(path)
    try:
        return cls.model_validate_json(path.read_bytes())
    except OSError as err:
        raise error(f"cannot read the {what} '{path}': {err.strerror}.", fix) from err
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the document"
        raise error(f"'{path}' is not a valid {what} ({where}: {first['msg']}).", fix) from err


def write_atomically(out: Path, write: Callable[[Path], None], *, force: bool) -> None:
    """Let `write(tmp_dir)` fill a temporary sibling of `out`, then move it into place.

    An interrupted or failing command thus leaves no partial output, and an existing non-empty
    `out` is only replaced when the user asked for it with `force`.
    """
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise OutputExistsError(
            f"'{out}' already exists and is not empty.", "pick a new --out or pass --force."
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write(tmp)
        if out.is_dir():
            shutil.rmtree(out)
        elif out.exists():
            out.unlink()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_file_atomically(path: Path, write: Callable[[Path], None], *, force: bool) -> None:
    """Let `write(tmp_file)` fill a temporary sibling of the file `path`, then move it into place.

    The temporary name keeps `path`'s suffix, so writers that pick a format from it (matplotlib)
    still do.
    """
    if path.exists() and not force:
        raise OutputExistsError(
            f"'{path}' already exists.", "pick another file name or pass --force."
        )
    if path.is_dir():
        raise OutputExistsError(f"'{path}' is a directory.", "pass a file name.")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
