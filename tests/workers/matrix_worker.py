"""The differential matrix under CollectiveStrategy; writes <out>/<backend>/rank<r>.npz.

argv: out_dir backend[,backend...] [tf1]; one launch serves every backend. In
``cases.TABLE_WISE_CELLS`` the tables are placed table_wise, in ``cases.COLUMN_WISE_CELLS`` the dense ones
column_wise (``cases.sharding_for``). A
backend ``hb-api`` builds the model through HybridBackend's API instead
(``hb.embedding_scope()`` and ``hb.train`` optimizers). With ``tf1`` the
process runs with TF1 behaviour (``disable_v2_behavior()``: ref variables,
v1 control flow). Each backend builds its cell's entry points
(``cases.entries_for``) and trains with its cell's optimizers
(``cases.optimizers_for``).
"""

import os
import sys

import numpy as np
import tensorflow as tf

import matrix_cases as cases
from collective import CollectiveStrategy
from collective.embedding import hash_table
from collective.embedding.table import shard_of
from collective.integration.training import average_gradients

tf.get_logger().setLevel("ERROR")  # feature columns are deprecated; the matrix tests them anyway
out_dir, backends = sys.argv[1], sys.argv[2].split(",")
TF1 = sys.argv[3:] == ["tf1"]
if TF1:
    tf.compat.v1.disable_v2_behavior()
FAST_START = cases.fast_start()


def strategy_for(backend):
    if backend == "hb-api":
        import collective.hb as hb

        return hb.strategy(), hb.embedding_scope, hb.train
    strategy = CollectiveStrategy(backend)
    sharding = cases.sharding_for(backend, strategy.world_size(), TF1)
    if sharding is not None:
        strategy = CollectiveStrategy(backend, sharding=sharding)
    return strategy, strategy.embedding_scope, tf.compat.v1.train


def holder(table) -> np.ndarray:
    """The rank holding the whole of a table-wise ``table``, else -1."""
    info = shard_of(table)
    return np.array(-1 if info is None or info.holder is None else info.holder)


def train_each_optimizer(strategy, scope, train_module, optimizers, entries):
    """Builds the model of ``entries`` once, then trains it from its initial values with each of ``optimizers``
    in turn.

    Results are keyed ``<optimizer>/<what>/<table>``; the forward and gradient graph is shared (building it
    is most of the cost), each optimizer adds its own slots and update ops. Each step fetches the forward
    values and averaged gradients with the loss: one executor per optimizer (a new fetch costs seconds on
    this graph); step 0's are the values before any update.
    """
    r, n = strategy.rank(), strategy.world_size()
    results = {}
    with tf.Graph().as_default():
        model = cases.build(strategy, scope, entries)
        grads = cases.make_optimizer(optimizers[0], train_module).compute_gradients(model.loss)
        fixed = {cases.table_key(e, i): t for e, ts in model.tables.items() if e not in cases.HASHED
                 for i, t in enumerate(ts)}
        hashed = {cases.table_key(e, i): t for e, ts in model.tables.items() if e in cases.HASHED
                  for i, t in enumerate(ts)}
        by_var = {id(t): k for k, t in fixed.items()}
        by_var.update({id(v): v.op.name for v in model.dense})
        averaged = {by_var[id(v)]: cases.dense_gradient(g, v) for g, v in average_gradients(grads)
                    if id(v) in by_var and g is not None}
        kinds = {by_var[id(v)]: np.array(isinstance(g, tf.IndexedSlices)) for g, v in grads if id(v) in by_var}
        kinds.update({cases.table_key(e, 0): np.array(isinstance(g, tf.IndexedSlices)) for g, v in grads
                      for e in cases.HASHED if e in model.tables and v is model.tables[e][0]})
        first = {**{f"out/{k}": v for k, v in model.outputs.items()},
                 **{f"grad/{k}": v for k, v in averaged.items()}}
        final = {f"final/{key}": table for key, table in fixed.items()}
        final.update({f"final/{var.op.name}": var for var in model.dense})
        for key, table in hashed.items():
            keys, rows = hash_table.table_of(table).entries()
            final[f"hash_keys/{key}"], final[f"hash_values/{key}"] = keys, tf.gather(table, rows)
        runs = []
        for name in optimizers:
            optimizer = cases.make_optimizer(name, train_module)
            train_op = optimizer.apply_gradients(grads)
            slots = {f"slot/{key}/{slot}": optimizer.get_slot(table, slot) for key, table in fixed.items()
                     for slot in optimizer.get_slot_names() if optimizer.get_slot(table, slot) is not None}
            runs.append((name, train_op, slots))
        init = [tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()]
        with tf.compat.v1.Session(config=FAST_START) as sess:
            for name, train_op, slots in runs:
                sess.run(init)  # every table, hash index and slot back to its initial value
                out = {f"sparse_gradient/{k}": v for k, v in kinds.items()}
                out.update(sess.run({f"init/{key}": table for key, table in fixed.items()}))
                for key, table in fixed.items():
                    out[f"replicated/{key}"] = np.array(shard_of(table) is None or shard_of(table).layout.replicated)
                for key, table in {**fixed, **hashed}.items():
                    out[f"holder/{key}"] = holder(table)
                    out[f"columns/{key}"] = np.array(bool(shard_of(table) and shard_of(table).column_wise))
                    out[f"dim/{key}"] = np.array(shard_of(table).dim if shard_of(table) else -1)
                losses = []
                for step in range(cases.STEPS):
                    feed = cases.feed_dict(model.features, cases.local_batch(step, r, n), plain=False)
                    loss, values, _ = sess.run([model.loss, first, train_op], feed)
                    losses.append(loss)
                    if step == 0:
                        out.update(values)
                out["losses"] = np.array(losses)
                out.update(sess.run({**final, **slots}))
                results.update({f"{name}/{key}": value for key, value in out.items()})
    return results


BAD_IDS = {"negative": [1, -3], "too_large": [2, cases.VOCAB + 4]}


def refusals(strategy, scope):
    """Every worker looks up bad ids through each entry point; the error texts by ``err/<entry>/<kind>``.

    One graph, fed each kind of bad ids in turn.
    """
    import collective.sok as sok
    from collective.group_embedding import group_embedding_lookup_sparse

    results = {}
    with tf.Graph().as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [2])
        sp = tf.SparseTensor([[0, 0], [1, 0]], ids, [2, 1])
        with scope():
            table = tf.compat.v1.get_variable("user_table", [cases.VOCAB, cases.DIM])
        layer = sok.All2AllDenseEmbedding(max_vocabulary_size_per_gpu=cases.VOCAB // strategy.world_size(),
                                          embedding_vec_size=cases.DIM, slot_num=1, nnz_per_slot=1,
                                          use_hashtable=False, name="sok_table")
        attempts = {"embedding_lookup": tf.nn.embedding_lookup(table, ids),
                    "embedding_lookup_sparse": tf.nn.embedding_lookup_sparse(table, sp, None),
                    "group_embedding_lookup_sparse": group_embedding_lookup_sparse([table], [sp], ["sum"])[0],
                    "sok_layer": layer(tf.reshape(ids * strategy.world_size(), [-1, 1, 1]))}
        with tf.compat.v1.Session(config=FAST_START) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for kind, bad in BAD_IDS.items():
                for entry, tensor in attempts.items():
                    try:
                        sess.run(tensor, {ids: bad})
                        results[f"err/{entry}/{kind}"] = np.array("no error")
                    except tf.errors.InvalidArgumentError as err:
                        said = [line for line in err.message.splitlines() if "embedding table" in line]
                        results[f"err/{entry}/{kind}"] = np.array((said or [err.message])[0][:400])
    return results


def run(backend):
    strategy, scope, train_module = strategy_for(backend)
    results = {}
    with strategy.scope():
        n = strategy.world_size()
        results.update(train_each_optimizer(strategy, scope, train_module, cases.optimizers_for(backend, n, TF1),
                                            cases.entries_for(backend, n, TF1)))
        if backend != "hb-api":
            results.update(refusals(strategy, scope))
    path = os.path.join(out_dir, backend)
    os.makedirs(path, exist_ok=True)
    np.savez(os.path.join(path, f"rank{strategy.rank()}.npz"), **results)


for name in backends:
    run(name)
