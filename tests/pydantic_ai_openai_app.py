"""``app``: the PydanticAI five-notice agent over the OpenAI wire, for a crash stack's
processes (``--app tests.pydantic_ai_openai_app:app``)."""

from tests.pydantic_ai_apps import openai_notices_app

app = openai_notices_app()
