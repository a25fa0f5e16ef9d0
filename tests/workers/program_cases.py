"""Generated user programs (tests/test_programs.py draws them), built alike on N workers and in one process.

A program is a JSON dict (see :func:`describe`): its tables (vocabulary,
width, lookup entry point, regularizer, made outside ``embedding_scope()``), the dense head's name (possibly a
table's name), its regularizer, the optimizer family, class, where it is
built and how it is called, a gradient transform, the loss reduction, TF1
behaviour, the backend and the number of workers. :func:`train` builds and
trains it under ``CollectiveStrategy`` on this worker's share of each global
batch (``strategy`` given) or as plain single-process TensorFlow on the whole
batch (``strategy=None``), from the same initial values, and returns the
losses and the final tables, slots and dense weights.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Dict, List

import numpy as np
import tensorflow as tf

BATCH, STEPS, LR = 12, 3, 0.2
WIDTH = 3  # ids per sample of the sparse entry points


def describe(program: dict) -> str:
    """The program as a user would read it (printed by a failing test)."""
    return json.dumps(program, indent=1, sort_keys=True)


def _table_values(program: dict, t: int) -> np.ndarray:
    spec = program["tables"][t]
    return np.random.default_rng(program["seed"] * 10 + t).normal(0, 0.5, (spec["vocab"], spec["dim"])) \
        .astype(np.float32)


def global_batch(program: dict, step: int) -> Dict[str, np.ndarray]:
    """Step ``step``'s inputs: per table dense ids [B, 2] or ragged ids (rows, ids), and labels [B, 1]."""
    rng = np.random.default_rng(program["seed"] * 1000 + step)
    batch = {"labels": rng.normal(0, 1, (BATCH, 1)).astype(np.float32)}
    for t, spec in enumerate(program["tables"]):
        if spec["entry"] in ("lookup", "keras_embedding"):
            batch[f"ids{t}"] = rng.integers(0, spec["vocab"], (BATCH, 2))
        else:
            lengths = rng.integers(1, WIDTH + 1, BATCH)
            batch[f"rows{t}"] = np.repeat(np.arange(BATCH), lengths)
            batch[f"ids{t}"] = rng.integers(0, spec["vocab"], lengths.sum())
    return batch


def local_batch(program: dict, step: int, rank: int, size: int) -> Dict[str, np.ndarray]:
    """Worker ``rank``'s contiguous share of the global batch."""
    per = BATCH // size
    lo, hi = rank * per, (rank + 1) * per
    whole, out = global_batch(program, step), {}
    for key, value in whole.items():
        if key.startswith("rows"):
            keep = (value >= lo) & (value < hi)
            out[key], out[f"ids{key[4:]}"] = value[keep] - lo, whole[f"ids{key[4:]}"][keep]
        elif not (key.startswith("ids") and value.ndim == 1):
            out[key] = value[lo:hi]
    return out


def _optimizer(program: dict, plain: bool):
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
    clip = {"global_clipnorm": program["clip"]} if program["transform"] == "keras_clipnorm" else {}
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


class _Model:
    def __init__(self, program: dict, strategy):
        self.program, self.plain = program, strategy is None
        self.inputs, self.tables = {}, []
        self.labels = tf.compat.v1.placeholder(tf.float32, [None, 1], name="labels")
        outputs = []
        embedding_scope = strategy.embedding_scope if strategy is not None else contextlib.nullcontext
        for t, spec in enumerate(program["tables"]):
            init = tf.compat.v1.constant_initializer(_table_values(program, t))
            reg = (lambda c: (lambda v: c * tf.reduce_sum(tf.square(v))))(spec["regularizer"]) \
                if spec["regularizer"] else None
            ids = tf.compat.v1.placeholder(tf.int64, [None, 2] if spec["entry"] in ("lookup", "keras_embedding")
                                           else [None], name=f"ids{t}")
            self.inputs[f"ids{t}"] = ids
            if spec["entry"] == "keras_embedding":
                layer = tf.keras.layers.Embedding(spec["vocab"], spec["dim"], embeddings_initializer=init,
                                                  name=spec["name"])
                with embedding_scope():
                    layer.build(None)
                self.tables.append(layer.embeddings)
                outputs.append(tf.reshape(layer(ids), [-1, 2 * spec["dim"]]))
                continue
            with (contextlib.nullcontext() if spec.get("outside") else embedding_scope()):
                table = tf.compat.v1.get_variable(spec["name"], [spec["vocab"], spec["dim"]], initializer=init,
                                                  regularizer=reg)
            self.tables.append(table)
            if spec["entry"] == "lookup":
                outputs.append(tf.reshape(tf.nn.embedding_lookup(table, ids), [-1, 2 * spec["dim"]]))
            else:
                rows = tf.compat.v1.placeholder(tf.int64, [None], name=f"rows{t}")
                self.inputs[f"rows{t}"] = rows
                cols = tf.range(tf.size(rows, out_type=tf.int64)) - tf.gather(
                    tf.concat([[0], tf.cumsum(tf.math.bincount(tf.cast(rows, tf.int32), dtype=tf.int64))], 0),
                    rows)
                batch = tf.shape(self.labels, out_type=tf.int64)[0]
                sparse = tf.SparseTensor(tf.stack([rows, cols], 1), ids, tf.stack([batch, WIDTH]))
                combiner = spec["entry"].split("_")[1]
                outputs.append(tf.nn.embedding_lookup_sparse(table, sparse, None, combiner=combiner))
        features = tf.concat(outputs, axis=1)
        width = sum(2 * s["dim"] if s["entry"] in ("lookup", "keras_embedding") else s["dim"]
                    for s in program["tables"])
        kernel = np.random.default_rng(program["seed"] + 7).normal(0, 0.5, (width, 1)).astype(np.float32)
        dense_reg = program["dense_regularizer"]
        pred = tf.compat.v1.layers.dense(
            features, 1, name=program["dense_name"], kernel_initializer=tf.compat.v1.constant_initializer(kernel),
            kernel_regularizer=(lambda v: dense_reg * tf.reduce_sum(tf.square(v))) if dense_reg else None)
        errors = tf.square(pred - self.labels)
        if program["reduction"] == "mean":
            loss = tf.reduce_mean(errors)
        else:  # per worker a sum; one process trains the same on sum / N (docs/support.md, the loss contract)
            loss = tf.reduce_sum(errors) / (program["workers"] if self.plain else 1)
        self.loss = loss + tf.compat.v1.losses.get_regularization_loss()
        self.dense = [v for v in tf.compat.v1.trainable_variables() if v.op.name.startswith(program["dense_name"] + "/")
                      and all(v is not t for t in self.tables)]

    def feed(self, batch: Dict[str, np.ndarray]) -> dict:
        feed = {self.labels: batch["labels"]}
        for key, placeholder in self.inputs.items():
            feed[placeholder] = batch[key]
        return feed


def _train_op(program: dict, model: _Model, optimizer, step=None):
    call = program["optimizer"]["call"]
    variables = model.tables + model.dense
    at = {"global_step": step} if step is not None else {}
    if call == "minimize":
        return optimizer.minimize(model.loss, var_list=variables, **at)
    if call == "compute_apply":
        pairs = optimizer.compute_gradients(model.loss, var_list=variables)
    else:
        pairs = list(zip(tf.gradients(model.loss, variables), variables))
    return optimizer.apply_gradients(_transform(program, pairs), **at)


def _slots(optimizer, table) -> Dict[str, tf.Variable]:
    from collective.sok.slots import slot_variables  # pylint: disable=import-outside-toplevel

    return slot_variables(optimizer, table)


def train(program: dict, strategy=None, rank: int = 0, checkpoint: str = "") -> Dict[str, np.ndarray]:
    """Builds and trains ``program``; results keyed ``losses``, ``table/<t>``, ``slot/<t>/<name>``, ``dense/<i>``.

    With ``checkpoint`` (a folder), the workers save the trained model there and the plain process, after
    training, restores the latest checkpoint with TensorFlow's own ``Saver``: ``restored/...`` holds what it
    read. ``hb.train`` programs run as HybridBackend's recipe does, in ``hb.train.MonitoredTrainingSession``
    with a global step, which saves at the end; the others save with ``collective.checkpoint.Saver``.
    """
    if program["tf1"]:
        tf.compat.v1.disable_v2_behavior()
    else:
        tf.compat.v1.enable_v2_behavior()
    n = program["workers"] if strategy is not None else 1
    plain = strategy is None
    recipe = program["optimizer"]["family"] == "hb"
    scope = strategy.scope if strategy is not None else contextlib.nullcontext
    try:
        with tf.Graph().as_default():
            step = tf.compat.v1.train.get_or_create_global_step() if recipe else None
            optimizer = None
            if program["optimizer"]["where"] == "outside":
                optimizer = _optimizer(program, plain)
            with scope():
                model = _Model(program, strategy)
                if optimizer is None:
                    optimizer = _optimizer(program, plain)
                if program["optimizer"]["where"] != "outside" or not recipe:
                    train_op = _train_op(program, model, optimizer, step)
            if program["optimizer"]["where"] == "outside" and recipe:
                train_op = _train_op(program, model, optimizer, step)  # HybridBackend's recipe: outside hb.scope()
            slots = {f"slot/{t}/{name}": slot for t, table in enumerate(model.tables)
                     for name, slot in sorted(_slots(optimizer, table).items())}
            fetch = {**{f"table/{t}": table for t, table in enumerate(model.tables)},
                     **{f"dense/{i}": v for i, v in enumerate(model.dense)}, **slots}
            with _session(plain, recipe, checkpoint) as sess:
                losses = []
                for i in range(STEPS):
                    batch = local_batch(program, i, rank, n) if not plain else global_batch(program, i)
                    losses.append(sess.run([model.loss, train_op], model.feed(batch))[0])
                out = sess.run(fetch)
                if checkpoint and not plain and not recipe:
                    from collective.checkpoint import Saver  # pylint: disable=import-outside-toplevel

                    Saver().save(sess, os.path.join(checkpoint, "model.ckpt"))
                elif checkpoint and plain:
                    tf.compat.v1.train.Saver().restore(sess, tf.train.latest_checkpoint(checkpoint))
                    out.update({f"restored/{k}": v for k, v in sess.run(fetch).items()})
            out["losses"] = np.array(losses, np.float64)
            out["layout"] = np.array([_layout(t) for t in model.tables])
            return out
    finally:
        tf.compat.v1.enable_v2_behavior()


@contextlib.contextmanager
def _session(plain: bool, recipe: bool, checkpoint: str):
    if recipe and not plain:
        import collective.hb as hb  # pylint: disable=import-outside-toplevel

        with hb.train.MonitoredTrainingSession(checkpoint_dir=checkpoint or None, save_summaries_steps=None,
                                               save_summaries_secs=None, log_step_count_steps=None) as sess:
            yield sess
        return
    with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
        yield sess


def _layout(table) -> str:
    from collective.embedding.table import shard_of  # pylint: disable=import-outside-toplevel

    info = shard_of(table)
    return "whole" if info is None or info.replicated else "rows"


def strategy_for(program: dict):
    from collective import CollectiveStrategy  # pylint: disable=import-outside-toplevel

    return CollectiveStrategy(program["backend"])


def error_text(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"[:2000]


def run_all(programs: List[dict], rank: int, out_dir: str) -> Dict[str, np.ndarray]:
    """Every program on this worker (and in one process on rank 0): results keyed ``<i>/dist/...``, ``<i>/plain/...``.

    Each program's workers also checkpoint it, and the plain process restores that checkpoint.
    """
    results: Dict[str, np.ndarray] = {}
    for i, program in enumerate(programs):
        checkpoint = os.path.join(out_dir, f"program{i}")
        try:
            for key, value in train(program, strategy_for(program), rank, checkpoint).items():
                results[f"{i}/dist/{key}"] = value
        except Exception as err:  # pylint: disable=broad-except
            results[f"{i}/dist/error"] = np.array(error_text(err))
        if rank == 0:
            try:
                restore = checkpoint if f"{i}/dist/error" not in results else ""
                for key, value in train(program, checkpoint=restore).items():
                    results[f"{i}/plain/{key}"] = value
            except Exception as err:  # pylint: disable=broad-except
                results[f"{i}/plain/error"] = np.array(error_text(err))
    return results
