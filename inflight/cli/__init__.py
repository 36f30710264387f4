"""The `inflight` command line and the composition root: embedded broker, topics, model
fetch, demo. Nothing else in the package imports it."""
