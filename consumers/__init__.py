"""Consumers: the GPU worker (Kafka <-> engine) and the recorder (Kafka -> store).

Import the modules directly (`inflight.consumers.worker`, `.recorder`): the worker pulls
in torch through the engine, the recorder does not.
"""
