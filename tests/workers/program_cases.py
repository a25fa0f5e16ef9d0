"""Generated user programs (tests/test_programs.py draws them): their inputs and their model, built alike on N
workers and in one process.

A program is a JSON dict (see :func:`describe`): its tables (vocabulary,
width, entry point, regularizer, made outside ``embedding_scope()``), the
dense head's name (possibly a table's name), its regularizer, the optimizer
family, class, where it is built and how it is called, a gradient transform,
the loss reduction, TF1 behaviour, the backend, the engine, the number of
workers N and the number M it resumes on (0: it lives its first life only);
``packing`` (optional): its workers' graphs pack tables (docs/packing.md)
whatever ``COLLECTIVE_PACKING`` says.

Entry points (``entry``): ``lookup`` (``tf.nn.embedding_lookup`` of dense
ids [B, 2]), ``sparse_sum`` / ``sparse_mean`` (``tf.nn.embedding_lookup_sparse``),
``keras_embedding`` (a Keras ``Embedding`` layer), and the feature columns of
``input_layer``: ``column`` (``embedding_column`` of an identity column),
``weighted_column`` (of a ``weighted_categorical_column``), ``shared_column``
(``shared_embedding_columns`` over two features) and ``hash_column``
(``collective.hash_embedding_column.categorical_column_with_embedding``, with
or without a ``fixed_size_partitioner`` variable scope). A hash column's keys
come from :data:`KEY_POOL`; the one plain process stands it in with an
identity column over the pool's rows, initialised with each key's first
vector (``hash_cases.init_vectors``, the numpy twin of the key initializer),
and is fed pool rows instead of keys (:func:`plain_feed_batch`).

:class:`Model` builds the model on given input tensors (placeholders, an
Estimator's features or a serving signature's inputs), under a strategy
(``strategy`` given) or as plain TensorFlow (``strategy=None``), from the same
initial values. program_life.py makes it live.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import sys
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf

if str(pathlib.Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from hash_cases import MAXVAL, MINVAL, init_vectors  # noqa: E402  pylint: disable=wrong-import-position

BATCH, STEPS, LR = 12, 3, 0.2
WIDTH = 3  # ids per sample of the sparse entry points
DENSE_ENTRIES = ("lookup", "keras_embedding")  # ids [B, 2]; the others take ragged ids (rows, ids)
COLUMN_ENTRIES = ("column", "weighted_column", "shared_column", "hash_column")
# Hash keys: non-negative (a categorical column drops negative keys), small, large and extreme.
KEY_POOL = np.sort(np.array([0, 3, 31, 77, 123456789, 7 * 10 ** 14, 2 ** 40 + 1, np.iinfo(np.int64).max], np.int64))
SERVE_STEP = 99  # the serving batch is drawn like a training batch of this step


def describe(program: dict) -> str:
    """The program as a user would read it (printed by a failing test)."""
    return json.dumps(program, indent=1, sort_keys=True)


def engine(program: dict) -> str:
    """``session`` (a raw session and ``collective.checkpoint.Saver``), ``mts`` or ``estimator``."""
    return program.get("engine", "mts" if program["optimizer"]["family"] == "hb" else "session")


def has_global_step(program: dict) -> bool:
    return engine(program) != "session"


def _table_values(program: dict, t: int) -> np.ndarray:
    spec = program["tables"][t]
    return np.random.default_rng(program["seed"] * 10 + t).normal(0, 0.5, (spec["vocab"], spec["dim"])) \
        .astype(np.float32)


def _hash_salt(program: dict, t: int) -> int:
    return program["seed"] * 10 + t + 1


def _ragged(rng, values: np.ndarray):
    lengths = rng.integers(1, WIDTH + 1, BATCH)
    rows = np.repeat(np.arange(BATCH), lengths)
    return rows, rng.choice(values, lengths.sum())


def global_batch(program: dict, step: int) -> Dict[str, np.ndarray]:
    """Step ``step``'s inputs: per table dense ids ``ids<t>`` [B, 2] or ragged ``rows<t>``/``ids<t>`` (a shared
    column's second feature ``rows<t>b``/``ids<t>b``, a weighted column's weights ``w<t>``), and labels [B, 1].
    A hash column's ids are keys of :data:`KEY_POOL`."""
    rng = np.random.default_rng(program["seed"] * 1000 + step)
    batch = {"labels": rng.normal(0, 1, (BATCH, 1)).astype(np.float32)}
    for t, spec in enumerate(program["tables"]):
        values = KEY_POOL if spec["entry"] == "hash_column" else np.arange(spec["vocab"], dtype=np.int64)
        if spec["entry"] in DENSE_ENTRIES:
            batch[f"ids{t}"] = rng.choice(values, (BATCH, 2))
            continue
        batch[f"rows{t}"], batch[f"ids{t}"] = _ragged(rng, values)
        if spec["entry"] == "weighted_column":
            batch[f"w{t}"] = rng.uniform(0.5, 1.5, batch[f"ids{t}"].size).astype(np.float32)
        if spec["entry"] == "shared_column":
            batch[f"rows{t}b"], batch[f"ids{t}b"] = _ragged(rng, values)
    return batch


def serving_batch(program: dict) -> Dict[str, np.ndarray]:
    """The features the exports are served (no labels)."""
    batch = global_batch(program, SERVE_STEP)
    del batch["labels"]
    return batch


def plain_feed_batch(program: dict, batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """``batch`` for the one plain process: a hash column's keys become their rows in :data:`KEY_POOL`."""
    out = dict(batch)
    for t, spec in enumerate(program["tables"]):
        if spec["entry"] == "hash_column":
            out[f"ids{t}"] = np.searchsorted(KEY_POOL, batch[f"ids{t}"]).astype(np.int64)
    return out


def local_batch(program: dict, step: int, rank: int, size: int) -> Dict[str, np.ndarray]:
    """Worker ``rank``'s contiguous share of the global batch."""
    per = BATCH // size
    lo, hi = rank * per, (rank + 1) * per
    whole, out = global_batch(program, step), {}
    for key, value in whole.items():
        if key.startswith("rows"):
            suffix = key[4:]
            keep = (value >= lo) & (value < hi)
            out[key], out[f"ids{suffix}"] = value[keep] - lo, whole[f"ids{suffix}"][keep]
            if f"w{suffix}" in whole:
                out[f"w{suffix}"] = whole[f"w{suffix}"][keep]
        elif not ((key.startswith("ids") or key.startswith("w")) and value.ndim == 1):
            out[key] = value[lo:hi]
    return out


def input_signature(program: dict, labels: bool = True) -> Dict[str, tf.TensorSpec]:
    """Each input's dtype and shape (those of :func:`global_batch`)."""
    specs = {"labels": tf.TensorSpec([None, 1], tf.float32)} if labels else {}
    for t, spec in enumerate(program["tables"]):
        if spec["entry"] in DENSE_ENTRIES:
            specs[f"ids{t}"] = tf.TensorSpec([None, 2], tf.int64)
            continue
        suffixes = ("", "b") if spec["entry"] == "shared_column" else ("",)
        for suffix in suffixes:
            specs[f"rows{t}{suffix}"] = tf.TensorSpec([None], tf.int64)
            specs[f"ids{t}{suffix}"] = tf.TensorSpec([None], tf.int64)
        if spec["entry"] == "weighted_column":
            specs[f"w{t}"] = tf.TensorSpec([None], tf.float32)
    return specs


def placeholders(program: dict, labels: bool = True) -> Dict[str, tf.Tensor]:
    return {name: tf.compat.v1.placeholder(s.dtype, s.shape, name=name)
            for name, s in input_signature(program, labels).items()}


def _sparse(rows: tf.Tensor, values: tf.Tensor) -> tf.SparseTensor:
    """Ragged (rows, values) as a [B, WIDTH] SparseTensor; every sample has at least one id, so B = max(rows) + 1."""
    cols = tf.range(tf.size(rows, out_type=tf.int64)) - tf.gather(
        tf.concat([[0], tf.cumsum(tf.math.bincount(tf.cast(rows, tf.int32), dtype=tf.int64))], 0), rows)
    return tf.SparseTensor(tf.stack([rows, cols], 1), values, tf.stack([tf.reduce_max(rows) + 1, WIDTH]))


def _column_table(layer_scope: str) -> tf.Variable:
    [table] = [v for v in tf.compat.v1.global_variables() if v.op.name.startswith(layer_scope + "/")
               and v.op.name.endswith("embedding_weights")]
    return table


class Model:
    """The program's model on ``inputs``; ``loss`` when ``inputs`` holds labels, ``prediction`` always.

    ``tables`` are the embedding tables (a hash column's hash table on the workers, its stand-in in one process),
    ``dense`` the head's variables.
    """

    def __init__(self, program: dict, strategy, inputs: Dict[str, tf.Tensor]):
        self.program, self.plain = program, strategy is None
        self.tables: List[tf.Variable] = []
        embedding_scope = strategy.embedding_scope if strategy is not None else contextlib.nullcontext
        outputs = [self._table(t, spec, inputs, embedding_scope) for t, spec in enumerate(program["tables"])]
        features = tf.concat(outputs, axis=1)
        width = sum(2 * s["dim"] if s["entry"] in DENSE_ENTRIES + ("shared_column",) else s["dim"]
                    for s in program["tables"])
        kernel = np.random.default_rng(program["seed"] + 7).normal(0, 0.5, (width, 1)).astype(np.float32)
        dense_reg = program["dense_regularizer"]
        self.prediction = tf.compat.v1.layers.dense(
            features, 1, name=program["dense_name"], kernel_initializer=tf.compat.v1.constant_initializer(kernel),
            kernel_regularizer=(lambda v: dense_reg * tf.reduce_sum(tf.square(v))) if dense_reg else None)
        self.dense = [v for v in tf.compat.v1.trainable_variables() if v.op.name.startswith(program["dense_name"] + "/")
                      and all(v is not t for t in self.tables)]
        self.loss: Optional[tf.Tensor] = None
        # The number of workers whose steps one process repeats: N, then M after a resume (fed).
        self.workers = tf.compat.v1.placeholder_with_default(np.float32(program["workers"]), [], name="workers")
        if "labels" in inputs:
            errors = tf.square(self.prediction - inputs["labels"])
            if program["reduction"] == "mean":
                loss = tf.reduce_mean(errors)
            else:  # per worker a sum; one process trains the same on sum / N (docs/support.md, the loss contract)
                loss = tf.reduce_sum(errors) / (self.workers if self.plain else 1)
            self.loss = loss + tf.compat.v1.losses.get_regularization_loss()

    def _table(self, t: int, spec: dict, inputs: Dict[str, tf.Tensor], embedding_scope) -> tf.Tensor:
        init = tf.compat.v1.constant_initializer(_table_values(self.program, t))
        entry, ids = spec["entry"], inputs[f"ids{t}"]
        if entry == "keras_embedding":
            layer = tf.keras.layers.Embedding(spec["vocab"], spec["dim"], embeddings_initializer=init,
                                              name=spec["name"])
            with embedding_scope():
                layer.build(None)
            self.tables.append(layer.embeddings)
            return tf.reshape(layer(ids), [-1, 2 * spec["dim"]])
        if entry in COLUMN_ENTRIES:
            return self._column(t, spec, inputs, embedding_scope)
        reg = (lambda c: (lambda v: c * tf.reduce_sum(tf.square(v))))(spec["regularizer"]) \
            if spec["regularizer"] else None
        with (contextlib.nullcontext() if spec.get("outside") else embedding_scope()):
            table = tf.compat.v1.get_variable(spec["name"], [spec["vocab"], spec["dim"]], initializer=init,
                                              regularizer=reg)
        self.tables.append(table)
        if entry == "lookup":
            return tf.reshape(tf.nn.embedding_lookup(table, ids), [-1, 2 * spec["dim"]])
        return tf.nn.embedding_lookup_sparse(table, _sparse(inputs[f"rows{t}"], ids), None,
                                             combiner=entry.split("_")[1])

    def _column(self, t: int, spec: dict, inputs: Dict[str, tf.Tensor], embedding_scope) -> tf.Tensor:
        fc = tf.compat.v1.feature_column
        name, entry = spec["name"], spec["entry"]
        sparse = _sparse(inputs[f"rows{t}"], inputs[f"ids{t}"])
        features = {name: sparse}
        partitioner = None
        if entry == "hash_column" and self.plain:
            column = fc.embedding_column(fc.categorical_column_with_identity(name, len(KEY_POOL)), spec["dim"],
                                         combiner="mean", initializer=tf.compat.v1.constant_initializer(
                                             init_vectors(KEY_POOL, _hash_salt(self.program, t), dim=spec["dim"])))
            columns = [column]
        elif entry == "hash_column":
            from collective.hash_embedding_column import (  # pylint: disable=import-outside-toplevel
                EmbeddingVariableOption, InitializerOption, categorical_column_with_embedding)

            option = EmbeddingVariableOption(capacity_per_worker=32, init_option=InitializerOption(
                tf.compat.v1.random_uniform_initializer(MINVAL, MAXVAL, seed=_hash_salt(self.program, t))))
            columns = [fc.embedding_column(categorical_column_with_embedding(name, ev_option=option), spec["dim"],
                                           combiner="mean")]
            if spec.get("partitioner"):
                partitioner = tf.compat.v1.fixed_size_partitioner(2)
        else:
            init = tf.compat.v1.constant_initializer(_table_values(self.program, t))
            identity = fc.categorical_column_with_identity(name, spec["vocab"])
            if entry == "column":
                columns = [fc.embedding_column(identity, spec["dim"], combiner="mean", initializer=init)]
            elif entry == "weighted_column":
                features[f"{name}_w"] = tf.SparseTensor(sparse.indices, inputs[f"w{t}"], sparse.dense_shape)
                columns = [fc.embedding_column(fc.weighted_categorical_column(identity, f"{name}_w"), spec["dim"],
                                               combiner="sqrtn", initializer=init)]
            else:
                features[f"{name}_b"] = _sparse(inputs[f"rows{t}b"], inputs[f"ids{t}b"])
                columns = fc.shared_embedding_columns(
                    [identity, fc.categorical_column_with_identity(f"{name}_b", spec["vocab"])], spec["dim"],
                    combiner="sum", initializer=init, shared_embedding_collection_name=f"{name}_shared")
        scope_name = f"columns{t}"
        with embedding_scope(), tf.compat.v1.variable_scope(scope_name, partitioner=partitioner):
            out = fc.input_layer(features, columns)
        if entry == "shared_column":
            [table] = [v for v in tf.compat.v1.global_variables() if f"{name}_shared" in v.op.name]
        else:
            table = _column_table(scope_name)
        self.tables.append(table)
        return out


def optimizer_for(program: dict, plain: bool):
    family, kind = program["optimizer"]["family"], program["optimizer"]["kind"]
    if family in ("v1", "hb"):
        if family == "hb" and not plain:
            import collective.hb as hb  # pylint: disable=import-outside-toplevel

            module = hb.train
        else:
            module = tf.compat.v1.train
        return {"sgd": lambda: module.GradientDescentOptimizer(LR),
                "adagrad": lambda: module.AdagradOptimizer(LR, initial_accumulator_value=0.1),
                "adam": lambda: module.AdamOptimizer(LR / 4),
                "momentum": lambda: module.MomentumOptimizer(LR, 0.9)}[kind]()
    keras = tf.keras.optimizers.legacy if family == "keras_legacy" else tf.keras.optimizers
    clip = {"keras_clipnorm": {"global_clipnorm": program["clip"]},
            "keras_clipnorm_each": {"clipnorm": program["clip"]}}.get(program["transform"], {})
    return {"sgd": lambda: keras.SGD(LR, **clip),
            "adagrad": lambda: keras.Adagrad(LR, initial_accumulator_value=0.1, **clip),
            "adam": lambda: keras.Adam(LR / 4, **clip), "momentum": lambda: keras.SGD(LR, momentum=0.9, **clip)}[kind]()


def _transform(program: dict, pairs: List[tuple]) -> List[tuple]:
    kind = program["transform"]
    grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
    if kind == "clip_global":
        grads, _ = tf.clip_by_global_norm(grads, program["clip"])
    elif kind == "clip_value":
        grads = [tf.clip_by_value(tf.convert_to_tensor(g), -program["clip"], program["clip"]) for g in grads]
    elif kind == "scale":
        grads = [g * 0.5 if not isinstance(g, tf.IndexedSlices)
                 else tf.IndexedSlices(g.values * 0.5, g.indices, g.dense_shape) for g in grads]
    return list(zip(grads, variables))


def train_op(program: dict, model: Model, optimizer, step=None):
    """The program's update; it advances ``step`` (a global step) where one is given."""
    call = program["optimizer"]["call"]
    variables = model.tables + model.dense
    keras = program["optimizer"]["family"].startswith("keras")
    at = {"global_step": step} if step is not None and not keras else {}
    if call == "minimize":
        op = optimizer.minimize(model.loss, var_list=variables, **at)
    else:
        if call == "compute_apply":
            pairs = optimizer.compute_gradients(model.loss, var_list=variables)
        else:
            grads = tf.gradients(model.loss, variables)
            if model.plain and program["tf1"]:
                # Ungated, one process's updates race its backward pass's reads of reference variables, and its
                # result varies from run to run (docs/support.md); the workers train what it trains gated.
                grads = tf.tuple(grads)
            pairs = list(zip(grads, variables))
        op = optimizer.apply_gradients(_transform(program, pairs), **at)
    if keras and step is not None:
        with tf.control_dependencies([op]):
            return tf.compat.v1.assign_add(step, 1).op
    return op


def slots(optimizer, table) -> Dict[str, tf.Variable]:
    from collective.sok.slots import slot_variables  # pylint: disable=import-outside-toplevel

    return slot_variables(optimizer, table)


def layout(program: dict, t: int, table) -> str:
    """How the workers hold table ``t``: ``whole`` (every worker a copy), ``rows`` (row i on worker i % N),
    ``columns`` (every row, a slice of its dims, on each worker), ``held<r>`` (whole on worker r, none elsewhere)
    or ``hash`` (compared through the checkpoint)."""
    if program["tables"][t]["entry"] == "hash_column":
        return "hash"
    from collective.embedding.table import shard_of  # pylint: disable=import-outside-toplevel

    info = shard_of(table)
    if info is None or info.replicated:
        return "whole"
    if info.column_wise:
        return "columns"
    return "rows" if info.holder is None else f"held{info.holder}"


def placement(program: dict, t: int, world_size: int) -> Optional[str]:
    """Table ``t``'s drawn placement where it is legal on ``world_size`` workers, else None (the default plan).

    ``row_wise`` is the default; ``column_wise`` needs a dense table of at least one column per worker and no
    deltas (a program that resumes saves them); a table made outside ``embedding_scope()`` is never planned.
    """
    spec = program["tables"][t]
    wanted = spec.get("placement", "row_wise")
    if wanted == "row_wise" or spec.get("outside"):
        return None
    if wanted == "column_wise" and (spec["entry"] == "hash_column" or spec["dim"] < world_size
                                    or program.get("resume")):
        return None
    return wanted


def _is_table(graph_name: str, name: str) -> bool:
    """Whether the planned table ``graph_name`` is the program's table ``name`` (``item``, ``columns0/input_layer/
    item_embedding/embedding_weights``, ``item/embeddings``, a shared column's ``item_shared``...)."""
    return any(part == name or part.startswith(name + "_") for part in graph_name.split("/"))


def strategy_for(program: dict):
    """The program's strategy on this launch's workers, its tables placed as drawn (:func:`placement`)."""
    from collective import CollectiveStrategy  # pylint: disable=import-outside-toplevel

    strategy = CollectiveStrategy(program["backend"])
    wanted = {s["name"]: placement(program, t, strategy.world_size()) for t, s in enumerate(program["tables"])}
    if not any(wanted.values()):
        return strategy
    return CollectiveStrategy(program["backend"], sharding=lambda table: next(
        (where for name, where in wanted.items() if where and _is_table(table.name, name)), None))


def error_text(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"[:2000]
