#!/usr/bin/env bash
# Commit subjects are at most 72 characters (reasons and figures go in the body), checked for
# every commit after SINCE: the history before it is left as it was written. A clone without
# that commit (a shallow one, say) has nothing to check.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SINCE=${1:-6a1542c5c3f69248410876fab2c57c29cce74195}
MAX=72
if ! git rev-parse --quiet --verify "$SINCE^{commit}" >/dev/null 2>&1; then
    echo "commit-subjects: $SINCE is not in this clone; nothing to check"
    exit 0
fi
# Counted in characters, not bytes (python3: awk may count bytes).
long=$(git log --encoding=UTF-8 --format='%h%x09%s' "$SINCE..HEAD" | python3 -c '
import sys
for line in sys.stdin.buffer.read().decode("utf-8", "replace").splitlines():
    sha, _, subject = line.partition("\t")
    if len(subject) > '"$MAX"':
        print(f"{sha} ({len(subject)}): {subject}")')
if [ -n "$long" ]; then
    echo "commit subjects over $MAX characters (move the rest to the body):" >&2
    echo "$long" >&2
    exit 1
fi
