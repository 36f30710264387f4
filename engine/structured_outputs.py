"""What a request's output must match: `SamplingParams.structured_outputs`, vLLM's names.

Exactly one of:

    {"json": SCHEMA}              a JSON Schema (an object, or its JSON text)
    {"json_object": true}         any JSON object
    {"regex": "..."}              the whole output matches the regular expression (Rust syntax)
    {"choice": ["a", "b", ...]}   the output is one of the strings
    {"grammar": "..."}            a context-free grammar: Lark syntax (llguidance's dialect,
                                  `start: ...`) or GBNF/EBNF (`root ::= ...`, as llama.cpp
                                  and vLLM's xgrammar take it)
    {"structural_tag": TAG}       free text in which a trigger string starts a constrained
                                  segment (tool calls); see below

A structural tag (vLLM's `structures` + `triggers` form):

    {"structures": [{"begin": "<tool_call>\\n{\\"name\\": \\"f\\", \\"arguments\\": ",
                     "schema": {...}, "end": "}\\n</tool_call>"}],
     "triggers": ["<tool_call>"], "at_least_one": false, "stop_after_first": false}

Each `begin` starts with one of the `triggers`. Text is free until a trigger appears; from
there the segment is `begin`, JSON matching `schema`, `end`. With `at_least_one` (xgrammar's
name) the output is segments only, one or more (newlines between them); with
`stop_after_first`, at most one segment.

This module imports nothing heavy: the wire validates requests with it. The check of a
grammar's own syntax (`check`) asks the grammar engine (llguidance, imported on first use)
without a tokenizer, so a bad schema is refused at the edge with the compiler's message;
the engine compiles it for its tokenizer later, off its thread (engine/grammar.py).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any

from inflight.engine.errors import ERR_INVALID_REQUEST, ERR_INVALID_SCHEMA, InflightError

KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")
MAX_SPEC_CHARS = 65_536      # a schema / regex / grammar's JSON text
MAX_CHOICES = 1024
MAX_CHOICE_CHARS = 1024


class StructuredOutputsError(InflightError, ValueError):
    """`structured_outputs` is malformed (`code` "invalid_request") or its schema / regex /
    grammar does not compile ("invalid_schema", with the compiler's message); `field` names
    the part, as SamplingParamsError does."""

    def __init__(self, message: str, field: str | None = None, code: str = ERR_INVALID_REQUEST):
        super().__init__(message)
        self.field = field
        self.code = code


@dataclass(frozen=True)
class StructuredOutputs:
    """One output constraint (see the module doc). Built from JSON by the wire, or in Python:
    `StructuredOutputs(json={"type": "object", ...})`, `StructuredOutputs(choice=("a", "b"))`."""

    __pydantic_config__ = {"extra": "forbid", "strict": False}

    json: dict[str, Any] | str | None = None
    json_object: bool | None = field(default=None, metadata={"strict": True})
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    structural_tag: dict[str, Any] | str | None = None

    def __post_init__(self) -> None:
        given = [k for k in KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            what = "none" if not given else " and ".join(given)
            raise StructuredOutputsError(f"set exactly one of {', '.join(KINDS)} (got {what})",
                                         given[-1] if given else None)
        kind = given[0]
        value = getattr(self, kind)
        if kind in ("json", "structural_tag"):
            object.__setattr__(self, kind, _json_object(value, kind))
        elif kind == "json_object":
            if value is not True:
                raise StructuredOutputsError("must be true (leave structured_outputs out for "
                                             "unconstrained text)", kind)
        elif kind in ("regex", "grammar"):
            if not isinstance(value, str) or not value or len(value) > MAX_SPEC_CHARS:
                raise StructuredOutputsError(f"must be a string of 1..{MAX_SPEC_CHARS} characters", kind)
        else:
            object.__setattr__(self, "choice", _choices(value))
        if kind == "structural_tag":
            _check_tag(self.structural_tag)
        error = check(self.kind, self.key)
        if error:
            raise StructuredOutputsError(f"does not compile: {error}", kind, ERR_INVALID_SCHEMA)

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) is not None)

    @property
    def key(self) -> str:
        """The constraint as compact text: the compile cache's key, with the kind. Keys keep
        their order: a schema's property order is the order the output writes them in."""
        value = getattr(self, self.kind)
        if isinstance(value, str) and self.kind in ("regex", "grammar"):
            return value
        return json.dumps(list(value) if isinstance(value, tuple) else value,
                          separators=(",", ":"), ensure_ascii=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: only the one kind that is set."""
        value = getattr(self, self.kind)
        return {self.kind: list(value) if isinstance(value, tuple) else value}


def _json_object(value: Any, kind: str) -> dict[str, Any]:
    if isinstance(value, str):
        if len(value) > MAX_SPEC_CHARS:
            raise StructuredOutputsError(f"is {len(value)} characters; at most {MAX_SPEC_CHARS}", kind)
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise StructuredOutputsError(f"is a string but not JSON: {exc}", kind) from None
    if not isinstance(value, dict):
        raise StructuredOutputsError(f"must be a JSON object (got {type(value).__name__})", kind)
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StructuredOutputsError(f"is not plain JSON: {exc}", kind) from None
    if len(text) > MAX_SPEC_CHARS:
        raise StructuredOutputsError(f"is {len(text)} characters of JSON; at most {MAX_SPEC_CHARS}", kind)
    return value


def _choices(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise StructuredOutputsError("must be a list of strings", "choice")
    if not 1 <= len(value) <= MAX_CHOICES:
        raise StructuredOutputsError(f"has {len(value)} entries; give 1..{MAX_CHOICES}",
                                     "choice")
    for i, c in enumerate(value):
        if not isinstance(c, str) or not 1 <= len(c) <= MAX_CHOICE_CHARS:
            raise StructuredOutputsError(f"entry {i} ({c!r:.60}) must be a string of 1.."
                                         f"{MAX_CHOICE_CHARS} characters", f"choice.{i}")
    return tuple(value)


def _check_tag(tag: dict[str, Any]) -> None:
    f = "structural_tag"
    unknown = sorted(set(tag) - {"type", "structures", "triggers", "at_least_one",
                                 "stop_after_first"})
    if unknown:
        raise StructuredOutputsError(f"unknown key(s) {unknown}; use structures, triggers, "
                                     "at_least_one, stop_after_first", f"{f}.{unknown[0]}")
    if tag.get("type", "structural_tag") != "structural_tag":
        raise StructuredOutputsError("must be 'structural_tag'", f"{f}.type")
    triggers, structures = tag.get("triggers"), tag.get("structures")
    if not (isinstance(triggers, list) and triggers
            and all(isinstance(t, str) and t for t in triggers)):
        raise StructuredOutputsError("must be a non-empty list of strings",
                                     f"{f}.triggers")
    if not (isinstance(structures, list) and structures):
        raise StructuredOutputsError("must be a non-empty list", f"{f}.structures")
    for i, s in enumerate(structures):
        where = f"{f}.structures.{i}"
        if not (isinstance(s, dict) and set(s) <= {"begin", "schema", "end"}
                and isinstance(s.get("begin"), str) and isinstance(s.get("end", ""), str)
                and isinstance(s.get("schema"), dict)):
            raise StructuredOutputsError("give {'begin': str, 'schema': {...}, 'end': str}", where)
        if not any(s["begin"].startswith(t) for t in triggers):
            raise StructuredOutputsError(f"{s['begin']!r:.60} starts with none of the triggers "
                                         f"{triggers}", f"{where}.begin")
    for flag in ("at_least_one", "stop_after_first"):
        if not isinstance(tag.get(flag, False), bool):
            raise StructuredOutputsError("must be true or false", f"{f}.{flag}")


@functools.lru_cache(maxsize=512)
def check(kind: str, key: str) -> str:
    """The grammar engine's complaint about a constraint ("" when it compiles), without a
    tokenizer. Cached: the same schema on many requests is checked once."""
    try:
        from inflight.engine.grammar import grammar_text, validate
    except ImportError as exc:  # a checkout whose environment predates the dependency
        return f"the grammar engine is not installed ({exc}): pip install llguidance"
    try:
        return validate(grammar_text(kind, key))
    except Exception as exc:  # noqa: BLE001 - the GBNF converter raises plain Exception
        return str(exc) or type(exc).__name__
