"""collective: synchronous hybrid-parallel training for TensorFlow recommender models."""

from collective.strategy import CollectiveStrategy, UnknownBackendError

__all__ = ["CollectiveStrategy", "UnknownBackendError"]
