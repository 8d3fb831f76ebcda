"""The in-process peer: the five-notice session as a LangGraph agent with a SQLite checkpointer.

The durable agent in one process that Baton's CPU per step is held against: LangGraph's
canonical tool loop, a ``StateGraph`` over ``MessagesState`` with a model node, the prebuilt
``ToolNode`` (the five calls of a turn run concurrently) and ``tools_condition``, compiled with
``AsyncSqliteSaver`` (its own setup: WAL journal; ``synchronous=OFF`` beside non-durable
servers, no fsync, as the plain loop's log then; ``synchronous=FULL``, an fsync of the journal
at every commit, beside durable ones) and LangGraph's default durability
(``async``: a step's checkpoint is written while the next step runs). The model node plays
the scripted model (the addresses are read from the text, the summary from the tool
messages); ``send_email`` posts to the same mail service through the same client the Hands
give their tools (:func:`baton.hands.http.http_client`), with an ``Idempotency-Key`` of the
thread and the tool call. LangSmith's tracing is off for its sessions, whatever the
environment says (it would add its own cost to the figures).

It does less durable work than Baton for the same session: it checkpoints after each of its
steps (five checkpoints a session), and the five tool results are one write after all five
returned, so a crash during the tool step runs all five again, where Baton commits each
result as it comes. LangGraph recommends a server database over SQLite for production; the
SQLite checkpointer is the in-process case.

Measured in the same run as ``bench e2e`` (sessions/s, latency and this process's CPU per
session, the mail service's apart), so that "below in-process LangGraph" is a figure of the
run, not a number from elsewhere. LangGraph is not a dependency of Baton: it comes with the
``peers`` extra (``pip install '.[peers]'`` from a checkout; the dev set, which ``make bench``
installs, has it), and without it the comparison is skipped with that hint.
"""

# No `from __future__ import annotations`: LangGraph reads the tool's annotations at run time
# (its injected config and call id), which must be objects, not strings.

import contextlib
import re
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

from baton.bench.baselines import Baseline
from baton.bench.common import Row
from baton.hands.http import http_client
from baton.settings import Settings

__all__ = ["INSTALL_HINT", "LangGraphAgent", "available", "figures", "measure", "opened"]

INSTALL_HINT = ("`make bench` installs it; elsewhere `pip install '.[peers]'` from a checkout "
                "(langgraph, langgraph-checkpoint-sqlite)")
MODE = "LangGraph (SQLite)"

_ADDRESS = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+\w")


def available() -> bool:
    """Whether LangGraph and its SQLite checkpointer can be imported here."""
    try:
        import langgraph.checkpoint.sqlite.aio
        import langgraph.prebuilt  # noqa: F401
    except ImportError:
        return False
    return True


class LangGraphAgent:
    """Five-notice sessions as threads of one compiled LangGraph graph (call :meth:`open`)."""

    def __init__(self, mail_url: str) -> None:
        self.http = http_client(Settings.model_fields["connect_timeout_s"].default)
        self.send_url = f"{mail_url}/send"
        self._conn: Any = None
        self._graph: Any = None

    async def open(self, path: Path, *, fsync: bool = False) -> "LangGraphAgent":
        import aiosqlite
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver


        self._conn = await aiosqlite.connect(path)
        await self._conn.execute(f"PRAGMA synchronous={'FULL' if fsync else 'OFF'}")
        saver = AsyncSqliteSaver(self._conn)
        await saver.setup()
        self._graph = self._build(saver)
        return self

    def _build(self, saver: Any) -> Any:
        from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
        from langchain_core.runnables import RunnableConfig
        from langchain_core.tools import InjectedToolCallId, tool
        from langgraph.graph import START, MessagesState, StateGraph
        from langgraph.prebuilt import ToolNode, tools_condition

        http, send_url = self.http, self.send_url

        @tool
        async def send_email(to: str, subject: str, body: str, config: RunnableConfig,
                             tool_call_id: Annotated[str, InjectedToolCallId]) -> dict[str, Any]:
            """Send an email through the mail service (idempotent per thread and call)."""
            thread = config["configurable"]["thread_id"]
            response = await http.post(send_url, json={"to": to, "subject": subject, "body": body},
                                       headers={"Idempotency-Key": f"{thread}-{tool_call_id}"})
            response.raise_for_status()
            result: dict[str, Any] = response.json()
            return result

        def model(state: MessagesState) -> dict[str, Any]:
            last = state["messages"][-1]
            if isinstance(last, HumanMessage):
                calls = [{"name": "send_email", "id": f"call_{k}",
                          "args": {"to": a, "subject": "Notice", "body": "The approved notice."}}
                         for k, a in enumerate(_ADDRESS.findall(str(last.content)))]
                return {"messages": [AIMessage(content="", tool_calls=calls)]}
            results = [m for m in state["messages"] if isinstance(m, ToolMessage)]
            return {"messages": [AIMessage(content="; ".join(
                f"{m.tool_call_id}: {'sent' if m.status == 'success' else 'failed'}"
                for m in results))]}

        graph = StateGraph(MessagesState)
        graph.add_node("model", model)
        graph.add_node("tools", ToolNode([send_email]))
        graph.add_edge(START, "model")
        graph.add_conditional_edges("model", tools_condition)
        graph.add_edge("tools", "model")
        return graph.compile(checkpointer=saver)

    async def session(self, text: str) -> str:
        from langchain_core.messages import HumanMessage
        from langsmith.run_helpers import tracing_context

        thread = uuid.uuid4().hex
        # LangSmith's tracing off whatever the environment says (its env switch is read once
        # and cached; the context's switch wins over it)
        with tracing_context(enabled=False):
            out = await self._graph.ainvoke({"messages": [HumanMessage(content=text)]},
                                            {"configurable": {"thread_id": thread}})
        summary = str(out["messages"][-1].content)
        if "sent" not in summary or "failed" in summary:
            raise RuntimeError(f"LangGraph thread {thread} ended with {summary!r}")
        return summary

    async def close(self) -> None:
        await self.http.aclose()
        if self._conn is not None:
            await self._conn.close()


@contextlib.asynccontextmanager
async def opened(mail_url: str, text: str, *, fsync: bool = False) -> AsyncIterator[Baseline]:
    """The LangGraph agent as a :class:`~baton.bench.baselines.Baseline` of ``text``
    sessions (CPU: ``process``, this process: the graph, its checkpointer's thread, the HTTP
    client), its checkpoints in a temporary directory while it is open; with ``fsync``,
    each checkpoint fsync'd as SQLite commits it."""
    with tempfile.TemporaryDirectory(prefix="baton-langgraph-") as tmp:
        agent = await LangGraphAgent(mail_url).open(Path(tmp) / "checkpoints.sqlite",
                                                    fsync=fsync)
        try:
            yield Baseline(MODE, "five notices, in-process graph",
                           lambda: agent.session(text), "process")
        finally:
            await agent.close()


def figures(per_step: float, c1: Row, c32: Row, peer_rows: dict[int, Row],
            peer_cpu: dict[int, dict[str, float]], *, steps: int, mail_ms: float = float("nan")
            ) -> list[dict[str, Any]]:
    """Baton beside this agent in the same run: CPU per step (the target: below it;
    ``per_step``: Baton's processes and the client that drives the sessions, as this process
    drives its own; ``steps`` per session), and, as figures without a target, sessions/s at
    concurrency 32 and p50 at 1 (``c1``, ``c32``: Baton's rows). ``mail_ms``: the mail
    service's CPU per Baton session. Empty when this agent was not measured."""
    if 32 not in peer_rows or 1 not in peer_rows:
        return []
    peer_step = peer_cpu[32]["process"] / steps
    peer_mail = peer_cpu[32].get("mailbox", float("nan"))
    p1, p32 = peer_rows[1], peer_rows[32]
    return [
        {"figure": f"CPU per step at concurrency 32, Baton's processes and its client / "
                   f"in-process LangGraph's ({steps} steps/session, SQLite checkpointer)",
         "measured": f"{per_step / peer_step:.2f}x ({per_step:.2f} vs {peer_step:.2f} ms; "
                     f"the mail service {mail_ms:.1f} vs {peer_mail:.1f} ms/session apart)",
         "target": "< 1x", "ratio_value": per_step / peer_step, "met": per_step < peer_step},
        {"figure": "five notices sessions/s at concurrency 32 / in-process LangGraph's",
         "measured": f"{c32.ops_per_s / p32.ops_per_s:.2f}x ({c32.ops_per_s:.0f} vs "
                     f"{p32.ops_per_s:.0f}/s)",
         "target": "", "ratio_value": c32.ops_per_s / p32.ops_per_s, "met": True,
         "higher_is_better": True},
        {"figure": "five notices p50 at concurrency 1 / in-process LangGraph's",
         "measured": f"{c1.p50_us / p1.p50_us:.2f}x ({c1.p50_us / 1000:.1f} vs "
                     f"{p1.p50_us / 1000:.1f} ms)",
         "target": "", "ratio_value": c1.p50_us / p1.p50_us, "met": True},
    ]


async def measure(mail_url: str, text: str, levels: list[tuple[int, int, int]],
                  mail_pid: int | None
                  ) -> tuple[dict[int, Row], dict[int, dict[str, float]]]:
    """Sessions/s and latency per (concurrency, total, warmup) in one pass; CPU ms per
    session of this process (``process``) and of the mail service (``mailbox``), apart (the
    mail service is the outside world, the same for every contender)."""
    async with opened(mail_url, text) as baseline:
        await baseline.run(levels, mail_pid)
        return baseline.rows(), baseline.cpu()
