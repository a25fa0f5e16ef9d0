"""The one place collective reaches into TensorFlow's private modules.

Importing this package first checks that TensorFlow 2.15.x and
tensorflow-estimator 2.15.x are installed (:func:`check_versions`; 2.15 is
the last TensorFlow that ships ``tf.estimator``), then imports the private
modules and names below. Every other module of the repository takes them
from here (``from collective.tf_internals import io_ops, saver_lib``), so a
TensorFlow upgrade has one file to audit; ``tests/test_architecture.py``
fails on a private import anywhere else. The changes collective makes to
these modules are listed by :mod:`collective.tf_internals.patches`.

===========================  ========================================================  =========================
name here                    what for                                                  used by
===========================  ========================================================  =========================
``nest``                     ``map_structure_with_paths`` (not in ``tf.nest``)         sync
``array_ops``                ``zeros_like_impl``, ``ones_like_impl`` (noted as made    training
                             from a table)
``embedding_ops``            the lookups routed to the exchange                        lookups
``clip_ops``                 ``global_norm``, ``clip_by_norm`` (tables' gradients as   embedding.gradient_norms
                             one process's)
``variable_v1``,             the default variable creators (rank 0's initial values)   training
``variables``
``optimizer_lib``            ``tf.compat.v1.train.Optimizer.apply_gradients``,         training, hb.train
                             ``compute_gradients``
``keras_optimizers``,        Keras optimizers (``keras.src``) of both generations:     training
``keras_compute_gradients``  their ``apply_gradients`` and ``compute_gradients``
``monitored_session``        ``MonitoredTrainingSession``, ``USE_DEFAULT``             session
``basic_session_run_hooks``  the base ``CheckpointSaverHook``                          session
``training_util``            ``GLOBAL_STEP_READ_KEY``, ``global_step``                 session, checkpoint.saver
``saver_lib``                ``Saver``, ``BulkSaverBuilder``,                          checkpoint.saver, session
                             ``_get_saver_or_default``
``checkpoint_management``    checkpoint state file and meta-graph names                checkpoint.saver
``checkpoint_utils``         ``init_from_checkpoint``'s internals (warm starts of      warm_start
                             sharded tables)
``io_ops``                   ``save_v2``, ``restore_v2``, ``merge_v2_checkpoints``     checkpoint.saver,
                                                                                       checkpoint.layout,
                                                                                       checkpoint.hash_tables
``compat``                   ``as_text``, ``as_str``, ``integral_types``               checkpoint.saver, export
``saveable_object_util``     saveables of the variables that are not sharded           checkpoint.model_dir
``function_utils``           ``fn_args`` (the arguments a model_fn takes)              estimator, export
``export_utils``             timestamped and temporary SavedModel directories          export
``func_graph``               ``FuncGraph`` (function bodies take ungrouped lookups)    embedding.coalescing, embedding.packed_tables
``PartitionInfo``            ``variable_scope._PartitionInfo``: TF1 initialisers'      embedding.table
                             scale
``feature_column_v1``        ``_internal_input_layer``, ``_SharedEmbeddingColumn``,    column_lookups,
                             ``_CategoricalColumn``                                    hash_embedding_column
``feature_column_v2``        ``CategoricalColumn``,                                    hash_embedding_column
                             ``_to_sparse_input_and_drop_ignore_values``
``dense_features``           Keras ``DenseFeatures`` (``keras.src``)                   column_lookups
``batch_normalization``      Keras ``BatchNormalizationBase`` (``keras.src``): its     sync
                             zero-size-batch switch
``estimator_lib``            ``Estimator``'s loss metric and evaluation summaries      estimator
``export_lib``               ``export_outputs_for_mode``,                              export
                             ``build_all_signature_defs``
===========================  ========================================================  =========================

Helpers for private attributes read in more than one place:
:func:`all_saveable_objects` (``variables._all_saveable_objects``, twice in
checkpoint.model_dir), :func:`control_flow_context`
(``Graph._get_control_flow_context``, for embedding.coalescing and
embedding.hash_table) and :func:`set_initializer` (``ResourceVariable._initializer_op``,
for a growing hash table's slots).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
from typing import List, Optional

import tensorflow

SUPPORTED = "2.15"
"""The TensorFlow and tensorflow-estimator release collective is written against."""


def _is_supported(version: str) -> bool:
    return version.split(".")[:2] == SUPPORTED.split(".")


def check_versions(tf_version: str, estimator_version: str) -> None:
    """Raises ``ImportError`` unless both versions are 2.15.x.

    Args:
      tf_version: ``tensorflow.__version__``.
      estimator_version: tensorflow-estimator's version (or a phrase such as
        ``"not installed"``).
    """
    if _is_supported(tf_version) and _is_supported(estimator_version):
        return
    raise ImportError(
        f"collective supports TensorFlow {SUPPORTED}.x with tensorflow-estimator {SUPPORTED}.x (the last TensorFlow "
        f"that ships tf.estimator); found tensorflow {tf_version} and tensorflow-estimator {estimator_version}. "
        "Install tensorflow-cpu==2.15.1 (or tensorflow==2.15.1) and tensorflow-estimator==2.15.0, e.g. with "
        "scripts/setup.sh.")


def _distribution_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _estimator_version() -> str:
    """tensorflow-estimator's ``__version__``, else its distribution's version (2.15.0 defines none)."""
    try:
        import tensorflow_estimator  # pylint: disable=import-outside-toplevel
    except ImportError:
        return "not installed"
    version = getattr(tensorflow_estimator, "__version__", None)
    return str(version) if version is not None else _distribution_version("tensorflow-estimator")


def _check_installed() -> None:
    tf_version = str(getattr(tensorflow, "__version__", "unknown"))
    # Under another TensorFlow, importing tensorflow_estimator may itself fail: read only its metadata then.
    estimator_version = (_estimator_version() if _is_supported(tf_version)
                         else _distribution_version("tensorflow-estimator"))
    check_versions(tf_version, estimator_version)


_check_installed()

# pylint: disable=wrong-import-position,ungrouped-imports
from keras.src.feature_column import dense_features  # noqa: E402
from keras.src.layers.normalization import batch_normalization  # noqa: E402
from keras.src.optimizers import optimizer as keras_optimizer  # noqa: E402
from keras.src.optimizers.legacy import optimizer_v2 as keras_legacy_optimizer  # noqa: E402
from tensorflow.python.checkpoint import checkpoint_management  # noqa: E402
from tensorflow.python.feature_column import feature_column as feature_column_v1  # noqa: E402
from tensorflow.python.feature_column import feature_column_v2  # noqa: E402
from tensorflow.python.framework import func_graph  # noqa: E402
from tensorflow.python.ops import array_ops, clip_ops, embedding_ops, io_ops, variable_v1, variables  # noqa: E402
from tensorflow.python.ops.variable_scope import _PartitionInfo as PartitionInfo  # noqa: E402
from tensorflow.python.saved_model.model_utils import export_utils  # noqa: E402
from tensorflow.python.training import basic_session_run_hooks, monitored_session, training_util  # noqa: E402
from tensorflow.python.training import checkpoint_utils, moving_averages, warm_starting_util  # noqa: E402
from tensorflow.python.training import optimizer as optimizer_lib  # noqa: E402
from tensorflow.python.training import saver as saver_lib  # noqa: E402
from tensorflow.python.training.saving import saveable_object_util  # noqa: E402
from tensorflow.python.util import compat, function_utils, nest, object_identity  # noqa: E402
from tensorflow_estimator.python.estimator import estimator as estimator_lib  # noqa: E402
from tensorflow_estimator.python.estimator.export import export_lib  # noqa: E402
# pylint: enable=wrong-import-position,ungrouped-imports

# Keras optimizers of both generations, each class that defines apply_gradients (legacy ``OptimizerV2``,
# ``tf.keras.optimizers.Optimizer``), and where each defines compute_gradients.
keras_optimizers = (keras_legacy_optimizer.OptimizerV2, keras_optimizer.Optimizer)
keras_compute_gradients = ((keras_legacy_optimizer.OptimizerV2, "_compute_gradients"),
                           (keras_optimizer._BaseOptimizer, "compute_gradients"))  # pylint: disable=protected-access


def all_saveable_objects(scope: Optional[str] = None) -> List:
    """Every variable and saveable a default ``Saver`` saves (``variables._all_saveable_objects``)."""
    return variables._all_saveable_objects(scope)  # pylint: disable=protected-access


def set_initializer(var, op) -> None:
    """Makes ``op`` the initializer of graph variable ``var`` (``ResourceVariable._initializer_op``)."""
    var._initializer_op = op  # pylint: disable=protected-access


def control_flow_context(graph: tensorflow.Graph):
    """The control-flow context (``tf.cond``/``tf.while_loop`` body) ops are being added to in ``graph``, or None."""
    return graph._get_control_flow_context()  # pylint: disable=protected-access


@contextlib.contextmanager
def extending(graph: tensorflow.Graph):
    """Lets ops be added to ``graph`` even if it is finalized (it is finalized again after); sessions pick them up."""
    finalized = graph.finalized
    if finalized:
        graph._unsafe_unfinalize()  # pylint: disable=protected-access
    try:
        with graph.as_default():
            yield graph
    finally:
        if finalized:
            graph.finalize()


__all__ = [
    "SUPPORTED", "check_versions", "all_saveable_objects", "control_flow_context", "extending", "set_initializer",
    "PartitionInfo", "basic_session_run_hooks", "batch_normalization", "checkpoint_management", "checkpoint_utils",
    "clip_ops", "compat",
    "dense_features", "embedding_ops", "estimator_lib", "export_lib", "export_utils", "feature_column_v1",
    "feature_column_v2", "func_graph", "function_utils", "io_ops", "keras_compute_gradients", "keras_optimizers",
    "monitored_session", "moving_averages", "nest", "object_identity", "optimizer_lib",
    "saveable_object_util", "saver_lib", "training_util", "variable_v1", "variables", "warm_starting_util",
]
