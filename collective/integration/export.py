"""SavedModel export of a model trained with sharded tables, for plain TensorFlow serving.

The model is built once more in a fresh graph inside
:func:`collective.embedding.modes.exporting`, with the lookups routed as in
``scope()`` but TensorFlow's own variable creators and optimizer:
``embedding_scope()`` then makes plain full-size variables (hash tables a
``tf.lookup`` index plus values) and no op of this package or of Horovod
enters the graph. The variables are restored from the checkpoint with a plain
``Saver`` (the checkpoint holds whole tables under their own names),
hash-table vocabularies get their key -> row lookup tables filled from the
checkpoint's keys, and rank 0 writes the SavedModel, with a record of the
checkpoint it holds in ``assets.extra`` (:mod:`.serving_versions`). Its
restore op also applies the deltas that :mod:`.serving_update` adds to
later versions (:mod:`.serving_deltas`). It loads with
``tf.compat.v1.saved_model.load`` / ``saved_model_cli`` in a process where
neither this package nor Horovod can be imported.

    strategy.export_saved_model(export_dir_base, checkpoint_path, signature_def_fn)   # HybridBackend's export
    export_estimator(model_fn, params, config, export_dir_base, serving_input_receiver_fn, checkpoint_path)
"""

from __future__ import annotations

import logging
import os
from typing import Callable, Dict, List, Mapping, Optional

import numpy as np
import tensorflow as tf

from collective import comm
from collective.runtime import heartbeat
from collective.embedding import modes
from collective.integration import serving_deltas, serving_versions
from collective.checkpoint.model_dir import CheckpointMismatchError, check_shapes, model_shapes, split_var_list
from collective.checkpoint.object_names import CheckpointNames
from collective.checkpoint.saver import ROW_SPLITS_SCOPE
from collective.tf_internals import all_saveable_objects, compat, export_lib, export_utils, function_utils, patches

logger = logging.getLogger("collective.integration.export")

def hash_table_keys_name(table_name: str) -> str:
    """The checkpoint key holding a hash-table vocabulary's keys (``[K]`` int64)."""
    return f"{table_name}/keys"


def _resolve_checkpoint(checkpoint_path) -> str:
    path = compat.as_text(os.fspath(checkpoint_path))
    if tf.io.gfile.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest is None:
            raise ValueError(f"export: no checkpoint in directory {path!r}; train first or pass a checkpoint prefix")
        return latest
    if not tf.compat.v1.train.checkpoint_exists(path):
        raise ValueError(f"export: {path!r} is not a checkpoint (no {path}.index); pass a checkpoint prefix such as "
                         "tf.train.latest_checkpoint(model_dir)")
    return path


def hash_table_rows(checkpoint_path: str) -> Dict[str, int]:
    """Keys held per hash-table vocabulary in the checkpoint (name- or object-based), by table name."""
    shapes = CheckpointNames(checkpoint_path).shapes
    return {key[:-len("/keys")]: int(shape[0]) for key, shape in shapes.items()
            if key.endswith("/keys") and key[:-len("/keys")] in shapes}


def _restore_for_export(sess: tf.compat.v1.Session, checkpoint_path: str) -> None:
    """Restores every global variable of the export graph and fills the hash-table lookups.

    An object-based checkpoint (``tf.train.Checkpoint``, ``model.save_weights``) is read by the names the
    variables had when it was saved (:mod:`collective.checkpoint.object_names`).
    """
    names = CheckpointNames(checkpoint_path)
    variables = tf.compat.v1.global_variables()
    if variables:
        _, saveables = split_var_list(variables)
        expected = model_shapes([], saveables)
        if names.object_based:
            _check_object_based(names, [v.op.name for v in variables])
        check_shapes(expected, checkpoint_path, found=names.shapes)
        restored = names.variable_keys(variables) if names.object_based else variables
        tf.compat.v1.train.Saver(restored).restore(sess, checkpoint_path)
    for table_name, lookup in tf.compat.v1.get_collection(modes.EXPORT_HASH_INDEXES):
        key_name = hash_table_keys_name(table_name)
        keys = names.get_tensor(key_name) if names.has_tensor(key_name) else np.zeros([0], np.int64)
        rows = np.arange(keys.shape[0], dtype=lookup.value_dtype.as_numpy_dtype)
        sess.run(lookup.insert(tf.constant(keys, lookup.key_dtype), tf.constant(rows)))


def _check_object_based(names: CheckpointNames, expected: List[str]) -> None:
    """Every variable of the export graph, hash tables included, must be in an object-based checkpoint.

    (A name-based one may lack a hash table no worker held a key of; a TF2 save writes every table it tracks.)
    """
    missing = sorted(name for name in expected if not names.has_tensor(name))
    if missing:
        held = sorted(names.shapes)
        raise CheckpointMismatchError(
            f"export: checkpoint {names.path} (written by tf.train.Checkpoint or save_weights) holds nothing under "
            f"the names the serving model's variables have: {', '.join(missing[:10])}. It holds "
            f"{', '.join(held[:10]) or 'no variables'}{' ...' if len(held) > 10 else ''}. Save the model itself on "
            "every worker (tf.train.Checkpoint(model=model).write(sok.checkpoint_path(path))), and build the serving "
            "model in signature_def_fn as in training (same classes, created first in a fresh graph), so that its "
            "variables get the names they had in training")


def fixed_tables(checkpoint_path: str) -> List[str]:
    """The sharded tables (and slots) a full checkpoint holds by row id: those with stored row bounds, no keys."""
    names = tf.compat.v1.train.NewCheckpointReader(checkpoint_path).get_variable_to_shape_map()
    return sorted(key[len(ROW_SPLITS_SCOPE):] for key in names
                  if key.startswith(ROW_SPLITS_SCOPE) and f"{key[len(ROW_SPLITS_SCOPE):]}/keys" not in names)


def export_saved_model(export_dir_base, checkpoint_path, signature_def_fn: Callable[[], object],
                       assets_extra: Optional[Mapping[str, str]] = None, as_text: bool = False,
                       clear_devices: bool = True, strip_default_attrs: bool = True, *,
                       restore_saver: Optional[Callable[[], Optional[tf.compat.v1.train.Saver]]] = None
                       ) -> Optional[bytes]:
    """Rank 0 writes a SavedModel with whole tables (HybridBackend's ``hb.saved_model.export``).

    Args:
      export_dir_base: directory under which a timestamped export directory is made.
      checkpoint_path: a checkpoint prefix, or a model_dir (its latest checkpoint).
      signature_def_fn: builds the serving graph (placeholders, the model
        with the same variable names as in training) and returns a
        SignatureDef, or a dict of them by signature key.
      assets_extra: ``{destination relative to assets.extra: source path}``.
      as_text: write ``saved_model.pbtxt`` instead of the binary proto.
      restore_saver: called after ``signature_def_fn`` in the export graph; a
        Saver it returns restores the checkpoint after every variable was
        restored under its own name, as ``Estimator.export_saved_model``
        restores with the PREDICT spec's ``scaffold.saver`` (the usual way to
        serve ``ExponentialMovingAverage`` weights: the variables then hold
        what that Saver read, and the SavedModel serves those values).

    Returns:
      On rank 0 the export directory (bytes, as ``Estimator.export_saved_model``);
      ``None`` on other workers, which return at once.
    """
    if comm.rank() != 0:
        logger.info("export: rank %d leaves the SavedModel to rank 0", comm.rank())
        return None
    with heartbeat.phase("export"):  # however long it takes, no stall (collective.runtime.stall)
        return _write_saved_model(export_dir_base, checkpoint_path, signature_def_fn, assets_extra, as_text,
                                  clear_devices, strip_default_attrs, restore_saver)


def _write_saved_model(export_dir_base, checkpoint_path, signature_def_fn, assets_extra, as_text, clear_devices,
                       strip_default_attrs, restore_saver=None) -> bytes:
    checkpoint_path = _resolve_checkpoint(checkpoint_path)
    export_dir = export_utils.get_timestamped_export_dir(export_dir_base)
    temp_dir = export_utils.get_temp_export_dir(export_dir)
    with patches.patched(), patches.suspended(), modes.exporting(hash_table_rows(checkpoint_path)), \
            tf.Graph().as_default():
        signatures = signature_def_fn()
        scaffold_saver = restore_saver() if restore_saver is not None else None
        if not isinstance(signatures, Mapping):
            signatures = {tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY: signatures}
        local_init_op = tf.compat.v1.train.Scaffold.default_local_init_op()
        # The builder's own saver, whose restore op also applies the deltas of later versions (serving updates).
        saver = tf.compat.v1.train.Saver(all_saveable_objects(), sharded=True, allow_empty=True,
                                         write_version=tf.compat.v1.train.SaverDef.V2)
        served = serving_deltas.add_delta_restore(saver, fixed_tables(checkpoint_path),
                                                  dict(tf.compat.v1.get_collection(modes.EXPORT_HASH_INDEXES)))
        with tf.compat.v1.Session() as sess:
            _restore_for_export(sess, checkpoint_path)
            if scaffold_saver is not None:
                scaffold_saver.restore(sess, checkpoint_path)
            # The (name, lookup table) pairs are not protos: the MetaGraph could not hold them (TF warned at every
            # export), and the served graph needs them no more.
            tf.compat.v1.get_default_graph().clear_collection(modes.EXPORT_HASH_INDEXES)
            builder = tf.compat.v1.saved_model.Builder(temp_dir)
            builder.add_meta_graph_and_variables(
                sess, [tf.saved_model.SERVING], signature_def_map=dict(signatures),
                assets_collection=tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.ASSET_FILEPATHS),
                main_op=local_init_op, clear_devices=clear_devices, strip_default_attrs=strip_default_attrs,
                saver=saver)
            builder.save(as_text)
    serving_versions.write_record(temp_dir, serving_versions.full_export_record(checkpoint_path, served))
    for relative, source in (assets_extra or {}).items():
        destination = os.path.join(compat.as_text(temp_dir), "assets.extra", relative)
        tf.io.gfile.makedirs(os.path.dirname(destination))
        tf.io.gfile.copy(source, destination, overwrite=True)
    tf.io.gfile.rename(temp_dir, export_dir)
    logger.info("export: SavedModel of %s written to %s", checkpoint_path, compat.as_text(export_dir))
    return export_dir


def call_model_fn(model_fn: Callable, features, labels, mode: str, params=None, config=None):
    """Calls ``model_fn`` with the arguments it accepts, as ``tf.estimator.Estimator`` does."""
    accepted = function_utils.fn_args(model_fn)
    kwargs = {name: value for name, value in (("labels", labels), ("mode", mode), ("params", params),
                                              ("config", config)) if name in accepted}
    spec = model_fn(features=features, **kwargs)
    if spec is None:
        raise ValueError(f"model_fn returned None in mode {mode!r}; it must return an EstimatorSpec in every mode "
                         "(PREDICT included, for export)")
    return spec


def with_default_signature(signatures: Mapping[str, object]) -> Dict[str, object]:
    """``signatures`` with ``serving_default`` = the ``predict`` signature when the export has no default.

    ``tf.estimator``'s classifier and regressor heads make ``serving_default``
    a classification or regression signature, which TensorFlow writes only
    for one serialized ``tf.Example`` string input; with raw feature tensors
    Estimator exports ``predict`` alone and warns "Export includes no default
    signature". Naming ``predict`` the default as well keeps clients that call
    the default (TF Serving without a signature name,
    ``loaded.signatures["serving_default"]``) working; every signature
    Estimator writes stays as it is.
    """
    out = dict(signatures)
    default, predict = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY, tf.saved_model.PREDICT_METHOD_NAME
    predict_key = "predict"
    if default not in out and predict_key in out and out[predict_key].method_name == predict:
        logger.info("export: no classification/regression signature for raw inputs; serving_default is the "
                    "predict signature")
        out[default] = out[predict_key]
    return out


def export_estimator(model_fn: Callable, params, config, export_dir_base, serving_input_receiver_fn: Callable,
                     checkpoint_path, assets_extra: Optional[Mapping[str, str]] = None,
                     as_text: bool = False) -> Optional[bytes]:
    """``Estimator.export_saved_model`` for a model trained with sharded tables (rank 0 writes).

    Builds the PREDICT graph from ``serving_input_receiver_fn`` and
    ``model_fn`` (with the global step, as the Estimator does) and exports it
    with :func:`export_saved_model`, with the signatures Estimator writes
    (plus :func:`with_default_signature`). The PREDICT spec's
    ``scaffold.saver``, if any, restores the checkpoint as in
    ``Estimator.export_saved_model`` (``restore_saver`` of
    :func:`export_saved_model`). Returns the export directory on rank 0, None
    elsewhere.
    """
    scaffold_savers: List = []

    def signature_def_fn():
        tf.compat.v1.train.get_or_create_global_step()
        receiver = serving_input_receiver_fn()
        spec = call_model_fn(model_fn, receiver.features, None, tf.estimator.ModeKeys.PREDICT, params, config)
        scaffold = getattr(spec, "scaffold", None)
        scaffold_savers.append(scaffold.saver if scaffold is not None else None)
        outputs = export_lib.export_outputs_for_mode(
            mode=spec.mode, serving_export_outputs=spec.export_outputs, predictions=spec.predictions,
            loss=spec.loss, metrics=spec.eval_metric_ops)
        signatures = export_lib.build_all_signature_defs(
            receiver.receiver_tensors, outputs, getattr(receiver, "receiver_tensors_alternatives", None),
            serving_only=True)
        return with_default_signature(signatures)

    return export_saved_model(export_dir_base, checkpoint_path, signature_def_fn, assets_extra=assets_extra,
                              as_text=as_text, restore_saver=lambda: scaffold_savers[-1])
