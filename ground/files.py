"""Writing output so that a failure never leaves half of it behind or loses the user's data."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from ground.errors import MoelambdaError, OutputExistsError, UsageError

__all__ = ["read_document", "why_unwritable", "write_atomically", "write_file_atomically"]

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


def why_unwritable(path: Path) -> str | None:
    """Why `path` cannot be created or replaced, or None when it can.

    The writers here make `path`'s missing parents and then a temporary sibling of it, so the
    nearest existing ancestor of its parent must be a directory this process can write to.
    """
    ancestor = Path(path).parent
    while not ancestor.exists() and ancestor.parent != ancestor:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"'{ancestor}' is a file, not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"the directory '{ancestor}' is not writable"
    return None


def _cannot_write(path: Path, error: OSError) -> UsageError:
    """A failed write (a full disk, a path a file blocks, a permission) as an error naming it."""
    why = why_unwritable(path)
    if why is None:
        why = error.strerror or str(error)
        if error.filename is not None and str(error.filename) != str(path):
            why += f" ('{error.filename}')"
    return UsageError(
        f"cannot write '{path}': {why}.",
        "write it under a directory you can write to, on a disk with free space.",
    )


_UMASK_LOCK = threading.Lock()


def _umask() -> int:
    """The process's umask, read without widening it for other threads.

    Linux shows it in /proc/self/status; elsewhere `os.umask` is the only way to read it, by
    setting it, so it is set to a private 0o077 (never 0, which would let another thread create
    a world-writable file meanwhile) and restored, under a lock.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


def _as_if_opened(top: Path) -> None:
    """Give `top` (and, a directory, everything in it) the mode a plain open() or mkdir() would
    have under the umask: the temporary files and folders made here are private (0600, 0700),
    and the rename that puts them in place keeps that mode. A file with an execute bit keeps
    it (0o777 & ~umask)."""
    mask = _umask()

    def fix(path: str) -> None:
        mode = os.lstat(path).st_mode
        if stat.S_ISDIR(mode):
            os.chmod(path, 0o777 & ~mask)
        elif stat.S_ISREG(mode):
            os.chmod(path, (0o777 if mode & 0o111 else 0o666) & ~mask)
        # a symbolic link has no mode of its own to set

    fix(str(top))
    if top.is_dir() and not top.is_symlink():
        for root, dirs, files in os.walk(top):
            for name in (*dirs, *files):
                fix(os.path.join(root, name))


def write_atomically(out: Path, write: Callable[[Path], None], *, force: bool) -> None:
    """Let `write(tmp_dir)` fill a temporary sibling of `out`, then move it into place.

    An interrupted or failing command thus leaves no partial output, and an existing non-empty
    `out` is only replaced when the user asked for it with `force`.
    """
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise OutputExistsError(
            f"'{out}' already exists and is not empty.", "pick a new --out or pass --force."
        )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as error:
        raise _cannot_write(out, error) from None
    try:
        write(tmp)
        _as_if_opened(tmp)
        if out.is_dir():
            shutil.rmtree(out)
        elif out.exists():
            out.unlink()
        os.replace(tmp, out)
    except OSError as error:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _cannot_write(out, error) from None
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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    except OSError as error:
        raise _cannot_write(path, error) from None
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        _as_if_opened(tmp)
        os.replace(tmp, path)
    except OSError as error:
        tmp.unlink(missing_ok=True)
        raise _cannot_write(path, error) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
