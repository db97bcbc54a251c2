"""Writing output so that a failure never leaves half of it behind or loses the user's data."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from moelambda.exceptions import OutputExistsError

__all__ = ["write_atomically", "write_file_atomically"]


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
