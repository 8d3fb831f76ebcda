"""Adversarial text: the CPU that 1 MB of hostile input costs on every text-processing path.

No input may make a worker spin: a quadratic pattern on a submission stalls a Brain and
every session behind it. Each path is fed 1 MiB of text built to hurt it: one long run of
address characters (the classic regex blow-up), local parts that end in ``@`` again and
again, a domain of one-letter labels, 50,000 distinct addresses, only ``@``, deep JSON
nesting, multi-byte characters, whitespace and newlines, quotes and backslashes. Paths:

* ``find_emails``: the scripted model's address finder;
* ``scripted model``: a whole scripted generation over a request holding the text;
* ``log bounding``: ``bounded`` plus the structlog backstop on a field holding the text;
* ``tool arguments``: the approval digest, the tool's argument validation and a ToolIntent
  JSON round trip with the text as the mail body;
* ``model output``: an OpenAI and an Anthropic response carrying the text as content and as
  tool-call arguments (valid JSON around it, and the raw text as invalid arguments), parsed
  as the HTTP clients parse them;
* ``submission``: ``Client.submit`` of the text (just under the payload limit) into a real
  Redis, with the server's CPU per submit.

Figures, not assertions (a timed test on a loaded machine proves nothing): CPU ms per call
per path and input, in a table and ``bench/results/adversarial.json``.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from baton.bench.common import Result, environment, percentile, process_cpu_s
from baton.brain.anthropic_messages import AnthropicClient
from baton.brain.model import ModelRequest
from baton.brain.model_http import parse_json
from baton.brain.openai_chat import OpenAIClient
from baton.brain.scripted import ScriptedModel, find_emails
from baton.errors import BatonError
from baton.examples.notices import app
from baton.models import Entry, ToolIntent, decode
from baton.observability.log import bound_long_strings, bounded
from baton.settings import Settings
from baton.store.control import args_digest

NAME = "adversarial"
DESCRIPTION = "CPU per 1 MiB of hostile text on every text path (regex, logs, tools, models)"

MIB = 1024 * 1024


def _fill(unit: str, size: int = MIB) -> str:
    return (unit * (size // len(unit) + 1))[:size]


def inputs(size: int = MIB) -> dict[str, str]:
    """The hostile texts, each ``size`` characters."""
    many = " ".join(f"u{i}@example.com" for i in range(size // 16))[:size]
    return {
        "address run": _fill("a", size),
        "local parts + @": _fill("a" * 63 + "@", size),
        "one-letter labels": "x@" + _fill("a.", size - 2),
        "50k addresses": many,
        "only @": _fill("@", size),
        "json nesting": _fill("[", size),
        "multi-byte": _fill("é✓😀", size),
        "whitespace": _fill(" \n\t", size),
        "quotes + backslashes": _fill('\\"', size),
    }


# ---------------------------------------------------------------------- the paths


def _scripted(text: str) -> Callable[[], object]:
    tools = (app.tools["send_email"].schema(),)
    request = ModelRequest(model="scripted", entries=(Entry(kind="user", text=text),),
                           tools=tools, request_id="r-1")
    model = ScriptedModel()
    return lambda: model.generate(request)  # a coroutine: awaited by the timing loop


def _logs(text: str) -> Callable[[], object]:
    def run() -> object:
        bound_long_strings(None, "info", {"event": "x", "error": text, "body": bounded(text)})
        return bounded(text)
    return run


def _tool_args(text: str) -> Callable[[], object]:
    tool = app.tools["send_email"]
    args = {"to": "ada@example.com", "subject": "Notice", "body": text}

    def run() -> object:
        digest = args_digest("send_email", args)
        try:
            tool.parse_args(args)
        except BatonError:
            pass
        intent = ToolIntent(run_id="r-1", session_id="s-1", task_id="t-1", tool="send_email",
                            arguments=args, operation_id="op-1", replay="confirm",
                            wake_subject="w", created_ms=1, approval_digest=digest)
        return decode(ToolIntent, intent.model_dump_json())
    return run


def _model_output(text: str) -> Callable[[], object]:
    # Only their response parsing runs: no request is ever sent, so no real key or server.
    settings = Settings(openai_base_url="http://127.0.0.1:9/v1", anthropic_api_key="unused")
    openai = OpenAIClient("gpt-x", settings, compatible=True)
    anthropic = AnthropicClient("claude-x", settings)
    good_args = json.dumps({"to": "ada@example.com", "body": text})
    chat = json.dumps({"choices": [{"message": {"content": text, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "send_email",
                                                      "arguments": good_args}}]},
        "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 1}}).encode()
    bad = json.dumps({"choices": [{"message": {"content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "send_email",
                                                      "arguments": text}}]},
        "finish_reason": "tool_calls"}]}).encode()
    messages = json.dumps({"type": "message", "content": [
        {"type": "text", "text": text},
        {"type": "tool_use", "id": "t1", "name": "send_email",
         "input": {"to": "ada@example.com", "body": text}}],
        "usage": {"input_tokens": 1, "output_tokens": 1}, "stop_reason": "tool_use"}).encode()

    def run() -> object:
        openai.answer(parse_json("openai", chat))
        try:
            openai.answer(parse_json("openai", bad))
        except BatonError:
            pass  # arguments that are not JSON: a clear model error, no spin
        return anthropic.answer(parse_json("anthropic", messages))
    return run


PATHS: dict[str, Callable[[str], Callable[[], object]]] = {
    "find_emails": lambda text: lambda: find_emails(text),
    "scripted model": _scripted,
    "log bounding": _logs,
    "tool arguments": _tool_args,
    "model output": _model_output,
}


@dataclass(frozen=True)
class Config:
    reps: int = 5
    submits: int = 5


QUICK = Config(reps=1, submits=1)


async def _cpu(fn: Callable[[], object], reps: int) -> tuple[list[float], float]:
    """CPU ms of each of ``reps`` calls (awaited when they return a coroutine), and the
    wall ms of the slowest."""
    cpu, worst = [], 0.0
    for _ in range(reps):
        c0, w0 = time.process_time(), time.perf_counter()
        out = fn()
        if inspect.isawaitable(out):
            await out
        cpu.append((time.process_time() - c0) * 1000)
        worst = max(worst, (time.perf_counter() - w0) * 1000)
    return cpu, worst


async def _submissions(texts: dict[str, str], n: int) -> list[dict[str, Any]]:
    """``Client.submit`` of each text (cut to fit the payload limit) into a real Redis."""
    from baton.client import Client
    from baton.devkit.servers import RedisServer

    rows = []
    async with RedisServer() as server:
        settings = Settings(redis_url=server.url, namespace="advbench")
        limit = settings.max_payload_bytes
        async with await Client.connect(settings) as client:
            for name, text in texts.items():
                body = fit_submission("x" + text, limit)  # "x": never blank
                cpu, server_cpu, wall = [], [], []
                for _ in range(n):
                    s0 = process_cpu_s(server.pid)
                    c0, w0 = time.process_time(), time.perf_counter()
                    await client.submit(body, agent="notices")
                    cpu.append((time.process_time() - c0) * 1000)
                    wall.append((time.perf_counter() - w0) * 1000)
                    server_cpu.append((process_cpu_s(server.pid) - s0) * 1000)
                rows.append({"path": "submission", "input": name, "bytes": len(body.encode()),
                             "n": n, "cpu_ms_p50": percentile(cpu, 50),
                             "cpu_ms_max": max(cpu), "wall_ms_max": max(wall),
                             "server_cpu_ms_p50": percentile(server_cpu, 50)})
    return rows


def fit_submission(text: str, limit: int) -> str:
    """The longest prefix of ``text`` a submission takes: its user entry's JSON (escapes
    included, plus ids and a timestamp) within ``limit``."""
    margin = 256  # the entry's ids, timestamp and field names

    def size(t: str) -> int:
        return len(Entry(kind="user", text=t).to_json()) + margin

    if size(text) <= limit:
        return text
    lo, hi = 0, len(text)  # size(text[:lo]) fits, size(text[:hi]) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if size(text[:mid]) <= limit else (lo, mid)
    return text[:lo]


async def run(quick: bool = False, console: Console | None = None) -> Result:
    console = console or Console()
    config = QUICK if quick else Config()
    texts = inputs()
    rows: list[dict[str, Any]] = []
    for path, build in PATHS.items():
        for name, text in texts.items():
            if path == "scripted model" and name == "50k addresses" and quick:
                continue  # 50k tool calls: minutes of model objects on a smoke run
            fn = build(text)
            cpu, worst = await _cpu(fn, config.reps)
            rows.append({"path": path, "input": name, "bytes": len(text.encode()),
                         "n": config.reps, "cpu_ms_p50": percentile(cpu, 50),
                         "cpu_ms_max": max(cpu), "wall_ms_max": worst})
    rows += await _submissions(texts, config.submits)

    table = Table(title="CPU per call on 1 MiB of hostile text (ms)", title_justify="left")
    for col in ("path", "input", "bytes", "n", "CPU p50", "CPU max", "wall max",
                "server CPU p50"):
        table.add_column(col, justify="left" if col in ("path", "input") else "right")
    last = ""
    for r in rows:
        if last and r["path"] != last:
            table.add_section()
        last = r["path"]
        server = r.get("server_cpu_ms_p50")
        table.add_row(r["path"], r["input"], f"{r['bytes']:,}", str(r["n"]),
                      f"{r['cpu_ms_p50']:,.1f}", f"{r['cpu_ms_max']:,.1f}",
                      f"{r['wall_ms_max']:,.1f}", "" if server is None else f"{server:,.1f}")
    console.print(table)
    slowest = max(rows, key=lambda r: r["cpu_ms_max"])
    console.print(f"worst: {slowest['path']} on {slowest['input']}: "
                  f"{slowest['cpu_ms_max']:,.0f} ms CPU for 1 MiB")
    return Result(name=NAME, rows=[], env=environment(),
                  extra={"config": asdict(config),
                         "figures": rows,
                         "worst": {k: slowest[k] for k in ("path", "input", "cpu_ms_max")}})
