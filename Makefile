# The one command surface: the README, CI (.ci/run) and developers all go through these targets.
#
#   make deps        system prerequisites only: checks python, redis-server, openssl, Chromium
#                    and installs what is missing (scripts/bootstrap.sh)
#   make venv        the virtualenv (.venv) from requirements/dev.lock, Baton installed editable
#   make demo        system deps + virtualenv, then the five-notice crash/takeover demo
#   make test        system deps + virtualenv, then the default test suite (crash tests included;
#                    TEST_WORKERS=2 processes by default)
#   make test-newest the default suite against the newest versions pyproject.toml allows (no lock:
#                    a fresh virtualenv, as a team adding Baton to its own application gets)
#   make test-stress the default suite beside CPU hogs (HOGS=8): it must hold on a loaded machine
#   make test-chaos  the long randomized fault runs
#   make test-partition  network partitions in Linux network namespaces (root)
#   make bench       benchmarks (not timed tests), durable servers too; regenerates the tables of
#                    docs/benchmarks.md and the README's headline figures (~3 min)
#   make bench-obs   the cost of logs, metrics and tracing as shipped (~6 min; the tracing guide)
#   make bench-redis Redis' time per session by script and command (~1 min; docs/benchmarks.md)
#   make bench-lua   the session scripts' Lua time per session, line by line (~1 min)
#   make bench-holds holds on vs off, paired (CPU, sessions/s, p50; ~4 min)
#   make bench-limits a tool uncapped, capped but never bound, capped at 3 and at 20/s, paired
#                    (CPU per step, peak in flight, rate error; ~6 min; the scale-out guide)
#   make bench-durable  bench e2e on servers that fsync every write, durable baselines (~1 min)
#   make bench-soak  200,000 sessions (or an hour) on durable servers, seconds of retention,
#                    workers killed: memory and storage must plateau (SOAK_ARGS=--cluster too)
#   make screenshots the console screenshots of docs/console/, from the browser test
#   make docs        the docs site (docs/ + mkdocs.yml) into site/, warnings as errors
#   make lint        ruff + mypy, and commit subjects of at most 72 characters
#   make lock        re-pin requirements/*.lock from pyproject.toml (LOCK_ARGS=--upgrade for newer)
#   make clean       caches and build output
#   make distclean   make clean, and the virtualenv too

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

VENV ?= .venv
BIN := $(VENV)/bin
# First python >= 3.11 on PATH; override with `make PYTHON=python3.12 ...`.
PYTHON ?= $(shell scripts/bootstrap.sh find-python 2>/dev/null || echo python3)
# Re-install into the virtualenv only when the project's dependencies or their pins changed.
STAMP := $(VENV)/.baton-installed
# Exact, hashed pins of every dependency (pip-compile from pyproject.toml, which keeps ranges for
# library users): the runtime set for the image, the runtime + dev set for the venv and CI.
RUNTIME_LOCK := requirements/runtime.lock
DEV_LOCK := requirements/dev.lock
LOCK_ARGS ?=
PYTEST_ARGS ?=
# The default and stress suites run in this many pytest-xdist worker processes (TEST_WORKERS=0
# runs them in one process). Each worker starts its own Redis and NATS on free ports; most of a
# test's time is spent waiting on servers and timers, so two workers fit on two cores.
# worksteal: an idle worker takes queued tests from a busy one, so no long file ends the run alone.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist worksteal)

.PHONY: help deps venv demo test test-newest test-stress bench-soak test-chaos test-partition bench bench-obs bench-redis bench-lua bench-holds bench-limits bench-durable screenshots docs lint lock clean distclean

help:
	@sed -n 's/^#   make /make /p' $(firstword $(MAKEFILE_LIST))

deps:
	@scripts/bootstrap.sh

# Byte-compile the package's sources as pip does for a regular install. With
# PYTHONDONTWRITEBYTECODE set (common in containers and CI images) an editable install never
# writes them, and every worker process a stack or a test starts would compile all of Baton
# again: about 0.5 s of CPU per spawn. Only changed files are compiled again; a file edited
# later is compiled in memory until the next `make`.
PACKAGE_DIRS := shared brain hands relay api examples bench

venv: $(STAMP)
	@$(BIN)/python -m compileall -q -j 0 $(PACKAGE_DIRS) > /dev/null

# deps first (order-only): creating the venv needs python's venv module.
$(STAMP): pyproject.toml $(DEV_LOCK) | deps
	@if [ ! -x "$(BIN)/python" ]; then \
		echo "creating $(VENV) with $(PYTHON)"; \
		$(PYTHON) -m venv "$(VENV)"; \
	fi
	@$(BIN)/python -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || { \
		echo "$(VENV) uses python < 3.11: remove it and run make again" >&2; exit 1; }
	$(BIN)/python -m pip install --quiet -r $(DEV_LOCK)
	$(BIN)/python -m pip install --quiet --no-deps -e .
	@touch "$@"

demo: deps venv
	$(BIN)/baton demo

test: deps venv
	$(BIN)/pytest -q -m "not chaos and not partition" $(XDIST) $(PYTEST_ARGS)

# The lock pins what CI and the image run; a team that adds Baton to its application resolves
# pyproject.toml's ranges on the day it installs. This target does the same in a virtualenv
# made anew each run, prints what it resolved beside the lock, and runs the default suite.
NEWEST_VENV ?= .venv-newest

test-newest: deps
	rm -rf "$(NEWEST_VENV)"
	$(PYTHON) -m venv "$(NEWEST_VENV)"
	$(NEWEST_VENV)/bin/python -m pip install --quiet --upgrade pip setuptools
	$(NEWEST_VENV)/bin/python -m pip install --quiet -e '.[dev]'
	$(NEWEST_VENV)/bin/python scripts/newest.py $(DEV_LOCK)
	$(NEWEST_VENV)/bin/pytest -q -m "not chaos and not partition" $(XDIST) $(PYTEST_ARGS)

HOGS ?= 8

test-stress: deps venv
	scripts/with-cpu-hogs.sh $(HOGS) $(BIN)/pytest -q -m "not chaos and not partition" $(XDIST) $(PYTEST_ARGS)

test-chaos: deps venv
	$(BIN)/pytest -q -m chaos $(PYTEST_ARGS)

test-partition: deps venv
	$(BIN)/pytest -q -m partition $(PYTEST_ARGS)

# The benchmarks behind docs/benchmarks.md's tables and the README's headline figures, then
# both regenerated from bench/results/summary.json (BENCH_ARGS=--quick for a smoke run; `baton bench all` runs
# every benchmark).
BENCH_ARGS ?=

bench: deps venv
	$(BIN)/baton bench e2e durable takeover cold $(BENCH_ARGS)
	$(BIN)/python -m baton.bench.readme --command "make bench$(if $(BENCH_ARGS), BENCH_ARGS=$(BENCH_ARGS))"

# The observability figures of docs/guides/tracing.md: every stack driven once per round,
# each mode paired with its round's run without telemetry, 42 rounds, the modes moved from
# stack to stack every 7.
bench-obs: deps venv
	$(BIN)/baton bench obs $(BENCH_ARGS)

# Where Redis' time goes in a five-notice session (SLOWLOG of every command), by script.
bench-redis: deps venv
	$(BIN)/baton bench redis $(BENCH_ARGS)

# Where the scripts' own Lua time goes, by line (scripts profiled with BATON_LUA_PROFILE).
bench-lua: deps venv
	$(BIN)/baton bench lua $(BENCH_ARGS)

# What holding the lease for tool results saves: stacks with and without, paired rounds.
bench-holds: deps venv
	$(BIN)/baton bench holds $(BENCH_ARGS)

# What a fleet-wide tool limit costs and how closely it holds: five stacks, the same tool
# uncapped, capped but never bound, capped at 3, at 20/s (and uncapped again), paired rounds.
bench-limits: deps venv
	$(BIN)/baton bench limits $(BENCH_ARGS)

# Months, not minutes: archival keeps Redis, RSS and JetStream flat (slopes printed per stage).
SOAK_ARGS ?=

bench-soak: deps venv
	$(BIN)/baton bench soak $(BENCH_ARGS) $(SOAK_ARGS)

# The same end-to-end figures when every write is fsync'd: Redis, JetStream and the baselines.
bench-durable: deps venv
	$(BIN)/baton bench durable $(BENCH_ARGS)

# The console screenshots in docs/console/ (the docs) come from the browser test.
screenshots: deps venv
	BATON_SCREENSHOTS=docs/console $(BIN)/pytest -q tests/crash/test_console.py

# The docs site: the Markdown pages of docs/ and an API reference made from the public
# docstrings. --strict turns every warning (a broken link, a missing page) into an error.
# griffe reads the sources without importing them, from the role folders' source roots
# (mkdocs.yml's `paths`).

docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

SOURCES := shared brain hands relay examples bench api tests

lint: venv
	$(BIN)/ruff check $(SOURCES)
	$(BIN)/mypy
	scripts/commit-subjects.sh

# The dev lock is constrained by the runtime lock, so the two agree on every shared package.
# pip-compile keeps existing pins that still fit; LOCK_ARGS=--upgrade (or
# --upgrade-package NAME) moves them. No index URLs are written: pip's own configuration applies.
PIP_COMPILE = CUSTOM_COMPILE_COMMAND="make lock" $(BIN)/pip-compile --quiet --allow-unsafe \
	--generate-hashes --strip-extras --no-emit-index-url --no-emit-find-links $(LOCK_ARGS)

lock: venv
	$(PIP_COMPILE) -o $(RUNTIME_LOCK) pyproject.toml
	$(PIP_COMPILE) --extra dev --extra docs -c $(RUNTIME_LOCK) -o $(DEV_LOCK) pyproject.toml

clean:
	rm -rf build dist site .pytest_cache .ruff_cache .mypy_cache bench/results
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
	find . -path ./$(VENV) -prune -o -name '*.egg-info' -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf "$(VENV)"
