"""Tools shipped with Baton: ``send_email`` (replay confirm) and ``http_get`` (replay safe)."""

from hands.tools.email import send_email
from hands.tools.http import http_get

__all__ = ["http_get", "send_email"]
