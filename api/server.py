"""Serve the API with uvicorn: `inflight api [--host] [--port] [--workers N]`.

One worker serves `create_app(settings)` directly. Several workers (processes sharing the
port) each build their app from the environment (`api.app:app_from_env`), so the settings
must come from INFLIGHT_* variables, which is what the CLI reads anyway.
"""

from __future__ import annotations

import copy
import logging

import uvicorn
import uvicorn.config

from inflight.api.app import create_app
from inflight.schemas import Settings

log = logging.getLogger("inflight.api")


def _log_config() -> dict:
    """uvicorn's logging with its start-up lines left out (the API says what it serves in
    one line of its own); its warnings, errors and the access log (--access-log) stay."""
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["loggers"]["uvicorn.error"]["level"] = "WARNING"
    return config


def serve(settings: Settings, host: str = "127.0.0.1", port: int = 8000, *, workers: int = 1,
          access_log: bool = False) -> None:
    log.info("api: serving on http://%s:%d (workers=%d, auth=%s, OpenAPI at /openapi.json)",
             host, port, workers, "on" if settings.api_auth else "OFF")
    common = {"host": host, "port": port, "access_log": access_log, "log_level": None,
              "log_config": _log_config(), "proxy_headers": False, "server_header": False}
    if workers > 1:
        uvicorn.run("inflight.api.app:app_from_env", factory=True, workers=workers, **common)
    else:
        uvicorn.run(create_app(settings), **common)
