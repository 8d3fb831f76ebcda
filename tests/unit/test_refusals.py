"""A store that refuses a write for now (a failover, the split-brain guard, a demoted
primary) is retryable everywhere, and the sentence a refused write ends in names its shard."""

from __future__ import annotations

import pytest
import redis.exceptions as rex

from baton.errors import BatonError, RedisUnavailable, WriteInDoubtError, from_redis_error
from baton.store.replication import refused_for_now, where

REFUSALS = [
    rex.ResponseError("NOREPLICAS Not enough good replicas to write."),
    rex.ResponseError("NOREPLICAS Not enough good replicas to write. script: 0123, on "
                      "@user_script:377."),  # the guard met at a script's first write
    rex.ClusterDownError("The cluster is down"),
    rex.MasterDownError("Link with MASTER is down and replica-serve-stale-data is set to 'no'."),
    rex.TryAgainError("Multiple keys request during rehashing of slot"),
    rex.ReadOnlyError("You can't write against a read only replica."),
    rex.BusyLoadingError("Redis is loading the dataset in memory"),
]


@pytest.mark.parametrize("reply", REFUSALS, ids=lambda e: type(e).__name__)
def test_a_write_refused_for_now_is_retryable_and_never_in_doubt(reply: Exception) -> None:
    assert refused_for_now(reply)
    mapped = from_redis_error(reply, session_id="s1")
    assert isinstance(mapped, RedisUnavailable) and mapped.retryable, mapped


def test_other_replies_are_not_refusals() -> None:
    assert not refused_for_now(rex.ResponseError("ERR unknown command"))
    assert not refused_for_now(rex.ConnectionError("Connection closed by server."))
    assert not refused_for_now("OK")
    assert not from_redis_error(rex.ResponseError("ERR unknown command")).retryable


def test_the_shard_in_words() -> None:
    assert where(None, "") == ""
    assert where(12, "") == " (slot 12)"
    assert where(12, "10.0.0.3:6379") == " (slot 12 on 10.0.0.3:6379)"
    doubt = WriteInDoubtError("commit", session_id="s1", commit_id="c1", wanted=1,
                              reason="connection lost", slot=12, node="10.0.0.3:6379")
    assert doubt.message.startswith("commit of session s1 (slot 12 on 10.0.0.3:6379) is in "
                                    "doubt (commit c1): connection lost;"), doubt.message
    assert doubt.to_dict()["slot"] == 12 and isinstance(doubt, BatonError)
