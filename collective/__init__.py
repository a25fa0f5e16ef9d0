"""collective: synchronous hybrid-parallel training for TensorFlow recommender models."""

import sys

if "tensorflow" in sys.modules:
    # Refuses an unsupported TensorFlow before anything else runs (see collective.tf_internals.check_versions).
    import collective.tf_internals  # noqa: F401  pylint: disable=unused-import

from collective.strategy import CollectiveStrategy, UnknownBackendError  # noqa: E402

__all__ = ["CollectiveStrategy", "UnknownBackendError"]
