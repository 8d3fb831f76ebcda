"""Print the versions a fresh install resolved from pyproject.toml beside the lock's pins.

Run by ``make test-newest`` with the interpreter of the virtualenv it made: one line per
runtime dependency of Baton (its name, the version installed, the lock's pin when it
differs), so a CI log says which versions the second run tested.

    python scripts/newest.py requirements/dev.lock
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path

_PIN = re.compile(r"^([A-Za-z0-9_.-]+)==([^\s\\;]+)", re.MULTILINE)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(lock: str) -> int:
    pins = {_canonical(n): v for n, v in _PIN.findall(Path(lock).read_text())}
    names = []
    for requirement in requires("baton") or []:
        if "extra ==" in requirement:
            continue
        names.append(_canonical(re.split(r"[\s\[<>=!~;(]", requirement, maxsplit=1)[0]))
    print("newest allowed versions (a fresh resolution of pyproject.toml):")
    for name in sorted(set(names)):
        try:
            found = version(name)
        except PackageNotFoundError:
            found = "not installed"
        pinned = pins.get(name)
        note = "" if pinned in (None, found) else f"   (lock: {pinned})"
        print(f"  {name:<40} {found}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "requirements/dev.lock"))
