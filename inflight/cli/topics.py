"""Create the topics of DESIGN.md explicitly (never rely on auto-creation): the CLI's name
for transport.topics_admin (`inflight topics create [--model NAME ...]`, `inflight broker`)."""

from __future__ import annotations

from inflight.transport.topics_admin import admin_client, create_topics, topic_plan

__all__ = ["admin_client", "create_topics", "topic_plan"]
