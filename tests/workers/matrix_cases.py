"""The differential matrix: every public lookup entry point in one model, built alike with and without collective.

Workers build :func:`build` under a strategy on their share of each global
batch; the tests build it in plain single-process TensorFlow on the whole
batch (``strategy=None``), start it from the workers' initial logical tables
(so unseeded initializers compare too) and compare forward values, the
averaged gradients of step 0 and the weights and slots after ``STEPS`` steps.

Entry points with a hash-table vocabulary (SOK hash layers, DeepRec's
``categorical_column_with_embedding``) are compared key by key: the plain
model holds one row per key of :data:`KEY_POOL`, initialised with
``hash_cases.init_vectors`` (the numpy twin of ``collective.embedding.key_init``).
"""

from __future__ import annotations

import contextlib
import pathlib
import sys
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np
import tensorflow as tf

if str(pathlib.Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from embedding_cases import make_optimizer  # noqa: E402  pylint: disable=wrong-import-position
from hash_cases import init_vectors  # noqa: E402  pylint: disable=wrong-import-position

VOCAB, DIM, BATCH, WIDTH, STEPS = 13, 3, 12, 3, 3
HASH_BUCKETS, CAPACITY = 7, 32
BACKENDS = ("hb", "sok", "replicated", "hb-api")
WORKERS = (1, 2, 3)
OPTIMIZERS = ("GradientDescent", "Momentum", "Adagrad", "Adam", "Ftrl")
# The TF1-behaviour launches (disable_v2_behavior) train with these: slots of both kinds (per row; Adam's
# beta powers beside them) on ref variables; the other optimizers differ from them only in the update rule.
TF1_OPTIMIZERS = ("Adagrad", "Adam")
# The TF2-behaviour launches train with one of the other three (Ftrl, which the generated programs do not draw,
# among them) and one of TF1_OPTIMIZERS, each in its own rotation: so each backend and each N meets all five
# under TF2 and Adagrad and Adam under both behaviours.
TF2_OPTIMIZERS = ("GradientDescent", "Momentum", "Ftrl")
# Hash keys: negative, extreme and ordinary int64 values.
KEY_POOL = np.unique(np.array([0, 3, -1, -9, 2 ** 40 + 1, -(2 ** 50), np.iinfo(np.int64).max, 7 * 10 ** 14,
                               123456789, 31], np.int64))
HASH_SEEDS = {"sok_hash_dense": 41, "sok_hash_sparse": 42, "ev_column": 43}




# The cells (backend, N, TF1) whose tables are placed table_wise by ``sharding=`` (:func:`sharding_for`): an
# override on existing cells: each backend with a sharded exchange and N > 1 under both behaviours, and hb on 1
# (TF1: the one rank holds every table whole).
TABLE_WISE_CELLS = {("hb", 1, True), ("hb", 3, False), ("sok", 2, False), ("hb", 2, True), ("sok", 3, True)}
# The cells whose dense tables (SOK's own and hash tables keep their placement) are placed column_wise: each N
# and each behaviour, hb and sok each under both (DIM >= N: every rank holds at least one column). Four cells:
# the suite's CPU budget.
COLUMN_WISE_CELLS = {("sok", 1, False), ("hb", 2, False), ("hb", 3, True), ("sok", 2, True)}
# SOK's own tables (its layers' variables) are row-wise only: the override leaves them.
SOK_TABLES = ("sok_dense", "sok_sparse", "sok_hash_dense", "sok_hash_sparse", "sok_table")
# A table made outside embedding_scope() is an ordinary (replicated) variable: the plan never places it.
NOT_PLANNED = ("outside_scope",)


def sharding_for(backend: str, n: int, tf1: bool = False):
    """The cell's ``sharding=`` override: every table but SOK's own ``table_wise`` in :data:`TABLE_WISE_CELLS`
    (the planner spreads them over the ranks), every dense table but SOK's own ``column_wise`` in
    :data:`COLUMN_WISE_CELLS`, else None (the default plan)."""
    cell = (backend, n, tf1)
    if cell in TABLE_WISE_CELLS:
        return lambda table: None if table.name.split("/")[0] in SOK_TABLES else "table_wise"
    if cell in COLUMN_WISE_CELLS:
        return lambda table: None if table.name.split("/")[0] in SOK_TABLES or table.key_space == "hash" \
            else "column_wise"
    return None


def optimizers_for(backend: str, n: int, tf1: bool = False) -> Tuple[str, ...]:
    """The optimizers the cell (``backend``, ``n`` workers, behaviour) trains with, each in a Latin rotation.

    TF1: one of :data:`TF1_OPTIMIZERS`; TF2: one of :data:`TF2_OPTIMIZERS` and one of :data:`TF1_OPTIMIZERS`
    (they share the cell's model and gradients: one update each). So under each behaviour each backend meets
    each of its optimizers over N = 1, 2, 3 and each N over the backends: under TF2 all five
    :data:`OPTIMIZERS`, under TF1 Adagrad and Adam. The generated programs (tests/test_programs.py) draw
    the other combinations (Ftrl aside).
    """
    b, k = BACKENDS.index(backend), WORKERS.index(n)
    adaptive = TF1_OPTIMIZERS[(b + k) % len(TF1_OPTIMIZERS)]
    if tf1:
        return (adaptive,)
    return (TF2_OPTIMIZERS[(b + k) % len(TF2_OPTIMIZERS)], adaptive)


class Features(NamedTuple):
    """The model's inputs (placeholders); ``keys`` and ``sp_keys`` carry hash keys (pool rows in the plain model)."""

    ids: tf.Tensor
    sp: tf.SparseTensor
    sp_w: tf.SparseTensor
    sp_safe: tf.SparseTensor
    sp_safe_w: tf.SparseTensor
    keys: tf.Tensor
    sp_keys: tf.SparseTensor
    labels: tf.Tensor


def table_values(seed: int, rows: int = VOCAB) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.5, (rows, DIM)).astype(np.float32)


def _ragged(rng, batch: int, values: Callable[[int], np.ndarray], min_len: int = 0):
    lengths = rng.integers(min_len, WIDTH + 1, batch)
    lengths[1] = 0  # an empty row on every worker's share of 12 // N
    rows = np.repeat(np.arange(batch), lengths)
    return rows, values(rows.size)


def global_batch(step: int) -> Dict[str, tuple]:
    """One step's inputs: dense ids and keys [B, 2], sparse (rows, values) features, labels [B, 1].

    Ids repeat within rows, across rows and across workers; rows 1, 5 and 9
    are empty; ``safe`` holds negative ids, which safe lookups drop.
    """
    rng = np.random.default_rng(500 + step)
    ids = rng.integers(0, VOCAB, (BATCH, 2))
    ids[0, :] = 5
    sp_rows, sp_ids = _ragged(rng, BATCH, lambda n: rng.integers(0, VOCAB, n))
    sp_ids[:2] = VOCAB - 1
    weights = rng.uniform(0.5, 2.0, sp_ids.size).astype(np.float32)
    safe_rows, safe_ids = _ragged(rng, BATCH, lambda n: rng.integers(-2, VOCAB, n), min_len=1)
    safe_weights = rng.uniform(0.5, 2.0, safe_ids.size).astype(np.float32)
    keys = rng.choice(KEY_POOL, (BATCH, 2))
    keys[0, :] = KEY_POOL[-1]
    key_rows, sp_keys = _ragged(rng, BATCH, lambda n: rng.choice(KEY_POOL, n))
    labels = rng.integers(0, 2, (BATCH, 1)).astype(np.float32)
    for empty in (5, 9):
        sp_ids, weights = sp_ids[sp_rows != empty], weights[sp_rows != empty]
        sp_rows = sp_rows[sp_rows != empty]
    return {"ids": (ids,), "sp": (sp_rows, sp_ids, weights), "safe": (safe_rows, safe_ids, safe_weights),
            "keys": (keys,), "sp_keys": (key_rows, sp_keys), "labels": (labels,)}


def local_batch(step: int, rank: int, size: int) -> Dict[str, tuple]:
    """Worker ``rank``'s contiguous share of the global batch (the global batch when ``size`` is 1)."""
    per = BATCH // size
    lo, hi = rank * per, (rank + 1) * per
    out = {}
    for name, value in global_batch(step).items():
        if len(value) == 1:
            out[name] = (value[0][lo:hi],)
        else:
            keep = (value[0] >= lo) & (value[0] < hi)
            out[name] = (value[0][keep] - lo, *(v[keep] for v in value[1:]))
    return out


def placeholders() -> Features:
    def sparse(dtype):
        return tf.compat.v1.sparse_placeholder(dtype, [None, WIDTH])

    return Features(tf.compat.v1.placeholder(tf.int64, [None, 2]), sparse(tf.int64), sparse(tf.float32),
                    sparse(tf.int64), sparse(tf.float32), tf.compat.v1.placeholder(tf.int64, [None, 2]),
                    sparse(tf.int64), tf.compat.v1.placeholder(tf.float32, [None, 1]))


def sparse_value(rows, values, batch: int):
    starts = np.searchsorted(rows, rows, side="left")
    cols = np.arange(rows.size) - starts
    return tf.compat.v1.SparseTensorValue(np.stack([rows, cols], 1).astype(np.int64), values, [batch, WIDTH])


def feed_dict(f: Features, batch: Dict[str, tuple], plain: bool) -> dict:
    """Feeds ``batch``; the plain model sees each hash key as its row in :data:`KEY_POOL`."""
    size = len(batch["labels"][0])
    to_keys = (lambda k: np.searchsorted(KEY_POOL, k)) if plain else (lambda k: k)
    (sp_rows, sp_ids, weights), (safe_rows, safe_ids, safe_weights) = batch["sp"], batch["safe"]
    key_rows, sp_keys = batch["sp_keys"]
    return {f.ids: batch["ids"][0], f.sp: sparse_value(sp_rows, sp_ids, size),
            f.sp_w: sparse_value(sp_rows, weights, size), f.sp_safe: sparse_value(safe_rows, safe_ids, size),
            f.sp_safe_w: sparse_value(safe_rows, safe_weights, size), f.keys: to_keys(batch["keys"][0]),
            f.sp_keys: sparse_value(key_rows, to_keys(sp_keys), size), f.labels: batch["labels"][0]}


class Built(NamedTuple):
    """One entry point in the model: its output [batch, k] and the tables it trains."""

    output: tf.Tensor
    tables: List[tf.Variable]


def _const(seed: int, rows: int = VOCAB):
    return tf.compat.v1.constant_initializer(table_values(seed, rows))


def _var(name: str, initializer, shape=(VOCAB, DIM)) -> tf.Variable:
    return tf.compat.v1.get_variable(name, list(shape), initializer=initializer)


def _flat(x: tf.Tensor) -> tf.Tensor:
    return tf.reshape(x, [-1, int(np.prod(x.shape[1:]))])


def _lookup(name: str, make_initializer: Callable) -> Callable:
    def build(f: Features, scope, plain: bool) -> Built:
        with scope():
            table = _var(name, make_initializer())
        return Built(_flat(tf.nn.embedding_lookup(table, f.ids)), [table])

    return build


def _sparse(name: str, combiner: str, weighted: bool) -> Callable:
    def build(f: Features, scope, plain: bool) -> Built:
        with scope():
            table = _var(name, _const(10 + len(name)))
        return Built(tf.nn.embedding_lookup_sparse(table, f.sp, f.sp_w if weighted else None, combiner=combiner),
                     [table])

    return build


def _safe(name: str, combiner: str, weighted: bool) -> Callable:
    def build(f: Features, scope, plain: bool) -> Built:
        with scope():
            table = _var(name, _const(20 + len(name)))
        weights = f.sp_safe_w if weighted else None
        return Built(tf.nn.safe_embedding_lookup_sparse(table, f.sp_safe, weights, combiner=combiner), [table])

    return build


def _column_table(layer_scope: str) -> tf.Variable:
    [table] = [v for v in tf.compat.v1.global_variables() if v.op.name.startswith(layer_scope)
               and v.op.name.endswith("embedding_weights")]
    return table


def _embedding_column(f: Features, scope, plain: bool) -> Built:
    column = tf.compat.v1.feature_column.embedding_column(
        tf.compat.v1.feature_column.categorical_column_with_identity("item", VOCAB), DIM, combiner="mean",
        initializer=_const(31))
    with scope(), tf.compat.v1.variable_scope("embedding_column"):
        out = tf.compat.v1.feature_column.input_layer({"item": f.sp}, [column])
    return Built(out, [_column_table("embedding_column")])


def _shared_columns(f: Features, scope, plain: bool) -> Built:
    columns = tf.compat.v1.feature_column.shared_embedding_columns(
        [tf.compat.v1.feature_column.categorical_column_with_identity(k, VOCAB) for k in ("shared_a", "shared_b")],
        DIM, combiner="sqrtn", initializer=_const(32), shared_embedding_collection_name="matrix_shared")
    shifted = tf.sparse.from_dense(f.ids + 1)  # every id kept (from_dense drops zeros)
    dense_as_sparse = tf.SparseTensor(shifted.indices, shifted.values - 1, shifted.dense_shape)
    with scope(), tf.compat.v1.variable_scope("shared_columns"):
        out = tf.compat.v1.feature_column.input_layer({"shared_a": f.sp, "shared_b": dense_as_sparse}, columns)
    [table] = [v for v in tf.compat.v1.global_variables() if "matrix_shared" in v.op.name]
    return Built(out, [table])


def _hash_bucket_column(f: Features, scope, plain: bool) -> Built:
    column = tf.compat.v1.feature_column.embedding_column(
        tf.compat.v1.feature_column.categorical_column_with_hash_bucket("bucketed", HASH_BUCKETS, dtype=tf.int64),
        DIM, combiner="sum", initializer=_const(33, HASH_BUCKETS))
    with scope(), tf.compat.v1.variable_scope("hash_bucket_column"):
        out = tf.compat.v1.feature_column.input_layer({"bucketed": f.sp}, [column])
    return Built(out, [_column_table("hash_bucket_column")])


def _tensor_initializer(f: Features, scope, plain: bool) -> Built:
    with scope():
        table = tf.compat.v1.get_variable("tensor_init", initializer=tf.constant(table_values(34)))
    return Built(_flat(tf.nn.embedding_lookup(table, f.ids)), [table])


def _outside_scope(f: Features, scope, plain: bool) -> Built:
    """A table made outside ``embedding_scope()``: a replicated variable whose sparse gradient is averaged by
    allgather (``training.average_gradients``; the batch is not static)."""
    table = _var("outside_scope", _const(39))
    return Built(_flat(tf.nn.embedding_lookup(table, f.ids)), [table])


def _tf_variable(f: Features, scope, plain: bool) -> Built:
    with scope():
        table = tf.Variable(table_values(35), name="tf_variable")
    return Built(_flat(tf.nn.embedding_lookup(table, f.ids)), [table])


class _AddWeightEmbedding(tf.keras.layers.Layer):
    """A user's Keras layer whose table comes from ``add_weight``."""

    def build(self, input_shape):
        self.table = self.add_weight("table", [VOCAB, DIM],
                                     initializer=tf.keras.initializers.RandomUniform(-0.5, 0.5, seed=36))
        super().build(input_shape)

    def call(self, ids):
        return tf.nn.embedding_lookup(self.table, ids)


def _keras_add_weight(f: Features, scope, plain: bool) -> Built:
    layer = _AddWeightEmbedding(name="keras_add_weight")
    with scope():
        layer.build(f.ids.shape)
    return Built(_flat(layer(f.ids)), [layer.table])


def _sok_dense(f: Features, scope, plain: bool) -> Built:
    if plain:
        table = _var("sok_dense", None)
        return Built(_flat(tf.nn.embedding_lookup(table, f.ids)), [table])
    import collective.sok as sok  # pylint: disable=import-outside-toplevel

    layer = sok.All2AllDenseEmbedding(max_vocabulary_size_per_gpu=VOCAB, embedding_vec_size=DIM, slot_num=2,
                                      nnz_per_slot=1, use_hashtable=False, name="sok_dense")
    out = layer(tf.reshape(f.ids, [-1, 2, 1]))
    return Built(_flat(out), [layer.embedding_variable])


def _sok_sparse(f: Features, scope, plain: bool) -> Built:
    if plain:
        table = _var("sok_sparse", None)
        return Built(tf.nn.embedding_lookup_sparse(table, f.sp, None, combiner="mean"), [table])
    import collective.sok as sok  # pylint: disable=import-outside-toplevel

    layer = sok.DistributedEmbedding("mean", max_vocabulary_size_per_gpu=VOCAB, embedding_vec_size=DIM, slot_num=1,
                                     max_nnz=WIDTH, use_hashtable=False, name="sok_sparse")
    return Built(_flat(layer(f.sp)), [layer.embedding_variable])


def _hash_plain(name: str) -> tf.Variable:
    return tf.compat.v1.get_variable(name, initializer=init_vectors(KEY_POOL, HASH_SEEDS[name], dim=DIM))


def _sok_hash_dense(f: Features, scope, plain: bool) -> Built:
    if plain:
        table = _hash_plain("sok_hash_dense")
        return Built(_flat(tf.nn.embedding_lookup(table, f.keys)), [table])
    import collective.sok as sok  # pylint: disable=import-outside-toplevel

    layer = sok.All2AllDenseEmbedding(
        max_vocabulary_size_per_gpu=CAPACITY, embedding_vec_size=DIM, slot_num=2, nnz_per_slot=1,
        embedding_initializer=tf.keras.initializers.RandomUniform(-0.5, 0.5, seed=HASH_SEEDS["sok_hash_dense"]),
        name="sok_hash_dense")
    return Built(_flat(layer(tf.reshape(f.keys, [-1, 2, 1]))), [layer.embedding_variable])


def _sok_hash_sparse(f: Features, scope, plain: bool) -> Built:
    if plain:
        table = _hash_plain("sok_hash_sparse")
        return Built(tf.nn.embedding_lookup_sparse(table, f.sp_keys, None, combiner="sum"), [table])
    import collective.sok as sok  # pylint: disable=import-outside-toplevel

    layer = sok.DistributedEmbedding(
        "sum", max_vocabulary_size_per_gpu=CAPACITY, embedding_vec_size=DIM, slot_num=1, max_nnz=WIDTH,
        embedding_initializer=tf.keras.initializers.RandomUniform(-0.5, 0.5, seed=HASH_SEEDS["sok_hash_sparse"]),
        name="sok_hash_sparse")
    return Built(_flat(layer(f.sp_keys)), [layer.embedding_variable])


def _ev_column(f: Features, scope, plain: bool) -> Built:
    if plain:
        # A categorical column drops negative keys: their pool rows become -1, which the safe lookup drops.
        rows = f.sp_keys.values
        rows = tf.where(tf.gather(tf.constant(KEY_POOL < 0), rows), tf.constant(-1, tf.int64), rows)
        table = _hash_plain("ev_column")
        return Built(tf.nn.safe_embedding_lookup_sparse(
            table, tf.SparseTensor(f.sp_keys.indices, rows, f.sp_keys.dense_shape), None, combiner="mean"), [table])
    from collective.hash_embedding_column import (  # pylint: disable=import-outside-toplevel
        EmbeddingVariableOption, InitializerOption, categorical_column_with_embedding)

    option = EmbeddingVariableOption(capacity_per_worker=CAPACITY, init_option=InitializerOption(
        tf.compat.v1.random_uniform_initializer(-0.5, 0.5, seed=HASH_SEEDS["ev_column"])))
    column = tf.compat.v1.feature_column.embedding_column(
        categorical_column_with_embedding("ev_key", ev_option=option), DIM, combiner="mean")
    with scope(), tf.compat.v1.variable_scope("ev_column"):
        out = tf.compat.v1.feature_column.input_layer({"ev_key": f.sp_keys}, [column])
    return Built(out, [_column_table("ev_column")])


def _group(f: Features, scope, plain: bool) -> Built:
    with scope():
        tables = [_var("group_a", _const(37)), _var("group_b", _const(38))]
    ids, weights, combiners = [f.sp, f.sp], [None, f.sp_w], ["mean", "sqrtn"]
    if plain:
        # DeepRec's fused lookup is embedding_lookup_sparse per table, padded to the batch (build() pads).
        outs = [_to_batch(tf.nn.embedding_lookup_sparse(t, i, w, combiner=c), f.labels)
                for t, i, w, c in zip(tables, ids, weights, combiners)]
    else:
        from collective.group_embedding import group_embedding_lookup_sparse  # pylint: disable=import-outside-toplevel

        outs = group_embedding_lookup_sparse(tables, ids, combiners, sp_weights=weights)
    return Built(tf.concat(outs, 1), tables)


ENTRY_POINTS: Dict[str, Callable] = {
    "embedding_lookup": _lookup("embedding_lookup", lambda: _const(1)),
    **{f"sparse_{c}": _sparse(f"sparse_{c}", c, False) for c in ("sum", "mean", "sqrtn")},
    **{f"weighted_{c}": _sparse(f"weighted_{c}", c, True) for c in ("sum", "mean", "sqrtn")},
    "safe_mean": _safe("safe_mean", "mean", False),
    "safe_weighted_sqrtn": _safe("safe_weighted_sqrtn", "sqrtn", True),
    "embedding_column": _embedding_column,
    "shared_embedding_columns": _shared_columns,
    "hash_bucket_column": _hash_bucket_column,
    "tf1_seeded": _lookup("tf1_seeded", lambda: tf.compat.v1.random_uniform_initializer(-0.5, 0.5, seed=11)),
    "tf1_unseeded": _lookup("tf1_unseeded", lambda: tf.compat.v1.truncated_normal_initializer(stddev=0.5)),
    "tf2_seeded": _lookup("tf2_seeded", lambda: tf.random_normal_initializer(0.0, 0.5, seed=12)),
    "tf2_unseeded": _lookup("tf2_unseeded", lambda: tf.random_uniform_initializer(-0.5, 0.5)),
    "keras_seeded": _lookup("keras_seeded", lambda: tf.keras.initializers.RandomNormal(stddev=0.5, seed=13)),
    "keras_unseeded": _lookup("keras_unseeded", lambda: tf.keras.initializers.GlorotUniform()),
    "tensor_initializer": _tensor_initializer,
    "tf_variable": _tf_variable,
    "keras_add_weight": _keras_add_weight,
    "sok_dense": _sok_dense,
    "sok_sparse": _sok_sparse,
    "group_embedding_lookup_sparse": _group,
    "sok_hash_dense": _sok_hash_dense,
    "sok_hash_sparse": _sok_hash_sparse,
    "ev_column": _ev_column,
    "outside_scope": _outside_scope,
}
HASHED = ("sok_hash_dense", "sok_hash_sparse", "ev_column")
# Tables whose initial values the plain model computes itself; the others start from the workers' values.
SEEDED = tuple(n for n in ENTRY_POINTS if n not in HASHED and "unseeded" not in n and not n.startswith("sok_"))


def _to_batch(output: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """``output`` with zero rows appended up to the batch size: TensorFlow's ``embedding_lookup_sparse``
    leaves out the empty rows at the end of the batch."""
    missing = tf.shape(labels)[0] - tf.shape(output)[0]
    padded = tf.pad(output, [[0, missing], [0, 0]])
    padded.set_shape([None, output.shape[1]])
    return padded


class Model(NamedTuple):
    features: Features
    outputs: Dict[str, tf.Tensor]
    tables: Dict[str, List[tf.Variable]]
    dense: List[tf.Variable]
    loss: tf.Tensor


def entries_for(backend: str, n: int, tf1: bool = False) -> Tuple[str, ...]:
    """The entry points of the cell's model: one of two halves of :data:`ENTRY_POINTS`, the TF1 cell the other
    half than the TF2 cell of the same backend and N, so that each (backend, N) meets every entry point over
    the two behaviours; within a behaviour each backend meets every entry point over N and each N over the
    backends, and each half all three :data:`TF2_OPTIMIZERS` under TF2 and both :data:`TF1_OPTIMIZERS` under
    TF1 (:func:`optimizers_for`) over the cells."""
    half = (BACKENDS.index(backend) + WORKERS.index(n) // 2 + (1 if tf1 else 0)) % 2
    return tuple(name for i, name in enumerate(ENTRY_POINTS) if i % 2 == half)


def build(strategy=None, embedding_scope: Optional[Callable] = None, entries: Optional[Tuple[str, ...]] = None
          ) -> Model:
    """The ``entries`` (default: every entry point) on one set of placeholders, a linear head and a loss; plain
    TF when ``strategy`` is None."""
    plain = strategy is None
    scope = embedding_scope or (strategy.embedding_scope if strategy is not None else contextlib.nullcontext)
    f = placeholders()
    outputs, tables = {}, {}
    for name in entries or ENTRY_POINTS:
        built = ENTRY_POINTS[name](f, scope, plain)
        outputs[name], tables[name] = _to_batch(built.output, f.labels), built.tables
    unknown = [n for n, out in outputs.items() if out.shape.rank != 2 or out.shape[1] is None]
    assert not unknown, f"outputs without a static width: {unknown}"
    features = tf.concat(list(outputs.values()), 1)
    width = int(features.shape[1])
    w = tf.compat.v1.get_variable("head_w", [width, 1], initializer=tf.compat.v1.constant_initializer(
        np.linspace(-0.4, 0.4, width).reshape(-1, 1)))
    b = tf.compat.v1.get_variable("head_b", [1], initializer=tf.compat.v1.zeros_initializer())
    logits = tf.matmul(features, w) + b
    loss = (tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=f.labels, logits=logits))
            + 0.05 * tf.reduce_mean(tf.reduce_sum(tf.square(features), 1)))
    return Model(f, outputs, tables, [w, b], loss)


def table_key(entry: str, index: int) -> str:
    return f"{entry}#{index}"


def slot_values(sess, optimizer, var) -> Dict[str, np.ndarray]:
    """The optimizer's slots of ``var`` by slot name."""
    return {name: sess.run(optimizer.get_slot(var, name)) for name in sorted(optimizer.get_slot_names())
            if optimizer.get_slot(var, name) is not None}


def dense_gradient(grad, var) -> Optional[tf.Tensor]:
    """``grad`` (dense or IndexedSlices, rows of ``var``) as a dense tensor shaped like ``var``."""
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.math.unsorted_segment_sum(grad.values, grad.indices, tf.shape(var)[0])
    return tf.convert_to_tensor(grad)


def fast_start() -> tf.compat.v1.ConfigProto:
    """A session config without Grappler's passes and the classic graph optimizer (constant folding, common
    subexpressions): on this wide graph they take seconds for each new fetch and change nothing compared."""
    config = tf.compat.v1.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    config.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
    return config


class Plain(NamedTuple):
    """The plain single-process model with one optimizer, in its own graph and session."""

    session: tf.compat.v1.Session
    model: Model
    init: tf.Operation
    first: Dict[str, tf.Tensor]
    train_op: tf.Operation
    final: Dict[str, tf.Tensor]
    tables: Dict[str, tf.Variable]
    initial: Dict[str, np.ndarray]
    sparse_gradient: Dict[str, bool]


def _tables(model: Model) -> Dict[str, tf.Variable]:
    return {table_key(e, i): t for e, ts in model.tables.items() for i, t in enumerate(ts)}


def plain_model(optimizer_name: str, entries: Optional[Tuple[str, ...]] = None) -> Plain:
    """Builds the model of ``entries`` (default: all) in plain TensorFlow; ``initial`` holds its own initial
    tables."""
    return plain_models((optimizer_name,), entries)[optimizer_name]


def plain_models(optimizer_names: Tuple[str, ...], entries: Optional[Tuple[str, ...]] = None) -> Dict[str, Plain]:
    """:func:`plain_model` of each of ``optimizer_names``, in one graph and session: the model and its gradients
    are built once (most of the cost), each optimizer adds its slots and update; :func:`reference` starts each
    from the initial values, the other optimizers' slots untouched."""
    graph = tf.Graph()
    with graph.as_default():
        model = build(None, entries=entries)
        optimizers = {name: make_optimizer(name) for name in optimizer_names}
        grads = optimizers[optimizer_names[0]].compute_gradients(model.loss)
        tables = _tables(model)
        names = {id(t): k for k, t in tables.items()}
        names.update({id(v): v.op.name for v in model.dense})
        first = {f"out/{k}": v for k, v in model.outputs.items()}
        first.update({f"grad/{names[id(v)]}": dense_gradient(g, v) for g, v in grads if g is not None})
        sparse_gradient = {names[id(v)]: isinstance(g, tf.IndexedSlices) for g, v in grads if id(v) in names}
        updates = {}
        for name, optimizer in optimizers.items():
            train_op = optimizer.apply_gradients(grads)
            final = {f"final/{k}": t for k, t in tables.items()}
            final.update({f"final/{v.op.name}": v for v in model.dense})
            for key, table in tables.items():
                for slot in optimizer.get_slot_names():
                    if optimizer.get_slot(table, slot) is not None:
                        final[f"slot/{key}/{slot}"] = optimizer.get_slot(table, slot)
            updates[name] = (train_op, final)
        init = tf.group(tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer())
        session = tf.compat.v1.Session(graph=graph, config=fast_start())
        session.run(init)
        initial = session.run(tables)
    return {name: Plain(session, model, init, first, train_op, final, tables, initial, sparse_gradient)
            for name, (train_op, final) in updates.items()}


def reference(plain: Plain, initial: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Trains ``plain`` on the global batches from the tables ``initial`` (by table key): what the workers
    must give, as ``out/``, ``grad/``, ``final/``, ``slot/`` and ``losses``."""
    sess, model = plain.session, plain.model
    sess.run(plain.init)
    with sess.graph.as_default():
        for key, value in initial.items():
            plain.tables[key].load(value[:plain.tables[key].shape[0]], sess)
    results = sess.run(plain.first, feed_dict(model.features, global_batch(0), plain=True))
    losses = [sess.run([model.loss, plain.train_op], feed_dict(model.features, global_batch(step), plain=True))[0]
              for step in range(STEPS)]
    results.update(sess.run(plain.final))
    results["losses"] = np.array(losses)
    return results


def keys_used(entry: str) -> np.ndarray:
    """The hash keys ``entry`` sees over the ``STEPS`` global batches."""
    field = "keys" if entry == "sok_hash_dense" else "sp_keys"
    keys = np.unique(np.concatenate([global_batch(step)[field][-1].ravel() for step in range(STEPS)]))
    return keys[keys >= 0] if entry == "ev_column" else keys  # a categorical column drops negative keys
