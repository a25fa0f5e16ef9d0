"""Every replacement collective installs into TensorFlow, Keras and Estimator: the one list, in order.

The modules of :mod:`collective.integration` (and
:mod:`collective.embedding.gradient_norms`) only define the replacing
functions; this module registers them with :mod:`collective.tf_internals.patches`.
Registering installs nothing: ``CollectiveStrategy.scope()`` installs the
patches of :data:`INSTALLED` for its block (``patches.patched()``) and
restores TensorFlow exactly when it ends; the on-demand ones are installed by
their owner for a block of its own (``patches.applied``).
``print(*patches.registered(), sep="\\n")`` prints the list with the reasons.

Changes made to single objects rather than to TensorFlow's classes and
modules, each because the object is collective's own or the change must
follow that object (not every object of its class):

- ``collective.embedding.table.tag``: a table's variable carries its
  ``ShardInfo`` (``_collective_shard``), which is how it is known by identity;
- ``collective.embedding.tables.watch_slots``: an optimizer object's
  slot-creating methods tag each slot made for a table, and its ``get_slot``
  of a packed table gives the table's rows of its group's slot (the
  optimizer may be built, and its slots read, outside any scope, so its class
  cannot be patched for the scope);
- ``collective.embedding.hash_table``: a hash table's per-worker index
  variables are not trainable whatever the variable scope says (``_trainable``);
- ``collective.checkpoint.saver``: the Saver's restore ops (``_AddRestoreOps``)
  read each worker's rows of the logical tables;
- ``collective.sok.checkpoint``: SOK tables and their slots save as logical
  tables in Keras checkpoints (``_serialize_to_tensors``).
"""

from __future__ import annotations

import tensorflow as tf

from collective.embedding import gradient_norms
from collective.integration import column_lookups, estimator, lookups, packed, session, sync, training, warm_start
from collective.tf_internals import (array_ops, batch_normalization, checkpoint_utils, clip_ops, dense_features,
                                     embedding_ops, estimator_lib, feature_column_v1, keras_compute_gradients,
                                     keras_optimizers, monitored_session, moving_averages, optimizer_lib, patches,
                                     saver_lib, variable_v1, variables, warm_starting_util)

_SESSION = ("every worker creates its session as a chief and saves checkpoints with the others; rank 0 alone "
            "writes summaries")

INSTALLED = [
    # Lookups on sharded tables go through the exchange.
    patches.register(embedding_ops, "embedding_lookup", lookups.embedding_lookup,
                     "lookups on sharded tables go through the exchange"),
    patches.register(tf.compat.v1.nn, "embedding_lookup", lookups.embedding_lookup,
                     "the same, under its public v1 name"),
    patches.register(embedding_ops, "safe_embedding_lookup_sparse", lookups.safe_embedding_lookup_sparse,
                     "on hash-table vocabularies empty rows give zeros without inserting a filler key 0"),
    patches.register(tf.compat.v1.nn, "safe_embedding_lookup_sparse", lookups.safe_embedding_lookup_sparse,
                     "the same, under its public v1 name"),
    patches.register(embedding_ops, "embedding_lookup_sparse_impl", lookups.embedding_lookup_sparse_impl,
                     "combined lookups (embedding_lookup_sparse, the safe_ variant, feature columns) likewise"),
    # Feature columns: one grouped exchange per layer.
    patches.register(feature_column_v1, "_internal_input_layer", column_lookups.internal_input_layer,
                     "input_layer: sharded lookups of all columns in one grouped exchange"),
    patches.register(dense_features.DenseFeatures, "call", column_lookups.dense_features_call,
                     "the same for Keras DenseFeatures (v1 and v2)"),
    patches.register(feature_column_v1._SharedEmbeddingColumn,  # pylint: disable=protected-access
                     "_get_dense_tensor_internal", column_lookups.shared_embedding_dense_tensor,
                     "v1 shared columns accept their sharded table"),
    # Sessions and checkpoints.
    patches.register(monitored_session, "MonitoredTrainingSession", session.MonitoredTrainingSession, _SESSION),
    patches.register(tf.compat.v1.train, "MonitoredTrainingSession", session.MonitoredTrainingSession, _SESSION),
    patches.register(saver_lib, "_get_saver_or_default", session.default_saver,
                     "a default Scaffold saves whole logical tables (collective.checkpoint.Saver)"),
    patches.register(estimator_lib.Estimator, "_call_model_fn", estimator.refuse_plain_estimator,
                     "a plain tf.estimator.Estimator is refused when it builds its model (strategy.estimator "
                     "builds one that saves logical tables)"),
    *[patches.register(owner, name, session.global_variables_initializer,
                       "the global variables' initializer also initialises the byte counter (a local variable)")
      for owner, name in ((variables, "global_variables_initializer"),
                          (tf.compat.v1, "global_variables_initializer"),
                          (tf.compat.v1.initializers, "global_variables"))],
    # Warm starts.
    patches.register(checkpoint_utils, "_init_from_checkpoint", warm_start.init_from_checkpoint,
                     "init_from_checkpoint / warm_start_from: one-to-one mappings onto sharded tables load their rows "
                     "of the stored logical table"),
    patches.register(checkpoint_utils, "_set_checkpoint_initializer", warm_start.set_checkpoint_initializer,
                     "the same for sharded tables reached by scope mappings ({'/': '/'})"),
    patches.register(warm_starting_util, "_get_grouped_variables", warm_start.grouped_variables,
                     "warm_start / warm_start_from find packed tables by name, not their group's variable"),
    patches.register(warm_starting_util, "_infer_var_name", warm_start.infer_var_name,
                     "the same: a packed table's name is its own"),
    patches.register(tf.compat.v1.train, "Saver", session.UserSaver,
                     "a user's Saver over sharded tables saves and restores them as logical tables "
                     "(collective.checkpoint.Saver)"),
    # Unequal input.
    patches.register(batch_normalization.BatchNormalizationBase, "_support_zero_size_input",
                     sync.batch_norm_supports_empty_batches,
                     "Keras batch norm (v1 layers too): an empty batch of uneven input leaves the moving statistics "
                     "unchanged and gives zero gradients instead of NaN"),
    # Variables and gradients.
    patches.register(variable_v1, "default_variable_creator", training.broadcasting_creator_v1,
                     "dense variables start as rank 0's values"),
    patches.register(variables, "default_variable_creator_v2", training.broadcasting_creator_v2,
                     "the same for tf.Variable"),
    patches.register(array_ops, "zeros_like_impl", training.zeros_like_impl,
                     "zeros_like(table) is known as made from the table (a variable made from it is the table's rows)"),
    patches.register(array_ops, "ones_like_impl", training.ones_like_impl, "the same for ones_like"),
    patches.register(optimizer_lib.Optimizer, "compute_gradients",
                     training.averaging_method(optimizer_lib.Optimizer, "compute_gradients",
                                               training.averaged_compute),
                     "gradients averaged over workers as Horovod's DistributedOptimizer does; slots of sharded "
                     "tables tagged as they are made"),
    patches.register(optimizer_lib.Optimizer, "apply_gradients",
                     training.averaging_method(optimizer_lib.Optimizer, "apply_gradients", training.averaged_apply),
                     "gradients not averaged yet (tf.gradients, GradientTape) averaged once"),
    *[patches.register(keras_class, "apply_gradients",
                       training.averaging_method(keras_class, "apply_gradients", training.averaged_apply),
                       "Keras optimizers: gradients not averaged yet averaged once; slots of sharded tables tagged")
      for keras_class in keras_optimizers],
    *[patches.register(keras_class, method, training.averaging_method(keras_class, method, training.averaged_compute),
                       "Keras optimizers' compute_gradients (and so minimize) averaged over workers")
      for keras_class, method in keras_compute_gradients],
    # Packed tables (COLLECTIVE_PACKING=1) where a program uses them as variables.
    *[patches.register(owner, "get_slot", training.averaging_method(owner, "get_slot", packed.get_slot),
                       "a packed table's slot is its rows of its group variable's slot")
      for owner in (optimizer_lib.Optimizer, *[k for k in keras_optimizers if "get_slot" in vars(k)])],
    patches.register(tf.compat.v1, "global_variables", packed.global_variables,
                     "packed tables are listed in place of their group's variable (a program finds its table by "
                     "name)"),
    patches.register(moving_averages.ExponentialMovingAverage, "apply",
                     training.averaging_method(moving_averages.ExponentialMovingAverage, "apply",
                                               packed.moving_average_apply),
                     "a packed table's moving average is a shadow of its own rows, saved as the table's"),
    patches.register(moving_averages.ExponentialMovingAverage, "variables_to_restore",
                     training.averaging_method(moving_averages.ExponentialMovingAverage, "variables_to_restore",
                                               packed.moving_average_variables_to_restore),
                     "a packed table is restored from its shadow's name, as a variable is"),
    patches.register(moving_averages.ExponentialMovingAverage, "average_name",
                     training.averaging_method(moving_averages.ExponentialMovingAverage, "average_name",
                                               packed.moving_average_name),
                     "a packed table's shadow is named as one process's"),
    patches.register(tf.compat.v1, "trainable_variables", packed.trainable_variables,
                     "the same for the trainable variables (a program lists, regularizes or clips its tables)"),
    patches.register(clip_ops, "global_norm", gradient_norms.global_norm,
                     "tables' gradients count in the global norm as one process's (clip_by_global_norm calls it)"),
    patches.register(tf.linalg, "global_norm", gradient_norms.global_norm, "the same, under its public name"),
    patches.register(tf.compat.v1, "global_norm", gradient_norms.global_norm, "the same, under its public v1 name"),
    patches.register(tf, "clip_by_norm", gradient_norms.clip_by_norm,
                     "a table's gradient is clipped by one process's norm of it (Keras' clipnorm calls it)"),
    patches.register(tf.compat.v1, "clip_by_norm", gradient_norms.clip_by_norm, "the same, under its v1 name"),
    patches.register(tf.compat.v2, "clip_by_norm", gradient_norms.clip_by_norm,
                     "the same, under its v2 name (Keras' optimizers call tensorflow.compat.v2's)"),
    patches.register(tf, "gradients", gradient_norms.attaching(tf, "gradients"),
                     "tables' gradients of tf.gradients carry one process's norm, as compute_gradients' do (Keras' "
                     "global_clipnorm clips them in apply_gradients)"),
    patches.register(tf.compat.v1, "gradients", gradient_norms.attaching(tf.compat.v1, "gradients"),
                     "the same, under its v1 name"),
]

# Installed by CollectiveEstimator for each of its calls.
ESTIMATOR_LOSS_METRIC = patches.register(
    estimator_lib, "_verify_and_create_loss_metric", estimator.loss_metric_weighted_by_data,
    "in every CollectiveEstimator call: the evaluation loss leaves out the empty batches of padded input",
    on_demand=True)
ESTIMATOR_RANK0_SUMMARIES = (
    patches.register(estimator_lib, "_write_dict_to_summary", estimator.write_nothing,
                     "on ranks other than 0, in CollectiveEstimator calls: no evaluation summaries", on_demand=True),
    patches.register(estimator_lib, "_write_checkpoint_path_to_summary", estimator.write_nothing,
                     "on ranks other than 0, in CollectiveEstimator calls: no checkpoint-path summaries",
                     on_demand=True),
)
