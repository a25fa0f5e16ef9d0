"""The layers every model builds from its :class:`~modelzoo.spec.FeatureSpec`, and its serving inputs.

Models build their embedding tables from the spec with
:func:`embedding_layer` (``tf.compat.v1.get_variable`` under
``embedding_scope()``, coalesced lookups), and the serving
signature with :func:`serving_input_receiver_fn` (raw feature tensors,
serialized ``tf.Example``, or Criteo's values as in its TSV:
:mod:`modelzoo.criteo_serving`).
"""

from __future__ import annotations

import contextlib
from typing import Dict, List, Mapping, Optional, Sequence

import tensorflow as tf

from collective import CollectiveStrategy
from collective.embedding.lookup import lookup_sparse_group
from modelzoo.spec import FeatureSpec

import numpy as np

EMBEDDING_APIS = ("variables", "feature_columns", "constant")


def embedding_layer(features: Mapping[str, tf.Tensor], spec: FeatureSpec, dim: int, scope: str, seed: int,
                    names: Optional[Sequence[str]] = None, stddev: Optional[float] = None,
                    sharded: bool = True, api: str = "variables") -> tf.Tensor:
    """``[batch, len(names), dim]``: one table ``scope/<feature>`` of ``[vocab, dim]`` per categorical
    feature (all of the spec's, or ``names``, in that order), looked up together: sharded tables
    share one exchange (:func:`collective.embedding.lookup.lookup_sparse_group`).

    The tables are made under ``embedding_scope()`` (sharded across workers), or are plain TensorFlow
    variables when not ``sharded`` (the baseline). Each table has its own initialiser seed, so the same
    ``seed`` gives the same tables whatever the world size and backend.

    ``api="feature_columns"`` builds the same tables the way a stock TensorFlow model does:
    ``embedding_column(categorical_column_with_identity(...), combiner="sum")`` through
    ``input_layer`` (coalesced into one exchange when sharded). The benchmarks' Estimator baseline uses it.

    ``api="constant"`` makes no tables: every feature's vector is a fixed one (the same for every id), so
    the model is the one it would be without lookups. The benchmarks time it as the embedding-free ceiling.
    """
    if api not in EMBEDDING_APIS:
        raise ValueError(f"embedding api {api!r} is not one of {', '.join(EMBEDDING_APIS)}")
    names = list(names) if names is not None else [n for n, _ in spec.categorical]
    if api == "constant":
        return _constant_embeddings(features, names, dim, seed, stddev)
    sharding = CollectiveStrategy().embedding_scope() if sharded else contextlib.nullcontext()
    if api == "feature_columns":
        return _column_embeddings(features, spec, dim, scope, seed, names, stddev, sharding)
    with tf.compat.v1.variable_scope(scope), sharding:
        tables = [tf.compat.v1.get_variable(
            name, [spec.vocab(name), dim],
            initializer=tf.compat.v1.truncated_normal_initializer(stddev=stddev or dim ** -0.5, seed=seed * 1000 + i))
            for i, name in enumerate(names)]
    sparse_ids = _one_id_per_row([features[name] for name in names])
    vectors = lookup_sparse_group(tables, sparse_ids, combiners=["sum"] * len(names), name=scope + "_lookup",
                                  pad_to_batch=True)
    return tf.stack(vectors, axis=1)


def _column_embeddings(features: Mapping[str, tf.Tensor], spec: FeatureSpec, dim: int, scope: str, seed: int,
                       names: Sequence[str], stddev: Optional[float], sharding) -> tf.Tensor:
    """:func:`embedding_layer` through feature columns: ``[batch, len(names), dim]``."""
    fc = tf.compat.v1.feature_column
    columns = [fc.embedding_column(
        fc.categorical_column_with_identity(name, spec.vocab(name)), dim, combiner="sum",
        initializer=tf.compat.v1.truncated_normal_initializer(stddev=stddev or dim ** -0.5, seed=seed * 1000 + i))
        for i, name in enumerate(names)]
    ids = {name: tf.reshape(tf.cast(features[name], tf.int64), [-1, 1]) for name in names}
    with tf.compat.v1.variable_scope(scope), sharding:
        flat = fc.input_layer(ids, columns)
    # input_layer concatenates the columns sorted by their names; restore the order of ``names``.
    order = sorted(range(len(columns)), key=lambda k: columns[k].name)
    parts = tf.split(flat, len(columns), axis=1)
    by_feature = {k: parts[at] for at, k in enumerate(order)}
    return tf.stack([by_feature[k] for k in range(len(columns))], axis=1)


def _constant_embeddings(features: Mapping[str, tf.Tensor], names: Sequence[str], dim: int, seed: int,
                         stddev: Optional[float]) -> tf.Tensor:
    """:func:`embedding_layer` without tables: ``[batch, len(names), dim]`` of one fixed vector per feature."""
    vectors = np.random.default_rng(seed).normal(0.0, stddev or dim ** -0.5, (1, len(names), dim))
    batch = tf.shape(features[names[0]])[0]
    return tf.broadcast_to(tf.constant(vectors, tf.float32), tf.stack([batch, len(names), dim]))


def _one_id_per_row(ids: Sequence[tf.Tensor]) -> List[tf.SparseTensor]:
    """Each feature's ids ``[batch]`` (of one batch) as a ``[batch, 1]`` SparseTensor (what the coalesced
    lookup takes); they share one indices and one dense-shape tensor."""
    ids = [tf.reshape(tf.cast(i, tf.int64), [-1]) for i in ids]
    if not ids:
        return []
    batch = tf.size(ids[0], tf.int64)
    rows = tf.range(batch)
    indices, dense_shape = tf.stack([rows, tf.zeros_like(rows)], axis=1), tf.stack([batch, 1])
    return [tf.SparseTensor(indices, i, dense_shape) for i in ids]


def numeric_tensor(features: Mapping[str, tf.Tensor], spec: FeatureSpec) -> tf.Tensor:
    """``[batch, len(spec.numeric)]`` float32."""
    return tf.stack([tf.cast(features[name], tf.float32) for name in spec.numeric], axis=1)


def mlp(x: tf.Tensor, units: Sequence[int], scope: str, seed: int, last_activation: bool = True) -> tf.Tensor:
    """Dense ReLU layers of ``units`` (the last one linear unless ``last_activation``), seeded."""
    with tf.compat.v1.variable_scope(scope):
        for i, n in enumerate(units):
            relu = last_activation or i < len(units) - 1
            x = tf.compat.v1.layers.dense(
                x, n, activation=tf.nn.relu if relu else None, name=f"dense_{i}",
                kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=seed * 1000 + 500 + i))
    return x


def serving_features(spec: FeatureSpec) -> Dict[str, tf.Tensor]:
    """Placeholders for one request batch: numeric float32 ``[None]``, ids int64 ``[None]``,
    multi-hot float32 ``[None, size]``."""
    out: Dict[str, tf.Tensor] = {}
    for name in spec.numeric:
        out[name] = tf.compat.v1.placeholder(tf.float32, [None], name=name)
    for name, _ in spec.categorical:
        out[name] = tf.compat.v1.placeholder(tf.int64, [None], name=name)
    for name, size in spec.multi_hot:
        out[name] = tf.compat.v1.placeholder(tf.float32, [None, size], name=name)
    return out


SERVING_INPUTS = ("raw", "example", "criteo_raw")


def example_feature_spec(spec: FeatureSpec) -> Dict[str, object]:
    """The ``tf.io.parse_example`` spec of one request row: numeric features ``float_list``, ids
    ``int64_list`` (one value each), multi-hot lists the row's ids (``int64_list`` of any length)."""
    out: Dict[str, object] = {name: tf.io.FixedLenFeature([], tf.float32) for name in spec.numeric}
    out.update({name: tf.io.FixedLenFeature([], tf.int64) for name, _ in spec.categorical})
    out.update({name: tf.io.VarLenFeature(tf.int64) for name, _ in spec.multi_hot})
    return out


def serving_input_receiver_fn(spec: FeatureSpec, serving_input: str = "raw", data_dir: Optional[str] = None):
    """The ``serving_input_receiver_fn`` of ``Estimator.export_saved_model`` for ``spec``.

    ``raw``: one input tensor per feature (:func:`serving_features`).
    ``example``: one string tensor ``examples`` of serialized ``tf.Example``s
    (:func:`example_feature_spec`), as ``tf.estimator.export.build_parsing_serving_input_receiver_fn``
    makes it and TF Serving clients send; multi-hot id lists become the model's indicators.
    ``criteo_raw`` (Criteo models only): Criteo's TSV fields as strings, mapped to the features in the
    graph as the conversion of ``data_dir`` did (:class:`modelzoo.criteo_serving.RawCriteoReceiver`).
    """
    if serving_input not in SERVING_INPUTS:
        raise ValueError(f"serving input {serving_input!r} is not one of {', '.join(SERVING_INPUTS)}")
    if serving_input == "criteo_raw":
        # pylint: disable-next=import-outside-toplevel  (only criteo_raw needs it and its datasets.criteo)
        from modelzoo.criteo_serving import RawCriteoReceiver

        return RawCriteoReceiver(spec, data_dir)

    def raw():
        features = serving_features(spec)
        return tf.estimator.export.ServingInputReceiver(features, features)

    def example():
        parsed = tf.estimator.export.build_parsing_serving_input_receiver_fn(example_feature_spec(spec))()
        features = dict(parsed.features)
        for name, size in spec.multi_hot:
            features[name] = tf.cast(tf.sparse.to_indicator(features[name], size), tf.float32)
        return tf.estimator.export.ServingInputReceiver(features, parsed.receiver_tensors)

    return raw if serving_input == "raw" else example
