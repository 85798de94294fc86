"""Large arrays of a values message in shared memory: the one copy of a hop.

An array of ``SHM_MIN`` bytes or more that goes to an op on worker processes of its own, or
comes back from it, is written once into a file of the pipeline's private directory in
``/dev/shm`` (a memory file system: nothing touches a disk) and the message names the file;
the other side maps the file and reads the array in place. So the array is copied once per
hop, where the socket would move it through the kernel and copy it on both sides.

Files live only while a call needs them: the gateway removes a request's files once the
call is over, and each answer's file once it has mapped it (the mapping stays readable);
what a call that gave up leaves behind goes with the directory when the pipeline stops.
The file is filled with ``write`` (never through a mapping, where a full ``/dev/shm`` would
be a SIGBUS): when there is no room, the array travels in the message as before.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

SHM_MIN = 1 << 20
# The variable naming an op worker's directory: the only one it reads from or writes to,
# whatever a message says (a message may come from a direct caller of the worker).
SHM_ENV = "EASKIT_PIPELINE_SHM"
# Mapped with every page at once: a page fault per 4 KiB would cost more than reading it.
_SHARED_POPULATED = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
SHM_ROOT = Path("/dev/shm")  # noqa: S108 - the memory file system, for a private directory in it


class ShmArea:
    """A directory of its own (mode 0700) for one pipeline's messages: its path is chosen when
    the pipeline is built (its workers are told it), the directory made when it starts."""

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def plan(cls, name: str, root: Path = SHM_ROOT) -> ShmArea | None:
        """An area to open at start, or None where there is no memory file system to hold one."""
        if not root.is_dir() or not os.access(root, os.W_OK):
            return None
        return cls(str(root / f"easkit-{name}-{secrets.token_hex(8)}"))

    def open(self) -> bool:
        """Make the directory; False when it cannot be (the arrays then go in the messages)."""
        try:
            os.mkdir(self.path, 0o700)
        except OSError:
            return False
        return True

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class ShmWriter:
    """Puts arrays into files of one directory; remembers the files it made."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.made: list[str] = []

    def put(self, arr: np.ndarray) -> str | None:
        """A new file holding ``arr``'s bytes (C order) -> its path; None when there is no room."""
        try:
            fd, path = tempfile.mkstemp(dir=self.directory)
        except OSError:
            return None
        try:
            # write(), not a mapping: the kernel copies straight into the file's pages (about
            # half the time of faulting them in one by one), and a full /dev/shm is ENOSPC.
            view = memoryview(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            os.close(fd)
            remove(path)
            return None
        os.close(fd)
        self.made.append(path)
        return path

    def remove_all(self) -> None:
        for path in self.made:
            remove(path)
        self.made.clear()


def take(
    path: str, dtype: np.dtype[Any], shape: list[int], nbytes: int, *, directory: str | None, unlink: bool
) -> np.ndarray:
    """A read-only view of a file :meth:`ShmWriter.put` wrote in ``directory`` (the mapping
    lives as long as the array); ``unlink``: remove the file once mapped. ValueError for a
    file elsewhere (or no directory), OSError when it is gone."""
    name = os.path.basename(path)
    if directory is None or os.path.dirname(path) != directory or name in ("", ".", ".."):
        raise ValueError("a shared memory file outside the pipeline's directory")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        if os.fstat(fd).st_size < nbytes:
            raise ValueError(f"{Path(path).name}: shorter than the {nbytes} bytes it should hold")
        mm = mmap.mmap(fd, nbytes, flags=_SHARED_POPULATED, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
        if unlink:
            remove(path)
    return np.frombuffer(mm, dtype, nbytes // dtype.itemsize).reshape(shape)


def remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


__all__ = ["SHM_ENV", "SHM_MIN", "SHM_ROOT", "ShmArea", "ShmWriter", "remove", "take"]
