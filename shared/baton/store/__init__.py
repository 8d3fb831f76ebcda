"""The session store: Redis keys, documented Lua transitions, the outbox, documents, runs.

Everything that writes Redis goes through :class:`Store` (session transitions and reads)
and :class:`Outbox` (the relay's side); key names come from :mod:`baton.store.keys` only.
"""
