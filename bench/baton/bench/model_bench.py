"""Model transports: the built-in HTTP clients beside the official SDKs used as transports.

Both sides get the same request (the built-in clients' own body: the same messages, tools and
token limit) from a local server in another process (:mod:`baton.bench.model_server`) that
answers like the providers (a fixed answer: 60 streamed text deltas and one tool call, or the
same as one JSON body), so what differs is only the transport: httpx + Baton's SSE reader
against ``openai.AsyncOpenAI`` / ``anthropic.AsyncAnthropic`` (``max_retries=0``: Baton
retries durably, an SDK's in-process retries would hide attempts from the receipts and the
trace).

* **CPU per call**: this process's CPU time (the server's is not counted), median of rounds,
  streamed (each delta handed to a sink, as the Brain does) and JSON.
* **Import**: CPU of ``python -c 'import ...'``: the built-in clients, then with both SDKs
  as well (every Brain pays it at start).
* **Conformance**: the answers a provider can give that Baton must classify, each sent to
  both transports: a complete answer with its usage; a stream that ends after the
  finish_reason without ``[DONE]`` or without ``message_stop`` (what a dropped connection
  looks like: must be *retryable*); a stream cut mid-answer; a malformed event (a
  non-retryable *error*); 429 with ``Retry-After`` (retryable with the hint, one request on
  the wire); a 400; a stalled stream (retryable after the read timeout). An SDK adapter maps
  the SDK's exceptions as an integration would (status, connection and timeout errors) and
  adds no end-of-stream checks of its own: the column says what the SDK guarantees.

Figures, not assertions: a table on stdout and ``bench/results/models.json``. The SDKs are
in the ``dev`` extra (``pip install -e '.[dev]'``); Baton itself does not depend on them.
"""

from __future__ import annotations

import asyncio
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from baton.bench.common import Result, Row, environment
from baton.bench.model_server import ARGS, WORDS, Server
from baton.brain.anthropic_messages import AnthropicClient
from baton.brain.model import ModelRequest, ModelResponse, TextSink
from baton.brain.model_http import idempotency_key
from baton.brain.openai_chat import OpenAIClient
from baton.errors import ModelError, ModelRetryableError
from baton.models import Entry, ToolCall, Usage
from baton.settings import Settings

NAME = "models"
DESCRIPTION = ("built-in model clients vs the official openai / anthropic SDKs as transports: "
               "CPU per call, import cost, conformance")
KEY = "bench-key"
CASES = ("ok", "no_end", "cut", "malformed", "429", "400", "stall")
EXPECTED = {"ok": "answer", "no_end": "retryable", "cut": "retryable", "malformed": "error",
            "429": "retryable", "400": "error", "stall": "retryable"}


@dataclass(frozen=True)
class Config:
    calls: int = 200  # per round
    rounds: int = 5
    warmup: int = 20


QUICK = Config(calls=40, rounds=3, warmup=5)


# ---------------------------------------------------------------------- the SDK transports


def _status(provider: str, exc: Any) -> ModelError:
    """An SDK's status error as Baton's (the same classes of status as brain.model_http)."""
    from baton.brain.model_http import RETRYABLE_STATUS, retry_after

    status = int(exc.status_code)
    message = f"{provider} answered {status}: {exc.message}"
    if status in RETRYABLE_STATUS:
        return ModelRetryableError(message, provider=provider, status=status,
                                   retry_after_s=retry_after(exc.response.headers))
    return ModelError(message, provider=provider, status=status)


class SdkOpenAI:
    """Chat Completions through ``openai.AsyncOpenAI`` (the body is the built-in client's)."""

    provider = "openai"

    def __init__(self, base: OpenAIClient, settings: Settings, case_header: dict[str, str]):
        import openai

        self.base, self.settings, self.openai = base, settings, openai
        self.client = openai.AsyncOpenAI(
            api_key=KEY, base_url=base.base_url, max_retries=0,
            timeout=openai.Timeout(settings.model_read_timeout_s,
                                   connect=settings.model_connect_timeout_s),
            default_headers=case_header)

    async def generate(self, request: ModelRequest, on_text: TextSink | None = None,
                       stream: bool = True) -> ModelResponse:
        body = self.base.body(request, stream)
        headers = {"Idempotency-Key": idempotency_key(request, orjson.dumps(body))}
        o = self.openai
        try:
            if not stream:
                r = await self.client.chat.completions.create(**body, extra_headers=headers)
                msg = r.choices[0].message
                calls = tuple(ToolCall(id=c.id, name=c.function.name,
                                       arguments=json.loads(c.function.arguments))
                              for c in msg.tool_calls or ())
                u = r.usage
                return ModelResponse(text=msg.content or "", tool_calls=calls, usage=Usage(
                    input_tokens=u.prompt_tokens if u else 0,
                    output_tokens=u.completion_tokens if u else 0))
            text: list[str] = []
            args: dict[int, dict[str, Any]] = {}
            usage = Usage()
            chunks = await self.client.chat.completions.create(**body, extra_headers=headers)
            async for chunk in chunks:
                if chunk.usage:
                    usage = Usage(input_tokens=chunk.usage.prompt_tokens,
                                  output_tokens=chunk.usage.completion_tokens)
                for choice in chunk.choices:
                    d = choice.delta
                    if d.content:
                        text.append(d.content)
                        if on_text is not None:
                            on_text(d.content)
                    for f in d.tool_calls or ():
                        c = args.setdefault(f.index, {"id": "", "name": "", "args": []})
                        c["id"] = f.id or c["id"]
                        if f.function is not None:
                            c["name"] = f.function.name or c["name"]
                            c["args"].append(f.function.arguments or "")
            calls = tuple(ToolCall(id=c["id"], name=c["name"],
                                   arguments=json.loads("".join(c["args"]) or "{}"))
                          for _, c in sorted(args.items()))
            return ModelResponse(text="".join(text), tool_calls=calls, usage=usage)
        except o.APIStatusError as exc:
            raise _status(self.provider, exc) from None
        except (o.APITimeoutError, o.APIConnectionError) as exc:
            raise ModelRetryableError(f"openai: {exc}", provider=self.provider) from None
        except (ValueError, o.APIResponseValidationError) as exc:
            raise ModelError(f"openai sent a malformed answer: {exc}",
                             provider=self.provider) from None


class SdkAnthropic:
    """Messages through ``anthropic.AsyncAnthropic`` and its stream helper."""

    provider = "anthropic"

    def __init__(self, base: AnthropicClient, settings: Settings,
                 case_header: dict[str, str]) -> None:
        import anthropic

        self.base, self.settings, self.anthropic = base, settings, anthropic
        self.client = anthropic.AsyncAnthropic(
            api_key=KEY, base_url=base.base_url, max_retries=0,
            timeout=anthropic.Timeout(settings.model_read_timeout_s,
                                      connect=settings.model_connect_timeout_s),
            default_headers=case_header)

    async def generate(self, request: ModelRequest, on_text: TextSink | None = None,
                       stream: bool = True) -> ModelResponse:
        body = self.base.body(request, False)
        headers = {"Idempotency-Key": idempotency_key(request, orjson.dumps(body))}
        a = self.anthropic
        try:
            if stream:
                async with self.client.messages.stream(**body, extra_headers=headers) as s:
                    async for text in s.text_stream:
                        if on_text is not None:
                            on_text(text)
                    msg = await s.get_final_message()
            else:
                msg = await self.client.messages.create(**body, extra_headers=headers)
        except a.APIStatusError as exc:
            raise _status(self.provider, exc) from None
        except (a.APITimeoutError, a.APIConnectionError) as exc:
            raise ModelRetryableError(f"anthropic: {exc}", provider=self.provider) from None
        except (ValueError, a.APIResponseValidationError) as exc:
            raise ModelError(f"anthropic sent a malformed answer: {exc}",
                             provider=self.provider) from None
        text = "".join(b.text for b in msg.content if b.type == "text")
        calls = tuple(ToolCall(id=b.id, name=b.name, arguments=dict(b.input))
                      for b in msg.content if b.type == "tool_use")
        return ModelResponse(text=text, tool_calls=calls, usage=Usage(
            input_tokens=msg.usage.input_tokens, output_tokens=msg.usage.output_tokens))


# ---------------------------------------------------------------------- measuring

Call = Callable[[], Awaitable[ModelResponse]]


def _request() -> ModelRequest:
    call = ToolCall(id="call_9", name="send_email", arguments=ARGS)
    entries = (Entry(kind="user", text="Send the notice to ada@example.com."),
               Entry(kind="model", text="Sending.", tool_calls=(call,)),
               Entry(kind="tool_result", text='{"outcome": "ok"}', tool_call_id="call_9"),
               Entry(kind="user", text="And again, please."))
    return ModelRequest(model="bench", instructions="Be brief.", entries=entries,
                        request_id="bench:1:0", logical_id="bench:1",
                        tools=({"name": "send_email", "description": "Send one e-mail.",
                                "parameters": {"type": "object", "properties": {
                                    "to": {"type": "string"}, "subject": {"type": "string"},
                                    "body": {"type": "string"}}}},))


class Transports:
    """The four clients of one wire (built-in / SDK x streamed / JSON) for one case."""

    def __init__(self, port: int, case: str, read_timeout_s: float = 10.0) -> None:
        base = f"http://127.0.0.1:{port}"
        header = {"x-bench-case": case}

        def settings(stream: bool) -> Settings:
            return Settings(openai_base_url=f"{base}/v1", openai_api_key=KEY,
                            anthropic_base_url=base, anthropic_api_key=KEY,
                            model_stream=stream, model_read_timeout_s=read_timeout_s)
        self.builtin: dict[tuple[str, bool], Any] = {}
        self.sdk: dict[tuple[str, bool], Any] = {}
        for stream in (True, False):
            s = settings(stream)
            oa = OpenAIClient("bench", s, compatible=True)
            an = AnthropicClient("bench", s)
            for c in (oa, an):
                c.http.headers.update(header)
            self.builtin[("openai", stream)] = oa
            self.builtin[("anthropic", stream)] = an
            self.sdk[("openai", stream)] = SdkOpenAI(oa, s, header)
            self.sdk[("anthropic", stream)] = SdkAnthropic(an, s, header)

    def call(self, transport: str, wire: str, stream: bool, sink: TextSink) -> Call:
        request = _request()
        if transport == "built-in":
            client = self.builtin[(wire, stream)]
            return lambda: client.generate(request, on_text=sink)  # type: ignore[no-any-return]
        sdk = self.sdk[(wire, stream)]
        return lambda: sdk.generate(request, on_text=sink, stream=stream)  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        for c in self.builtin.values():
            await c.aclose()
        for c in self.sdk.values():
            await c.client.close()


async def _cpu_per_call(call: Call, cfg: Config) -> tuple[float, float]:
    """(median CPU us per call over the rounds, median wall us per call)."""
    for _ in range(cfg.warmup):
        await call()
    cpu, wall = [], []
    for _ in range(cfg.rounds):
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(cfg.calls):
            await call()
        cpu.append((time.process_time() - c0) / cfg.calls * 1e6)
        wall.append((time.perf_counter() - t0) / cfg.calls * 1e6)
    return statistics.median(cpu), statistics.median(wall)


def _classify(outcome: ModelResponse | BaseException, case: str) -> str:
    if isinstance(outcome, ModelRetryableError):
        hint = f" (Retry-After {outcome.retry_after_s:g}s)" if outcome.retry_after_s else ""
        return "retryable" + hint
    if isinstance(outcome, ModelError):
        return "error"
    if isinstance(outcome, BaseException):
        return f"uncaught {type(outcome).__name__}"
    if not outcome.usage.input_tokens:
        return "answer, usage 0/0"
    return "answer"


async def _conformance(port: int) -> dict[str, dict[str, str]]:
    """case -> "<transport> <wire> <mode>" -> how the answer was classified."""
    out: dict[str, dict[str, str]] = {}
    for case in CASES:
        t = Transports(port, case, read_timeout_s=0.5 if case == "stall" else 10.0)
        row: dict[str, str] = {}
        try:
            for transport in ("built-in", "sdk"):
                for wire in ("openai", "anthropic"):
                    for stream in ((True,) if case in ("no_end", "cut", "malformed", "stall")
                                   else (True, False)):
                        label = f"{transport} {wire} {'sse' if stream else 'json'}"
                        try:
                            got: ModelResponse | BaseException = await asyncio.wait_for(
                                t.call(transport, wire, stream, lambda _: None)(), 20)
                        except Exception as exc:  # classified below
                            got = exc
                        row[label] = _classify(got, case)
        finally:
            await t.aclose()
        out[case] = row
    return out


def _import_cpu_ms(module: str, runs: int) -> float:
    samples = []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", f"import {module}"], check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        samples.append((after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
                       * 1000)
    return statistics.median(samples)


def _passes(case: str, got: str) -> bool:
    return got.split(" (")[0].split(",")[0] == EXPECTED[case] and not (
        case == "429" and "Retry-After 2" not in got)


async def run(quick: bool = False, console: Console | None = None) -> Result:
    cfg = QUICK if quick else Config()
    console = console or Console()
    rows: list[Row] = []
    figures: dict[str, dict[str, float]] = {}
    with Server() as server:
        t = Transports(server.port, "ok")
        try:
            for wire in ("openai", "anthropic"):
                for stream in (True, False):
                    for transport in ("built-in", "sdk"):
                        deltas: list[str] = []
                        call = t.call(transport, wire, stream, deltas.append)
                        check = await call()
                        assert check.tool_calls and check.usage.input_tokens == 120, check
                        cpu, wall = await _cpu_per_call(call, cfg)
                        label = f"{transport} {wire} {'sse' if stream else 'json'}"
                        figures[label] = {"cpu_us": round(cpu), "wall_us": round(wall)}
                        rows.append(Row(mode=transport, operation=f"{wire} "
                                        f"{'sse' if stream else 'json'}", writers=1,
                                        n=cfg.calls * cfg.rounds, p50_us=wall, p99_us=wall,
                                        ops_per_s=1e6 / wall if wall else 0.0,
                                        client_cpu_us=cpu, note="median of rounds"))
        finally:
            await t.aclose()
        conformance = await _conformance(server.port)
    runs = 3 if quick else 7
    clients = "baton.brain.openai_chat, baton.brain.anthropic_messages"
    imports = {label: round(_import_cpu_ms(modules, runs), 1) for label, modules in (
        ("built-in clients", clients), ("built-in clients + openai + anthropic",
                                        f"{clients}, openai, anthropic"))}

    table = Table(title=f"CPU per model call ({WORDS} text deltas + 1 tool call; median of "
                        f"{cfg.rounds} rounds of {cfg.calls})", title_justify="left")
    for col in ("wire", "mode", "built-in CPU us", "SDK CPU us", "SDK / built-in"):
        table.add_column(col, justify="left" if col in ("wire", "mode") else "right")
    for wire in ("openai", "anthropic"):
        for mode in ("sse", "json"):
            b, s = figures[f"built-in {wire} {mode}"], figures[f"sdk {wire} {mode}"]
            table.add_row(wire, mode, f"{b['cpu_us']:,}", f"{s['cpu_us']:,}",
                          f"{s['cpu_us'] / b['cpu_us']:.2f}x")
    console.print(table)
    ctab = Table(title="Conformance: how each answer was classified (expected in brackets)",
                 title_justify="left")
    ctab.add_column("case")
    for label in ("built-in", "sdk"):
        ctab.add_column(label)
    score = {"built-in": [0, 0], "sdk": [0, 0]}
    for case, row in conformance.items():
        cells = {}
        for transport in ("built-in", "sdk"):
            mine = {k: v for k, v in row.items() if k.startswith(transport)}
            ok = [k for k, v in mine.items() if _passes(case, v)]
            score[transport][0] += len(ok)
            score[transport][1] += len(mine)
            bad = {k.split(" ", 1)[1]: v for k, v in mine.items() if k not in ok}
            cells[transport] = (f"{len(ok)}/{len(mine)}"
                                + ("" if not bad else " " + "; ".join(
                                    f"{k}: {v}" for k, v in bad.items())))
        ctab.add_row(f"{case} [{EXPECTED[case]}]", cells["built-in"], cells["sdk"])
    ctab.add_row("total", *(f"{a}/{b}" for a, b in score.values()))
    console.print(ctab)
    console.print("import CPU ms (python -c 'import ...', median): " + ", ".join(
        f"{m} {v}" for m, v in imports.items()))
    return Result(NAME, rows, env=environment(), extra={
        "config": asdict(cfg), "figures": figures, "conformance": conformance,
        "conformance_score": {k: f"{a}/{b}" for k, (a, b) in score.items()},
        "import_cpu_ms": imports,
        "versions": _versions()})


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {p: version(p) for p in ("openai", "anthropic", "httpx")}

