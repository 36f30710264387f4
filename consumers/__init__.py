"""Consumers: the GPU worker (Kafka <-> engine) and the recorder (Kafka -> store).

Import the modules directly (`consumers.worker`, `consumers.recorder`): the worker pulls
in torch through the engine, the recorder does not.
"""
