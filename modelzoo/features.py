"""Feature specs from the dataset schemas, and the layers every model builds from them.

A :class:`FeatureSpec` says which columns a model reads: numeric features,
categorical ids with their vocabulary sizes, optional multi-hot lists, and
the label columns. Models build their embedding tables from it with
:func:`embedding_layer` (feature columns + ``input_layer`` under
``embedding_scope()``), and the serving signature with
:func:`serving_input_receiver_fn`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import tensorflow as tf

from collective import CollectiveStrategy

_REPO = Path(__file__).resolve().parents[1]


def import_datasets():
    """The repository's ``datasets`` package (it is not installed: the name belongs to Hugging Face)."""
    if (_REPO / "datasets" / "schema.py").is_file() and str(_REPO) not in sys.path:
        sys.path.insert(0, str(_REPO))
    import datasets  # pylint: disable=import-outside-toplevel
    import datasets.movielens  # noqa: F401  pylint: disable=import-outside-toplevel
    import datasets.schema  # noqa: F401  pylint: disable=import-outside-toplevel
    import datasets.synthetic  # noqa: F401  pylint: disable=import-outside-toplevel

    return datasets


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """The columns a model reads.

    Attributes:
      numeric: float32 columns of shape ``[batch]``.
      categorical: id column -> vocabulary size (ids in ``[0, size)``).
      multi_hot: list-of-ids column -> vocabulary size; delivered to the
        model as a ``[batch, size]`` float32 indicator.
      labels: label columns, the first is the training target.
    """

    numeric: Tuple[str, ...] = ()
    categorical: Tuple[Tuple[str, int], ...] = ()
    multi_hot: Tuple[Tuple[str, int], ...] = ()
    labels: Tuple[str, ...] = ("label",)

    @property
    def columns(self) -> List[str]:
        """Every Parquet column the input pipeline reads, labels included."""
        return (list(self.numeric) + [n for n, _ in self.categorical] + [n for n, _ in self.multi_hot]
                + list(self.labels))

    def vocab(self, name: str) -> int:
        for column, size in self.categorical + self.multi_hot:
            if column == name:
                return size
        raise KeyError(f"feature {name!r} is not a categorical feature of this spec; "
                       f"it has {', '.join(n for n, _ in self.categorical + self.multi_hot)}")


def criteo_spec(cardinalities: Sequence[int]) -> FeatureSpec:
    """The Criteo layout (:mod:`datasets.schema`): 13 numeric features and 26 id columns of these sizes."""
    schema = import_datasets().schema
    if len(cardinalities) != len(schema.CATEGORICAL):
        raise ValueError(f"got {len(cardinalities)} table sizes for the {len(schema.CATEGORICAL)} categorical "
                         "Criteo columns C1..C26; pass one size per column")
    return FeatureSpec(numeric=tuple(schema.DENSE), categorical=tuple(zip(schema.CATEGORICAL, cardinalities)),
                       labels=(schema.LABEL,))


def movielens_spec(users: int, items: int, genres: int = 0) -> FeatureSpec:
    """MovieLens as converted by :mod:`datasets.movielens`: user and movie ids, genres, rating and label."""
    return FeatureSpec(categorical=(("user_id", users), ("item_id", items)),
                       multi_hot=(("genres", genres),) if genres else (), labels=("rating", "label"))


def identity_columns(spec: FeatureSpec, dim: int, seed: int, names: Optional[Sequence[str]] = None,
                     stddev: Optional[float] = None):
    """One ``embedding_column`` of ``dim`` per categorical feature (all of them, or ``names``), seeded.

    Each table gets its own initialiser seed, so the same ``seed`` gives the
    same tables whatever the world size and backend.
    """
    names = list(names) if names is not None else [n for n, _ in spec.categorical]
    fc = tf.compat.v1.feature_column
    columns = []
    for i, name in enumerate(names):
        init = tf.compat.v1.truncated_normal_initializer(stddev=stddev or dim ** -0.5, seed=seed * 1000 + i)
        columns.append(fc.embedding_column(fc.categorical_column_with_identity(name, spec.vocab(name)), dim,
                                           combiner="sum", initializer=init))
    return columns


def embedding_layer(features: Mapping[str, tf.Tensor], columns, scope: str, sharded: bool = True) -> tf.Tensor:
    """``[batch, len(columns), dim]``: the columns' vectors from tables made under ``embedding_scope()``
    (sharded across workers), or plain TensorFlow tables when not ``sharded`` (the baseline).

    ``input_layer`` orders columns by name; the result follows that order.
    """
    dims = {c.dimension for c in columns}
    if len(dims) != 1:
        raise ValueError(f"embedding columns in {scope!r} have different dimensions {sorted(dims)}; "
                         "give them one dimension")
    sharding = CollectiveStrategy().embedding_scope() if sharded else contextlib.nullcontext()
    with tf.compat.v1.variable_scope(scope), sharding:
        flat = tf.compat.v1.feature_column.input_layer(dict(features), columns)
    return tf.reshape(flat, [-1, len(columns), dims.pop()])


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


def serving_input_receiver_fn(spec: FeatureSpec):
    """The ``serving_input_receiver_fn`` of ``Estimator.export_saved_model`` for ``spec``."""
    def receiver():
        features = serving_features(spec)
        return tf.estimator.export.ServingInputReceiver(features, features)

    return receiver
