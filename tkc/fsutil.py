"""Small file-system helpers shared by the stages: atomic, change-only writes."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: bytes | str) -> bool:
    """Write ``data`` to ``path`` through a temp file and rename; skip if unchanged.

    Returns True when the file was (re)written. Readers never see a half-written
    file, and an unchanged file keeps its mtime (nothing downstream re-runs).
    """
    raw = data.encode() if isinstance(data, str) else data
    if path.is_file() and path.read_bytes() == raw:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
