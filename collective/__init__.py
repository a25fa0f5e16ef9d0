"""collective: synchronous hybrid-parallel training for TensorFlow recommender models.

``from collective import CollectiveStrategy`` loads TensorFlow; ``import collective`` alone does not
(the launcher and the byte model stay light), unless TensorFlow is already loaded, in which case its
version is checked at once.
"""

import sys

from collective import _moved

_moved.install()  # old module paths (collective.training, collective.feature_column, ...) keep importing

if "tensorflow" in sys.modules:
    # Refuses an unsupported TensorFlow before anything else runs (see collective.tf_internals.check_versions).
    import collective.tf_internals  # noqa: F401  pylint: disable=unused-import

__all__ = ["CollectiveStrategy", "UnknownBackendError"]


def __getattr__(name: str):
    if name in __all__:
        from collective import strategy  # pylint: disable=import-outside-toplevel

        return getattr(strategy, name)
    raise AttributeError(f"module 'collective' has no attribute {name!r}")
