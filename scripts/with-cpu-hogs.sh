#!/usr/bin/env bash
# Run a command beside N busy processes (default 8 on 2 cores: load ~10), then stop them.
# `make test-stress` runs the test suite this way: tests must wait on events and assert on
# causal order or the system's own clock, so a loaded machine may slow them, never fail them.
set -euo pipefail
hogs=${1:?usage: with-cpu-hogs.sh N COMMAND...}
shift
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; }
trap cleanup EXIT
for _ in $(seq "$hogs"); do
    nice -n 0 python3 -c 'while True: pass' &
    pids+=("$!")
done
echo "running beside $hogs CPU hogs: $*" >&2
"$@"
