"""Output written through `ground.files` gets the mode a plain open() or mkdir() would give under
the process's umask, not the private mode of the temporary file or folder it was written in
(issue 37: every output was 0600, every output folder 0700, whatever the umask)."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ground import files
from ground.files import write_atomically, write_file_atomically


@pytest.fixture
def umask() -> Iterator[Callable[[int], None]]:
    """Set the umask for one test; the old one comes back after it."""
    old = os.umask(0o022)
    os.umask(old)
    try:
        yield os.umask
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _fill(tmp: Path) -> None:
    """A directory writer: a file, a subfolder with a file, a private temporary file and an
    executable, as the writers of traces, tables and exports make them."""
    (tmp / "a.json").write_text("{}")
    (tmp / "sub").mkdir()
    (tmp / "sub" / "b.bin").write_bytes(b"x")
    fd, name = tempfile.mkstemp(dir=tmp / "sub")  # 0600 whatever the umask
    os.close(fd)
    os.rename(name, tmp / "sub" / "c.npz")
    (tmp / "run.sh").write_text("#!/bin/sh\n")
    (tmp / "run.sh").chmod(0o700)


@pytest.mark.parametrize(
    ("mask", "file", "folder", "executable"),
    [(0o022, 0o644, 0o755, 0o755), (0o077, 0o600, 0o700, 0o700), (0o002, 0o664, 0o775, 0o775)],
)
def test_output_has_the_mode_the_umask_gives(
    umask: Callable[[int], None],
    tmp_path: Path,
    mask: int,
    file: int,
    folder: int,
    executable: int,
) -> None:
    umask(mask)
    path = tmp_path / "out" / "plan.json"
    write_file_atomically(path, lambda tmp: tmp.write_text("{}"), force=False)
    assert _mode(path) == file
    out = tmp_path / "trace"
    write_atomically(out, _fill, force=False)
    assert _mode(out) == folder and _mode(out / "sub") == folder
    assert _mode(out / "a.json") == file and _mode(out / "sub" / "b.bin") == file
    assert _mode(out / "sub" / "c.npz") == file
    assert _mode(out / "run.sh") == executable
    assert os.umask(mask) == mask  # writing left the umask as it was


def test_replacing_with_force_also_gets_the_umask_mode(
    umask: Callable[[int], None], tmp_path: Path
) -> None:
    umask(0o022)
    path = tmp_path / "counts.json"
    path.write_text("old")
    path.chmod(0o600)
    write_file_atomically(path, lambda tmp: tmp.write_text("new"), force=True)
    assert path.read_text() == "new" and _mode(path) == 0o644


def test_the_umask_is_read_without_proc(
    umask: Callable[[int], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where /proc/self/status cannot be read, the umask is read by setting and restoring it."""
    umask(0o027)
    assert files._umask() == 0o027

    def no_proc(*_: object, **__: object) -> object:
        raise OSError("no /proc here")

    monkeypatch.setattr(files, "open", no_proc, raising=False)
    assert files._umask() == 0o027
    assert os.umask(0o027) == 0o027  # and restored it
