"""The life of a generated program (program_cases), on N then M workers, and of the one plain process beside it.

First life (:func:`first_life`, every worker of the N-launch): ``STEPS`` steps
and a full checkpoint (a raw session's ``collective.checkpoint.Saver``, or the
engine's own: MonitoredTrainingSession's and the Estimator's saver hooks), and
for a program that lives on, one more step saved as a delta
(``save_incremental`` or the engines' ``save_incremental_checkpoint_steps`` /
``incremental_save_steps``). MonitoredTrainingSession and the Estimator also
save a full checkpoint when they end, so their resume starts from it; the raw
session resumes through the chain (full + delta).

Second life (:func:`second_life`, every worker of the M-launch): the newest
complete chain restored on M workers, ``RESUMED`` more steps, a full
checkpoint, an export of it (version 1: ``strategy.export_saved_model`` or the
Estimator's ``export_saved_model``), ``UPDATED`` more steps saved as a delta,
and a serving update from it (version 2: ``update_saved_model``).

The one plain process (:func:`plain_life`, rank 0 of the launch where the
program's life ends) lives the same life on the global batches: at each full
checkpoint's step it restores that checkpoint with TensorFlow's own ``Saver``
(``restored<k>/...`` against its own values ``at<k>/...``; a hash table's
checkpointed keys, rows and slot rows against its stand-in's rows of those
keys, which the restore leaves alone), and
after the export's and the update's steps it predicts the serving batch
(``serve1``, ``serve2``), which the tests compare with what plain TensorFlow
serves from versions 1 and 2.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Dict, List

import numpy as np
import tensorflow as tf

import program_cases as pc

RESUMED, UPDATED = 2, 1


def first_steps(program: dict) -> int:
    """Steps of the first life: ``STEPS``, and one more saved as a delta for a program that lives on."""
    return pc.STEPS + (1 if program.get("resume") else 0)


def total_steps(program: dict) -> int:
    return first_steps(program) + (RESUMED + UPDATED if program.get("resume") else 0)


@contextlib.contextmanager
def behaviour(program: dict):
    """TF1 behaviour (``disable_v2_behavior``: ref variables) or TF2's, for the program's graphs."""
    if program["tf1"]:
        tf.compat.v1.disable_v2_behavior()
    else:
        tf.compat.v1.enable_v2_behavior()
    try:
        yield
    finally:
        tf.compat.v1.enable_v2_behavior()


class _Built:
    """The program's graph as a feed-dict engine (raw session, MonitoredTrainingSession) runs it."""

    def __init__(self, program: dict, strategy, step: bool):
        plain = strategy is None
        recipe = program["optimizer"]["family"] == "hb"
        scope = strategy.scope if strategy is not None else contextlib.nullcontext
        self.step = tf.compat.v1.train.get_or_create_global_step() if step else None
        where = program["optimizer"]["where"]
        optimizer = pc.optimizer_for(program, plain) if where == "outside" else None
        self.inputs = pc.placeholders(program)
        with scope():
            self.model = pc.Model(program, strategy, self.inputs)
            if optimizer is None:
                optimizer = pc.optimizer_for(program, plain)
            if where != "outside" or not recipe:
                self.train_op = pc.train_op(program, self.model, optimizer, self.step)
        if where == "outside" and recipe:  # HybridBackend's recipe: the update built outside hb.scope()
            self.train_op = pc.train_op(program, self.model, optimizer, self.step)
        self.optimizer = optimizer
        self.layouts = [pc.layout(program, t, table) for t, table in enumerate(self.model.tables)]
        fixed = [t for t, kind in enumerate(self.layouts) if kind != "hash"]
        self.fetch = {**{f"table/{t}": self.model.tables[t] for t in fixed},
                      **{f"dense/{i}": v for i, v in enumerate(self.model.dense)},
                      **{f"slot/{t}/{name}": slot for t in fixed
                         for name, slot in sorted(pc.slots(optimizer, self.model.tables[t]).items())}}

    def feed(self, batch: Dict[str, np.ndarray]) -> dict:
        return {placeholder: batch[key] for key, placeholder in self.inputs.items() if key in batch}


def _local(program: dict, step: int, rank: int, size: int) -> Dict[str, np.ndarray]:
    return pc.local_batch(program, step, rank, size)


def _run_steps(sess, built: _Built, program: dict, steps: range, rank: int, size: int) -> List[float]:
    return [sess.run([built.model.loss, built.train_op], built.feed(_local(program, i, rank, size)))[0]
            for i in steps]


@contextlib.contextmanager
def _mts(program: dict, strategy, model_dir: str, incremental: bool):
    kwargs = dict(checkpoint_dir=model_dir, save_checkpoint_steps=1000, save_summaries_steps=None,
                  save_summaries_secs=None, log_step_count_steps=None,
                  save_incremental_checkpoint_steps=1 if incremental else None)
    if program["optimizer"]["family"] == "hb":
        import collective.hb as hb  # pylint: disable=import-outside-toplevel

        session = hb.train.MonitoredTrainingSession(**kwargs)
        with session as sess:
            yield sess
        return
    with strategy.scope():  # where tf.compat.v1.train.MonitoredTrainingSession is collective's
        with tf.compat.v1.train.MonitoredTrainingSession(**kwargs) as sess:
            yield sess


def _hash_names(built_tables, program: dict) -> Dict[str, str]:
    return {str(t): table.op.name if hasattr(table, "op") else table.name.split(":")[0]
            for t, table in enumerate(built_tables) if program["tables"][t]["entry"] == "hash_column"}


def _write(path: str, record: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f)


def first_life(program: dict, strategy, rank: int, model_dir: str) -> Dict[str, np.ndarray]:
    """Trains and checkpoints the first life; returns ``losses`` and the final ``table/``, ``slot/``, ``dense/``
    values (an Estimator's: ``losses`` only). Rank 0 writes ``<model_dir>/life1.json`` (the full checkpoint)."""
    n, kind, steps = program["workers"], pc.engine(program), first_steps(program)
    delta = bool(program.get("resume"))
    out: Dict[str, np.ndarray] = {}
    with behaviour(program):
        if kind == "estimator":
            losses, names = _estimator_train(program, strategy, rank, model_dir, range(steps), delta)
        else:
            with tf.Graph().as_default():
                built = _Built(program, strategy, pc.has_global_step(program))
                names = _hash_names(built.model.tables, program)
                out["layout"] = np.array(built.layouts)
                if kind == "session":
                    from collective.checkpoint import Saver  # pylint: disable=import-outside-toplevel

                    with tf.compat.v1.Session() as sess:
                        sess.run([tf.compat.v1.global_variables_initializer(),
                                  tf.compat.v1.local_variables_initializer()])
                        saver = Saver()
                        losses = _run_steps(sess, built, program, range(pc.STEPS), rank, n)
                        saver.save(sess, os.path.join(model_dir, "model.ckpt"), global_step=pc.STEPS)
                        losses += _run_steps(sess, built, program, range(pc.STEPS, steps), rank, n)
                        if delta:
                            saver.save_incremental(sess, os.path.join(model_dir, "model.ckpt"), global_step=steps)
                        out.update(sess.run(built.fetch))
                else:
                    with _mts(program, strategy, model_dir, delta) as sess:
                        losses = _run_steps(sess, built, program, range(steps), rank, n)
                        out.update(sess.run(built.fetch))
        if rank == 0:
            _write(os.path.join(model_dir, "life1.json"),
                   {"full": tf.train.latest_checkpoint(model_dir), "hash": names})
    out["losses"] = np.array(losses, np.float64)
    return out


def _signature(program: dict, strategy):
    def build():
        inputs = pc.placeholders(program, labels=False)
        model = pc.Model(program, strategy, inputs)
        return tf.compat.v1.saved_model.predict_signature_def(inputs, {"prediction": model.prediction})

    return build


def second_life(program: dict, strategy, rank: int, model_dir: str, export_dir: str) -> Dict[str, np.ndarray]:
    """Resumes on this launch's M workers, trains, saves, exports, trains, saves a delta and updates the export.

    Returns ``losses``; rank 0 writes ``<model_dir>/life2.json`` (the full checkpoint and both versions)."""
    from collective.checkpoint import latest_incremental_checkpoint  # pylint: disable=import-outside-toplevel
    from collective.integration.serving_update import update_saved_model  # pylint: disable=import-outside-toplevel

    m, kind, start = program["resume"], pc.engine(program), first_steps(program)
    resumed, updated = range(start, start + RESUMED), range(start + RESUMED, start + RESUMED + UPDATED)
    delta = os.path.join(model_dir, f"model.ckpt-{updated[-1] + 1}.delta")
    with behaviour(program):
        if kind == "estimator":
            losses, _ = _estimator_train(program, strategy, rank, model_dir, resumed, False)
            full = tf.train.latest_checkpoint(model_dir)
            v1 = _estimator(program, strategy, model_dir, False).export_saved_model(
                export_dir, _receiver(program))
            more, _ = _estimator_train(program, strategy, rank, model_dir, updated, True)
            losses += more
        elif kind == "session":
            from collective.checkpoint import Saver  # pylint: disable=import-outside-toplevel

            with tf.Graph().as_default():
                built = _Built(program, strategy, False)
                with tf.compat.v1.Session() as sess:
                    sess.run([tf.compat.v1.global_variables_initializer(),
                              tf.compat.v1.local_variables_initializer()])
                    saver = Saver()
                    saver.restore(sess, latest_incremental_checkpoint(model_dir))
                    losses = _run_steps(sess, built, program, resumed, rank, m)
                    full = saver.save(sess, os.path.join(model_dir, "model.ckpt"), global_step=resumed[-1] + 1)
                    with strategy.scope():
                        v1 = strategy.export_saved_model(export_dir, full, _signature(program, strategy))
                    losses += _run_steps(sess, built, program, updated, rank, m)
                    saver.save_incremental(sess, os.path.join(model_dir, "model.ckpt"), global_step=updated[-1] + 1)
        else:
            losses = []
            for steps, incremental in ((resumed, False), (updated, True)):
                with tf.Graph().as_default():
                    built = _Built(program, strategy, True)
                    with _mts(program, strategy, model_dir, incremental) as sess:
                        losses += _run_steps(sess, built, program, steps, rank, m)
                if not incremental:
                    full = tf.train.latest_checkpoint(model_dir)
                    with strategy.scope():
                        v1 = strategy.export_saved_model(export_dir, full, _signature(program, strategy))
        v2 = update_saved_model(export_dir, delta)
        if rank == 0:
            _write(os.path.join(model_dir, "life2.json"), {"full": full, "v1": v1.decode(), "v2": v2.decode()})
    return {"losses": np.array(losses, np.float64)}


class _Losses(tf.compat.v1.train.SessionRunHook):
    """Each step's loss, as the Estimator's train() runs it."""

    def __init__(self):
        self.losses: List[float] = []
        self._loss = None

    def begin(self):
        self._loss = tf.compat.v1.get_collection("program_loss")[0]

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._loss)

    def after_run(self, run_context, run_values):
        self.losses.append(float(run_values.results))


def _model_fn(program: dict, strategy):
    def model_fn(features, labels, mode):
        inputs = dict(features)
        if labels is not None:
            inputs["labels"] = labels
        model = pc.Model(program, strategy, inputs)
        if mode == tf.estimator.ModeKeys.PREDICT:
            outputs = {"prediction": model.prediction}
            return tf.estimator.EstimatorSpec(mode, predictions=outputs, export_outputs={
                "serving_default": tf.estimator.export.PredictOutput(outputs)})
        tf.compat.v1.add_to_collection("program_loss", model.loss)
        op = pc.train_op(program, model, pc.optimizer_for(program, False), tf.compat.v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=model.loss, train_op=op)

    return model_fn


def _estimator(program: dict, strategy, model_dir: str, incremental: bool):
    config = tf.estimator.RunConfig(save_checkpoints_steps=1000, save_summary_steps=1000, log_step_count_steps=1000)
    return strategy.estimator(_model_fn(program, strategy), model_dir, config=config,
                              incremental_save_steps=1 if incremental else None)


def _estimator_train(program: dict, strategy, rank: int, model_dir: str, steps: range, incremental: bool):
    signature = pc.input_signature(program)
    labels_spec = signature.pop("labels")
    n = strategy.world_size()

    def input_fn():
        def batches():
            for i in steps:
                batch = _local(program, i, rank, n)
                yield {k: batch[k] for k in signature}, batch["labels"]

        return tf.data.Dataset.from_generator(batches, output_signature=(signature, labels_spec))

    hook = _Losses()
    estimator = _estimator(program, strategy, model_dir, incremental)
    estimator.train(input_fn, hooks=[hook], max_steps=steps[-1] + 1)
    names = {}
    if any(s["entry"] == "hash_column" for s in program["tables"]):
        names = {str(t): name for t, name in _estimator_hash_names(program, model_dir).items()}
    return hook.losses, names


def _estimator_hash_names(program: dict, model_dir: str) -> Dict[int, str]:
    """The hash columns' table names in the checkpoint (the ``<name>/keys`` entries, one per hash column)."""
    stored = sorted(name[:-len("/keys")] for name, _ in tf.train.list_variables(model_dir)
                    if name.endswith("/keys") and not name.startswith("_collective"))
    return {t: next(n for n in stored if n.startswith(f"columns{t}/"))
            for t, s in enumerate(program["tables"]) if s["entry"] == "hash_column"}


def _receiver(program: dict):
    def receiver():
        inputs = pc.placeholders(program, labels=False)
        return tf.estimator.export.ServingInputReceiver(inputs, inputs)

    return receiver


def _read_record(model_dir: str, name: str) -> dict:
    path = os.path.join(model_dir, name)
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _compare_checkpoint(sess, built: _Built, program: dict, checkpoint: str, hash_names: Dict[str, str],
                        tag: str) -> Dict[str, np.ndarray]:
    """``at<tag>/...`` (this process's values) and ``restored<tag>/...`` (the checkpoint's, read by TF's ``Saver``;
    a hash table's rows and slot rows by key, from ``tf.train.load_variable``)."""
    out = {f"at{tag}/{k}": v for k, v in sess.run(built.fetch).items()}
    stand_ins = {t: built.model.tables[int(t)] for t in hash_names}
    slots = {t: pc.slots(built.optimizer, table) for t, table in stand_ins.items()}
    # A stand-in's slots are its rows too: legacy Keras names them "<optimizer>/<table>/m", outside the table's
    # scope, and TF's Saver would write the checkpoint's rows (in key order) over them (issue 42's legacy Keras row).
    names = {v.op.name for v in stand_ins.values()}
    skip = {slot.op.name for found in slots.values() for slot in found.values()}
    keep = [v for v in tf.compat.v1.global_variables() if v.op.name not in skip
            and not any(v.op.name == name or v.op.name.startswith(name + "/") for name in names)]
    tf.compat.v1.train.Saver(var_list=keep).restore(sess, checkpoint)
    out.update({f"restored{tag}/{k}": v for k, v in sess.run(built.fetch).items()})
    for t, name in hash_names.items():
        keys = tf.train.load_variable(checkpoint, f"{name}/keys")
        rows = np.searchsorted(pc.KEY_POOL, keys)
        assert np.array_equal(pc.KEY_POOL[np.minimum(rows, len(pc.KEY_POOL) - 1)], keys), \
            f"{checkpoint}: table {name} holds keys that no batch had: {sorted(set(keys) - set(pc.KEY_POOL))}"
        out[f"at{tag}/hash/{t}"] = sess.run(built.model.tables[int(t)])[rows]
        out[f"restored{tag}/hash/{t}"] = tf.train.load_variable(checkpoint, name)
        for slot_name, slot in slots[t].items():  # each slot's rows, stored in the keys' order
            stored = slot.op.name.replace(stand_ins[t].op.name, name)
            out[f"at{tag}/hashslot/{t}/{slot_name}"] = sess.run(slot)[rows]
            out[f"restored{tag}/hashslot/{t}/{slot_name}"] = tf.train.load_variable(checkpoint, stored)
        out[f"at{tag}/hashkeys/{t}"] = np.sort(np.unique(np.concatenate([
            pc.global_batch(program, i)[f"ids{t}"].reshape(-1) for i in range(_step_of(checkpoint))])))
        out[f"restored{tag}/hashkeys/{t}"] = np.sort(keys)
    return out


def _step_of(checkpoint: str) -> int:
    return int(checkpoint.rsplit("-", 1)[1])


def require_trained(initial: Dict[str, np.ndarray], now: Dict[str, np.ndarray], steps: int) -> None:
    """Raises unless every table (hash tables aside) and dense weight of the plain process moved: a program whose
    one process trains nothing compares untrained models and cannot fail on training."""
    still = sorted(k for k in initial if np.array_equal(initial[k], now[k]))
    if still:
        raise RuntimeError(f"the plain process trained nothing into {still} in {steps} steps: its optimizer's "
                           "update never ran, so this program cannot fail on training; draw a program that trains")


def plain_life(program: dict, model_dir: str) -> Dict[str, np.ndarray]:
    """The one plain process's life on the global batches (see the module docstring)."""
    life1, life2 = _read_record(model_dir, "life1.json"), _read_record(model_dir, "life2.json")
    restores = {}
    if life1.get("full"):
        restores[_step_of(life1["full"])] = (life1["full"], "1")
    if life2.get("full"):
        restores[_step_of(life2["full"])] = (life2["full"], "2")
    hash_names = life1.get("hash", {})
    serve = pc.plain_feed_batch(program, pc.serving_batch(program))
    out: Dict[str, np.ndarray] = {}
    with behaviour(program), tf.Graph().as_default():
        built = _Built(program, None, pc.has_global_step(program))
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            trained = {k: v for k, v in built.fetch.items() if k.startswith(("table/", "dense/"))}
            initial = sess.run(trained)
            losses = []
            for i in range(total_steps(program)):
                feed = built.feed(pc.plain_feed_batch(program, pc.global_batch(program, i)))
                if i >= first_steps(program) and program.get("resume"):
                    feed[built.model.workers] = program["resume"]
                losses.append(sess.run([built.model.loss, built.train_op], feed)[0])
                if i + 1 in restores:
                    checkpoint, tag = restores[i + 1]
                    out.update(_compare_checkpoint(sess, built, program, checkpoint, hash_names, tag))
                if i + 1 == first_steps(program):
                    out.update({f"life1/{k}": v for k, v in sess.run(built.fetch).items()})
                    require_trained(initial, sess.run(trained), i + 1)
                if program.get("resume") and i + 1 == first_steps(program) + RESUMED:
                    out["serve1"] = sess.run(built.model.prediction, built.feed(serve))
            if program.get("resume"):
                out["serve2"] = sess.run(built.model.prediction, built.feed(serve))
    out["losses"] = np.array(losses, np.float64)
    return out


def _guarded(results: Dict[str, np.ndarray], prefix: str, fn) -> bool:
    try:
        for key, value in fn().items():
            results[f"{prefix}/{key}"] = value
        return True
    except Exception as err:  # pylint: disable=broad-except
        results[f"{prefix}/error"] = np.array(pc.error_text(err))
        return False


def _packing(program: dict):
    """A program with ``packing`` builds its graphs with packed tables whatever ``COLLECTIVE_PACKING`` says."""
    if not program.get("packing"):
        return contextlib.nullcontext()
    from collective.embedding import packing  # pylint: disable=import-outside-toplevel

    return packing.using(True)


def run_all(programs: List[dict], rank: int, work_dir: str, life: int) -> Dict[str, np.ndarray]:
    """Every program of this launch, keyed ``<index>/dist/...`` and (rank 0) ``<index>/plain/...``.

    ``life`` 1: the first life of the programs on this launch's N workers, and the plain process of those that do
    not live on; 2: the second life of the programs resumed on this launch's M workers, and their plain process.
    """
    results: Dict[str, np.ndarray] = {}
    for program in programs:
        i = program["index"]
        model_dir = os.path.join(work_dir, f"program{i}", "model")
        export_dir = os.path.join(work_dir, f"program{i}", "export")
        os.makedirs(model_dir, exist_ok=True)
        strategy = pc.strategy_for(program)
        if life == 1:
            with _packing(program):
                _guarded(results, f"{i}/dist", lambda: first_life(program, strategy, rank, model_dir))
        elif os.path.exists(os.path.join(model_dir, "life1.json")):
            with _packing(program):
                _guarded(results, f"{i}/dist", lambda: second_life(program, strategy, rank, model_dir, export_dir))
        else:
            results[f"{i}/dist/error"] = np.array("its first life failed: nothing to resume")
        if rank == 0 and (life == 2 or not program.get("resume")):
            _guarded(results, f"{i}/plain", lambda: plain_life(program, model_dir))
    return results
