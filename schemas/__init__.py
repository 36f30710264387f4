"""Wire messages, settings and the error tree. Imports nothing of the project."""

from schemas.errors import (BrokerError, CapacityError, ConfigError, InflightError, ModelError,
                            Retry, SchemaError, StoreError)
from schemas.settings import Settings

__all__ = ["BrokerError", "CapacityError", "ConfigError", "InflightError", "ModelError", "Retry",
           "SchemaError", "Settings", "StoreError"]
