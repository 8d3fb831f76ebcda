"""What the telemetry tests stand in for: a message, the Store's traced methods, a tool
intent, and a sampled parent's ``traceparent``."""

from __future__ import annotations

from typing import Any, NamedTuple

from baton.errors import StaleFenceError
from baton.models import ToolIntent
from baton.observability import tracing
from baton.store.writes import Writes

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class Item(NamedTuple):
    subject: str
    data: bytes
    msg_id: str
    headers: dict[str, str] | None = None


class FakeMsg:
    def __init__(self, headers: dict[str, str] | None, delivered: int = 1) -> None:
        self.headers = headers
        self.subject = "t.tool.send_email"

        class Meta:
            num_delivered = delivered

        self.metadata = Meta()


class FakeStore:
    """The Store methods' signatures, decorated like the real ones."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    @tracing.traced_commit
    async def commit(self, session_id: str, fence: int, writes: Writes, worker: Any) -> Any:
        if fence < 0:
            raise StaleFenceError(session_id, fence, 7)
        self.seen.append(writes)
        return 3, 1

    @tracing.traced_submit("submit")
    async def submit(self, session_id: str, *, request_id: str, wake_subject: str,
                     headers: dict[str, str] | None = None) -> Any:
        self.seen.append(headers)
        return "sub", True


def intent(run_id: str = "r-1") -> ToolIntent:
    return ToolIntent(run_id=run_id, session_id="s-1", task_id="gen-1", tool="send_email",
                      operation_id=f"s-1:{run_id}", wake_subject="t.wake.a.1")
