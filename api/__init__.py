"""The HTTP API (FastAPI): submit, poll, stream and cancel requests; OpenAI-compatible chat
completions, files and batches; Anthropic message batches; API keys.

    from inflight.api import create_app          # an ASGI app; `inflight api` serves it with uvicorn
"""

from inflight.schemas.errors import needs_extra

with needs_extra("api", "inflight.api (the HTTP API)"):
    from inflight.api.app import create_app

__all__ = ["create_app"]
