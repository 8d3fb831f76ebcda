"""The mail service of ``bench limits`` (baton.bench.timed_mailbox) lists its deliveries'
times in ``/stats``, on its own clock, beside its counts; ``/reset`` clears them."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx

from baton.bench.timed_mailbox import TimedMailbox


async def test_the_stats_list_each_deliverys_time_and_reset_clears_them() -> None:
    async with TimedMailbox() as mailbox, httpx.AsyncClient(base_url=mailbox.url) as http:
        before = datetime.now(UTC).timestamp() * 1000
        for k in range(3):
            mail = {"to": f"c{k}@example.com", "subject": "s", "body": "b"}
            sent = await http.post("/send", json=mail, headers={"Idempotency-Key": f"op-{k}"})
            assert sent.status_code == 200
        again = await http.post("/send", json={"to": "c0@example.com", "subject": "s",
                                               "body": "b"}, headers={"Idempotency-Key": "op-0"})
        assert again.json()["duplicate"] is True
        stats = (await http.get("/stats")).json()
        after = datetime.now(UTC).timestamp() * 1000
        times = stats["delivered_at_ms"]
        assert stats["accepted"] == len(times) == 3  # deliveries, not requests
        assert times == sorted(times) and before - 1 <= times[0] <= times[-1] <= after + 1
        assert stats["max_in_flight"] >= 1
        await http.post("/reset")
        assert (await http.get("/stats")).json()["delivered_at_ms"] == []
