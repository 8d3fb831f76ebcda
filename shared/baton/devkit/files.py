"""Files of a local stack that hold secrets."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_private"]


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` with mode 0600 from the first byte (atomic replace): a
    server's config with passwords in it, the stack's credentials."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    tmp.replace(path)
    return path
