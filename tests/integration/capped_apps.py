"""The notices example with its mail tool limited for the whole fleet: ``app`` at most 3
sends at once across every Hands (``max_concurrency=3``), ``rated_app`` at most 20 sends a
second (``rate="20/s"``). Importable by module path, so Hands processes started by the
tests serve them: ``tests.integration.capped_apps:app``."""

from __future__ import annotations

from baton import App, Tool
from baton.examples.notices import notices
from baton.hands.tools import send_email

CAP = 3

capped_email = Tool(send_email.fn, name="send_email", replay="confirm", timeout=30.0,
                    max_concurrency=CAP)
assert send_email.confirm_fn is not None
capped_email.confirm(send_email.confirm_fn)

app = App(agents=[notices], tools=[capped_email])

RATE = 20.0

rated_email = Tool(send_email.fn, name="send_email", replay="confirm", timeout=30.0,
                   rate=f"{RATE:g}/s")
rated_email.confirm(send_email.confirm_fn)

rated_app = App(agents=[notices], tools=[rated_email])
