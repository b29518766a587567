"""File checksums (stdlib only, so the serving runtime can use them too)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_digest(path: str | Path, algorithm: str = "sha256") -> str:
    """Hex digest of a file, read in chunks (hashlib.file_digest)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, algorithm).hexdigest()
