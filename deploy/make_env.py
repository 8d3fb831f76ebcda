"""Write a deploy/.env with fresh random passwords: ``python3 deploy/make_env.py``.

Copies .env.example beside this file and fills every empty ``*_PASSWORD=`` line with 48 hex
digits (letters and digits only, as the Redis ACL rendering needs). Refuses to overwrite an
existing .env: the passwords in it are already baked into the running servers.
"""

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
target.write_text(filled)
target.chmod(0o600)
print(f"wrote {target}")
