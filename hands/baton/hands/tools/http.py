"""``http_get``: fetch a URL. Reading has no outside effect, so replay is ``safe``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from baton.app import ToolContext, tool
from baton.errors import ToolError


class HttpGetArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(pattern=r"^https?://", description="http(s) URL to fetch")
    max_bytes: int = Field(default=16_384, ge=1, le=1_048_576)


@tool(replay="safe", timeout=15.0)
async def http_get(args: HttpGetArgs, ctx: ToolContext) -> dict[str, Any]:
    """Fetch a URL with GET and return its status and (truncated) text."""
    try:
        response = await ctx.http.get(args.url, follow_redirects=True)
    except ToolError:  # the shared client's bounds (too large, past the deadline): as they are
        raise
    except Exception as exc:
        raise ToolError(f"GET {args.url} failed: {exc}", code="http_error") from None
    text = response.text
    return {"status": response.status_code, "text": text[: args.max_bytes],
            "truncated": len(text) > args.max_bytes}
