"""``baton accept-loss``: after Redis lost some shards' state, let the workers start again.

A shard whose epoch key is missing lost its sessions with it (Redis restarted empty, a
primary failed over to a replica without its data, a FLUSHALL). Every worker of the
namespace then stops with a StoreEpochError rather than take the empty shard for a new one,
and keeps stopping at each restart (:mod:`baton.store.epoch`). Once an operator has looked
(and put back what a backup could), this command writes the surviving epoch to the shards
that lost it. That accepts the loss: the sessions that lived on those shards are gone for
good, and the workers start again. It only adds keys that are missing (``SETNX``), with the
credential of any role, and refuses when the shards that kept their epoch disagree (the
store was initialised twice: there is no one epoch to restore).
"""

from __future__ import annotations

from typing import Any

import click

from baton.cli.common import confirmed, emit, json_option, note, run, settings
from baton.cli.failures import CliError

__all__ = ["accept_loss"]


@click.command("accept-loss")
@click.option("--yes", is_flag=True, help="accept the loss without asking")
@json_option("what was found and done")
def accept_loss(yes: bool, as_json: bool) -> None:
    """Accept that shards lost their state: restore their epoch so workers start again.

    The sessions of those shards are gone; nothing that exists is changed.
    """
    from baton.store.epoch import StoreEpoch
    from baton.store.store import Store

    config = settings(log_level="warning")

    async def go() -> None:
        store = await Store.connect(config)
        try:
            survey = await StoreEpoch.survey(store.redis, store.keys)
            view: dict[str, Any] = {"namespace": config.namespace, "state": survey.state,
                                    "epoch": survey.id or None,
                                    "missing_shards": list(survey.missing), "restored": []}
            if survey.state in ("ok", "new"):
                emit(as_json, view, f"nothing to do: the store of namespace "
                     f"{config.namespace} is {'whole' if survey.state == 'ok' else 'new'}")
                return
            if survey.state == "mixed" or survey.differing:
                raise CliError(
                    f"the shards of namespace {config.namespace} that kept an epoch disagree "
                    f"(shards {', '.join(map(str, survey.differing))} differ from "
                    f"{survey.id}): the store was initialised twice; nothing restored")
            lost = ", ".join(map(str, survey.missing))
            note(f"shard(s) {lost} of namespace {config.namespace} lost their state: the "
                 f"sessions that lived there are gone. Restoring epoch {survey.id} there lets "
                 "every worker start again.")
            if not yes and as_json:  # a script reads the answer: nobody is there to ask
                raise CliError(f"shard(s) {lost} lost their state; accepting it needs --yes "
                               "with --json (nothing is asked)")
            if not yes and not confirmed("accept the loss?"):
                raise CliError("the loss was not accepted; nothing restored")
            # SETNX: a shard written meanwhile is left alone
            restored = await StoreEpoch.restore(store.redis, store.keys, survey)
            if restored is None:
                raise CliError("the store changed while this ran; run it again")
            view["restored"] = restored
            emit(as_json, view, f"epoch {survey.id} restored on shard(s) "
                 f"{', '.join(map(str, view['restored'])) or 'none'}; workers start again "
                 "(supervised ones by themselves, others when restarted)")
        finally:
            await store.close()

    run(go())
