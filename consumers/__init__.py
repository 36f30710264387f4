"""Consumers: the GPU worker (Kafka <-> engine) and the recorder (Kafka -> store).

Import the modules directly (`inflight.consumers.worker`, `.recorder`): the worker pulls
in torch through the engine, the recorder does not.
"""

from inflight.schemas.errors import require_extra

# the worker and the recorder serve Prometheus metrics; the worker's engine needs torch
# (inflight.engine.Engine says so when it is missing)
require_extra("worker", "inflight.consumers (the worker and the recorder)", "prometheus_client")
