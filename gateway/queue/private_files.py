"""Files the gateway keeps for itself (the queue store): readable by its own user only.

Queued payloads are other people's data: the data directory is created 0700 and each data
file 0600 before anything opens it (SQLite gives its -wal and -shm files the database
file's mode). An existing directory that others can read is left as it is, with a warning:
it may be shared on purpose, and changing a directory the gateway did not create would
surprise whoever owns it.
"""

from __future__ import annotations

import logging
import os
import stat

log = logging.getLogger("gateway.files")

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_file(path: str) -> None:
    """Create ``path`` (empty, 0600) and its directory (0700) unless they exist; tighten an
    existing file to 0600."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=DIR_MODE, exist_ok=True)
        os.chmod(directory, DIR_MODE)  # makedirs' mode is filtered by the umask
    elif stat.S_IMODE(os.stat(directory).st_mode) & 0o077:
        log.warning("data directory %s is accessible to other users; chmod 700 it", directory)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
