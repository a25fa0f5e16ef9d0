"""Vocabulary policies on both backends: every case of ``policy_cases`` trained here; writes rank<r>.npz.

The ``admit`` case on ``hb`` also saves a full checkpoint after ``SAVE_AT`` steps and a
delta at the end; this job then restores, in a new session of the same graph, the
chain that ``prev_dir``'s job wrote (another worker count; this job's own with ``-``),
dumps the state, saves it in full and, in the 1-worker job, exports it as a
SavedModel. It also saves the ``admit`` model trained without a policy (first), and
restores ``prev_dir``'s such checkpoint into the table with the policy (after the chain).

argv: out_dir prev_dir|-
"""

import os
import sys

import numpy as np
import tensorflow as tf

import policy_cases as cases
from collective import CollectiveStrategy
from collective.checkpoint import Saver
from collective.embedding import hash_table

out_dir = sys.argv[1]
prev_dir = out_dir if sys.argv[2] == "-" else sys.argv[2]
results = {}
SAVE_AT = 5


def state_of(table, optimizer):
    """Tensors of this worker's rows: keys, values, usage, slots (held and whole), the counter table."""
    index = hash_table.table_of(table)
    dynamic = index.dynamic
    held_keys, held_rows = index.entries()
    state = {"keys": held_keys, "values": tf.gather(table, held_rows), "size": index.size(),
             "all_values": table.read_value()}
    if dynamic is not None:
        state["usage"] = tf.gather(dynamic.usage, held_rows)
    slots = [s for s, _ in dynamic.slots] if dynamic is not None and dynamic.slots else \
        [optimizer.get_slot(table, name) for name in optimizer.get_slot_names()]
    for slot in slots:
        name = slot.op.name.split("/")[-1]
        state[f"slot_{name}"] = tf.gather(slot, held_rows)
        state[f"all_slot_{name}"] = slot.read_value()
    if dynamic is not None and dynamic.counter is not None:
        counter_keys, counter_rows = dynamic.counter.entries()
        state["counter_keys"], state["counter_usage"] = counter_keys, tf.gather(dynamic.counter_usage, counter_rows)
    return held_keys, state


def train_case(strategy, backend: str, case: str) -> None:
    r, n = strategy.rank(), strategy.world_size()
    steps = cases.CASES[case][2]
    prefix = f"{backend}_{case}_"
    full = None
    with tf.Graph().as_default():
        table, keys, labels, loss, train_op, optimizer = cases.build(strategy, case, n, backend=backend)
        held_keys, state = state_of(table, optimizer)
        if case in cases.MTS_CASES:
            losses, per_step, final = train_monitored(strategy, prefix, keys, labels, loss, train_op, held_keys, state,
                                                      case, os.path.join(out_dir, f"mts_{backend}_{case}"))
        else:
            saver = Saver() if case == "admit" else None
            losses, per_step, final = train_plain(strategy, backend, case, keys, labels, loss, train_op, held_keys,
                                                  state, saver)
            if saver is not None and backend == "hb":
                full = restore(strategy, backend, state, saver)
    results[prefix + "losses"] = np.array(losses)
    results[prefix + "held_per_step"] = np.concatenate(per_step)
    results[prefix + "held_splits"] = np.cumsum([0] + [len(k) for k in per_step])
    for name, value in final.items():
        results[prefix + name] = value
    if full is not None:
        export(strategy, backend, full)


def train_plain(strategy, backend, case, keys, labels, loss, train_op, held_keys, state, saver):
    """A plain session; with ``saver`` (the ``admit`` case) a full save after SAVE_AT steps and a delta at the end."""
    r, n = strategy.rank(), strategy.world_size()
    steps = cases.CASES[case][2]
    ckpt = os.path.join(out_dir, f"ckpt_{backend}", "model")
    with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
        losses, per_step = [], []
        for step in range(steps):
            batch_keys, batch_labels = cases.local_batch(case, step, r, n)
            losses.append(sess.run([loss, train_op], {keys: batch_keys, labels: batch_labels})[0])
            if saver is not None and step + 1 == SAVE_AT:
                saver.save(sess, ckpt, global_step=step + 1)
            if saver is not None and step + 1 == steps:
                delta = saver.save_incremental(sess, ckpt, global_step=steps)
                if r == 0:
                    with open(os.path.join(out_dir, f"chain_{backend}.txt"), "w") as f:
                        f.write(delta)
                    results[f"{backend}_{case}_tombstones"] = tombstones(delta)
            per_step.append(sess.run(held_keys))
        return losses, per_step, sess.run(state)


def tombstones(delta: str) -> np.ndarray:
    """The keys delta ``delta`` marks evicted (those of table ``table``)."""
    reader = tf.compat.v1.train.NewCheckpointReader(delta)
    key = "table/tombstones/keys"
    return np.sort(reader.get_tensor(key)) if reader.has_tensor(key) else np.zeros([0], np.int64)


def train_monitored(strategy, prefix, keys, labels, loss, train_op, held_keys, state, case, model_dir):
    """MonitoredTrainingSession saving every 3 steps; rank 0 records each checkpoint's keys (``<prefix>saved_<step>``)."""
    r, n = strategy.rank(), strategy.world_size()
    losses, per_step = [], []
    with tf.compat.v1.train.MonitoredTrainingSession(checkpoint_dir=model_dir, save_checkpoint_steps=3,
                                                     save_checkpoint_secs=None, save_summaries_steps=None,
                                                     save_summaries_secs=None, log_step_count_steps=None,
                                                     save_graph_def=False) as sess:
        for step in range(cases.CASES[case][2]):
            batch_keys, batch_labels = cases.local_batch(case, step, r, n)
            losses.append(sess.run([loss, train_op], {keys: batch_keys, labels: batch_labels})[0])
            # The raw session: no hook runs, so a read triggers no save.
            per_step.append(sess.run_step_fn(lambda step_context: step_context.session.run(held_keys)))
        final = sess.run_step_fn(lambda step_context: step_context.session.run(state))
    if r == 0:
        for step in cases.SAVES[case]:
            reader = tf.compat.v1.train.NewCheckpointReader(os.path.join(model_dir, f"model.ckpt-{step}"))
            results[f"{prefix}saved_{step}"] = np.sort(reader.get_tensor("table/keys"))
    return losses, per_step, final


def restore(strategy, backend: str, state, saver) -> str:
    """Restores ``prev_dir``'s chain of the ``admit`` case into a new session of its graph (``state``, ``saver``),
    dumps it, saves it in full (the path returned), then restores ``prev_dir``'s checkpoint without a policy."""
    with open(os.path.join(prev_dir, f"chain_{backend}.txt")) as f:
        delta = f.read()
    prefix = f"{backend}_restored_"
    with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
        saver.restore(sess, delta)
        for name, value in sess.run(state).items():
            results[prefix + name] = value
        full = saver.save(sess, os.path.join(out_dir, f"full_{backend}", "model"), global_step=99)
        # prev_dir's checkpoint of the model trained without a policy, into the table with the policy.
        saver.restore(sess, os.path.join(prev_dir, "nopolicy", "model-3"))
        for name, value in sess.run(state).items():
            results[f"{backend}_unpoliced_" + name] = value
    return full


def export(strategy, backend: str, full: str) -> None:
    """Exports checkpoint ``full`` of the ``admit`` case as a SavedModel (in the 1-worker job)."""
    n = strategy.world_size()
    if n > 1:
        return  # the export of the 1-worker job is served in the test

    def signature_def_fn():
        table, _, _, _, _, _ = cases.build(strategy, "admit", n, with_optimizer=False)
        keys = tf.compat.v1.placeholder(tf.int64, [None], name="keys")
        return tf.compat.v1.saved_model.predict_signature_def({"keys": keys},
                                                              {"vectors": tf.nn.embedding_lookup(table, keys)})

    exported = strategy.export_saved_model(os.path.join(out_dir, f"export_{backend}"), full, signature_def_fn)
    results[f"{backend}_exported"] = np.array(exported.decode() if exported else "")


def train_without_policy(strategy) -> None:
    """The ``admit`` model trained 3 steps without a policy and saved in ``nopolicy/`` (``hb_nopolicy_``: its
    rows); :func:`restore` restores ``prev_dir``'s one into the table with the policy."""
    r, n = strategy.rank(), strategy.world_size()
    with tf.Graph().as_default():
        table, keys, labels, loss, train_op, _ = cases.build(strategy, "admit", n, policy={})
        index = hash_table.table_of(table)
        held_keys, held_rows = index.entries()
        slot = [v for v in tf.compat.v1.global_variables() if v.op.name == "table/Adagrad"][0]
        state = {"keys": held_keys, "values": tf.gather(table, held_rows), "slot_Adagrad": tf.gather(slot, held_rows)}
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            for step in range(3):
                batch_keys, batch_labels = cases.local_batch("admit", step, r, n)
                sess.run(train_op, {keys: batch_keys, labels: batch_labels})
            Saver().save(sess, os.path.join(out_dir, "nopolicy", "model"), global_step=3)
            for name, value in sess.run(state).items():
                results["hb_nopolicy_" + name] = value


def full_table_error(strategy, policy: dict, initial=None) -> str:
    """A lookup of 4 keys per worker into room for 2 (growing from ``initial``): the error, or "no error"."""
    n = strategy.world_size()
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        with strategy.embedding_scope():
            table = hash_table.hash_embedding_variable("tiny_table", cases.DIM, 2, initial_capacity_per_worker=initial,
                                                       **policy)
        out = tf.nn.embedding_lookup(table, tf.range(4 * n, dtype=tf.int64))
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            try:
                sess.run(out)
            except tf.errors.InvalidArgumentError as err:
                return err.message
    return "no error"


for backend in cases.BACKENDS:
    strategy = CollectiveStrategy(backend)
    with strategy.scope():
        if backend == "hb":
            train_without_policy(strategy)  # before the admit case, which restores prev_dir's
        for case in cases.BACKEND_CASES[backend]:
            train_case(strategy, backend, case)
        results[f"{backend}_full_error"] = np.array(full_table_error(strategy, {}))
        if backend == "hb":
            results[f"{backend}_full_error_grown"] = np.array(full_table_error(strategy, {}, initial=1))

np.savez(os.path.join(out_dir, f"rank{strategy.rank()}.npz"), **results)
