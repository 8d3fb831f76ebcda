"""Write a deploy/.env with fresh random passwords: ``python3 deploy/make_env.py``.

Copies .env.example beside this file and fills every empty ``*_PASSWORD=`` line with 48 hex
digits (letters and digits only, as the Redis ACL rendering needs). Refuses to overwrite an
existing .env: the passwords in it are already baked into the running servers.
"""

import os
import re
import secrets
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
target = here / ".env"
if target.exists():
    sys.exit(f"{target} exists; remove it first to start over with new passwords")
text = (here / ".env.example").read_text()
filled = re.sub(r"(?m)^(\w+_PASSWORD)=$", lambda m: f"{m[1]}={secrets.token_hex(24)}", text)
# Created 0600 before a secret is written (never readable by others, not even for a
# moment), and only if nothing is there: O_EXCL refuses an existing file and a symlink
# planted in its place, which would carry the passwords wherever it points.
try:
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
except FileExistsError:
    sys.exit(f"{target} exists; remove it first to start over with new passwords")
with os.fdopen(fd, "w") as out:
    out.write(filled)
print(f"wrote {target}")
