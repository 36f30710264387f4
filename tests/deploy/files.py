"""Reading the deployment files as the tools would: compose with `${VAR:-default}`
interpolated to its defaults, the Dockerfile's instructions."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"

_VAR = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def interpolate(text: str) -> str:
    """Compose interpolation with nothing set in the environment: `${X:-d}` -> d, `${X}` -> ''."""
    return _VAR.sub(lambda m: m.group(2) or "", text)


def load_compose(text: str | None = None) -> dict[str, Any]:
    return yaml.safe_load(interpolate(COMPOSE.read_text() if text is None else text))


def inflight_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Services that run our image (their command is an `inflight` subcommand)."""
    return {name: svc for name, svc in compose["services"].items()
            if str(svc.get("image", "")).startswith("inflight:")}


def dockerfile_instructions(text: str | None = None) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = DOCKERFILE.read_text() if text is None else text
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines()
                                             if not line.lstrip().startswith("#")))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


INFLIGHT_NAME = re.compile(r"\bINFLIGHT_[A-Z0-9_]+\b")
