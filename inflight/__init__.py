"""inflight: a message-queue-driven, asynchronous LLM inference service.

One import package: `inflight.engine` (the engine, importable on its own), `inflight.kernels`,
`inflight.schemas`, `inflight.store`, `inflight.consumers`, `inflight.producers`,
`inflight.api`, `inflight.migrations`, and `inflight.cli` (the command line). This module
imports none of them, so `import inflight.engine` loads only the engine.
"""
