"""Tools shipped with Baton: ``send_email`` (replay confirm), ``http_get`` (replay safe), and
for task-driven delivery ``deliver_notice`` (unsafe) with ``lookup_notice`` (safe)."""

from baton.hands.tools.email import send_email
from baton.hands.tools.http import http_get
from baton.hands.tools.notice import deliver_notice, lookup_notice

__all__ = ["deliver_notice", "http_get", "lookup_notice", "send_email"]
