"""Faults of the environment that the command line shows as one line (exit code 2, no traceback).

``kdlab.cli.main`` is the one place that turns them (and ``ConfigError``) into that line.
"""
from __future__ import annotations

import tempfile
from pathlib import Path


class KdlabError(Exception):
    """A user or environment error; its message says what is wrong and what to do."""


class CorruptCheckpoint(KdlabError, ValueError):
    """A checkpoint's weights do not hash to the sha256 recorded for them (a ValueError too)."""


class DownloadFailed(KdlabError, RuntimeError):
    """A package that kdlab fetches could not be downloaded (a RuntimeError too)."""


def check_writable(path: str | Path, what: str = "outputs root") -> Path:
    """``path`` (created later by whoever writes there) can be written: its nearest existing
    folder is a directory that takes a file. Nothing is left behind; ``KdlabError`` if not."""
    path = Path(path)
    folder = next(p for p in [path, *path.parents] if p.exists())
    try:
        if not folder.is_dir():
            raise NotADirectoryError(f"{folder} is not a directory")
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise KdlabError(f"{what} {path} cannot be written ({e.strerror or e}); choose another with --outputs") from None
    return path
