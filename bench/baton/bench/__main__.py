"""``baton bench [all | NAME ...] [--quick] [--uvloop] [--json]``: run, print, save JSON.

Also ``python -m baton.bench``. Results go to ``./bench/results/`` of the current directory,
or to ``$BATON_BENCH_RESULTS`` (:data:`baton.bench.common.RESULTS_DIR`).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import json
import sys

from rich.console import Console

from baton.bench import BENCHES
from baton.bench.common import result_json, write_json
from baton.bench.summary import summarize

# The benchmarks whose figures have targets: the summary table and the picture use them.
SUMMARIZED = ("e2e", "durable", "takeover", "history", "cold")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="baton bench", description=__doc__)
    parser.add_argument("names", nargs="*", default=["all"], metavar="NAME",
                        help=f"'all' (default) or any of: {', '.join(BENCHES)}")
    parser.add_argument("--quick", action="store_true", help="fewer samples, for a smoke run")
    parser.add_argument("--uvloop", action="store_true",
                        help="run on uvloop instead of the default asyncio loop")
    parser.add_argument("--cluster", action="store_true",
                        help="run the benchmarks that can (soak) on a 3+3 Redis Cluster and "
                             "3 NATS nodes")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--json", action="store_true",
                        help="each result as one JSON line on stdout; tables go to stderr")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n != "all" and n not in BENCHES]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}; known: {', '.join(BENCHES)}")
    return args


async def run_all(names: list[str], quick: bool, console: Console,
                  as_json: bool = False, cluster: bool = False) -> None:
    for name in names:
        module = importlib.import_module(BENCHES[name])
        console.rule(f"{name}: {module.DESCRIPTION}")
        takes_cluster = "cluster" in inspect.signature(module.run).parameters
        result = await (module.run(quick=quick, console=console, cluster=cluster)
                        if takes_cluster else module.run(quick=quick, console=console))
        path = write_json(result)
        console.print(f"[dim]wrote {path}[/dim]")
        if as_json:
            print(json.dumps({**result_json(result), "path": str(path)}, default=str),
                  flush=True)
    if set(names) & set(SUMMARIZED):
        console.rule("summary")
        summarize(console, ran=set(names))


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    # Piped output (make bench | tee) defaults to 80 columns: keep the tables on one line each.
    # With --json the tables go to stderr and stdout carries only the JSON lines.
    out = sys.stderr if args.json else sys.stdout
    console = Console(width=None if out.isatty() else 150, stderr=args.json)
    if args.list:
        for name, module in BENCHES.items():
            description = importlib.import_module(module).DESCRIPTION
            if args.json:
                print(json.dumps({"name": name, "description": description}))
            else:
                console.print(f"{name}: {description}")
        return 0
    names = list(BENCHES) if "all" in args.names else list(dict.fromkeys(args.names))
    if args.uvloop:
        import uvloop  # optional: not a Baton dependency

        uvloop.install()
    try:
        asyncio.run(run_all(names, args.quick, console, args.json, args.cluster))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
