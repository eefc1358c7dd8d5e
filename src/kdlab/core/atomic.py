"""The one atomic writer: every file kdlab writes goes through a temp file and a rename.

A reader (or a crash) never sees half a file: ``metrics.json`` holds a whole JSON object or is
absent, a checkpoint directory is whole or absent. Files get the usual permissions (0666 minus
the umask), directories 0777 minus the umask (``mkstemp`` / ``mkdtemp`` would leave them private).
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()
FILE_MODE = 0o666 & ~_UMASK
DIR_MODE = 0o777 & ~_UMASK


def write_atomic(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` on a temp file next to ``path``, then rename it onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json_atomic(path: str | Path, obj: Any) -> Path:
    """JSON (indented, sorted keys; numpy / torch scalars as floats, anything else as str)."""
    def default(v: Any) -> Any:
        try:
            return float(v)
        except (TypeError, ValueError):
            return str(v)

    return write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=default) + "\n")


def write_dir_atomic(directory: str | Path, fill: Callable[[Path], None]) -> Path:
    """Call ``fill(tmp_dir)``, then put ``tmp_dir`` in place of ``directory`` (an existing one is
    moved aside first and removed after, so ``directory`` is never half written; when another
    process puts its copy there in between, that copy stays)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", suffix=".tmp", dir=directory.parent))
    try:
        fill(tmp)
        os.chmod(tmp, DIR_MODE)
        for f in tmp.rglob("*"):
            os.chmod(f, DIR_MODE if f.is_dir() else FILE_MODE)
        old = None
        if directory.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", suffix=".old", dir=directory.parent))
            os.replace(directory, old / "x")
        try:
            os.replace(tmp, directory)
        except OSError:
            if not directory.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # a concurrent writer put its whole copy there first
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


@contextmanager
def locked(path: str | Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``.<name>.lock`` beside ``path`` (waiting for it): one
    process at a time builds ``path``. The OS releases the lock when its process dies."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.parent / f".{path.name}.lock", os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (closing releases the lock)
