"""Writes and restores checkpoints with collective.checkpoint.Saver: dense tables on every backend and a
hash-table vocabulary (sok), all in one launch.

argv: base_dir write|nowrite|reference [source_world_size ...]
- write: trains 2 steps on this world size's share of the global batches and
  saves <base>/<case>/n<N>/model.ckpt-2 (case: hb, sok, replicated, sok-hash).
- each source S (for sok's and replicated's dense tables only S, N in TWO_PAIRS): restores <base>/<case>/n<S>/model.ckpt-2 under this world
  size, trains step 2 and saves <base>/<case>/from<S>to<N>/model.ckpt-3.
- reference: also trains the hash model 4 steps uninterrupted into <base>/sok-hash/uninterrupted (model.ckpt-3
  and model.ckpt-4).
- the hash table's chain across placements: on 3 workers (write) it restores sok-hash/n2/model.ckpt-2 placed
  table_wise, trains step 2 and saves sok-hash/table-wise-2to3/model.ckpt-3; on 1 worker (nowrite) that restores
  row-wise, trains step 3 and saves sok-hash/chain-to1/model.ckpt-4.
"""

import os
import sys

import tensorflow as tf

import checkpoint_cases
import embedding_cases as cases
import host_probe
from collective import CollectiveStrategy
from collective.checkpoint import Saver

# The on-disk layout does not depend on the backend: sok's and replicated's dense tables restore two pairs.
TWO_PAIRS = {(2, 3), (3, 2)}
base, mode, sources = sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3:]]
host_probe.record()  # tests/test_hosts.py: where each worker runs


def dense_model(strategy):
    _, train, feed = checkpoint_cases.build(strategy)
    return train, lambda step, r, n: feed(cases.local_batch(step, r, n))


def run(strategy, model, restore_from, steps, save_to, save_after=()):
    """Trains ``steps`` (restoring ``restore_from`` first) and saves into ``save_to`` after the last one, and after
    each of ``save_after``."""
    r, n = strategy.rank(), strategy.world_size()
    with strategy.scope(), tf.Graph().as_default():
        train, feed = model(strategy)
        global_step = tf.compat.v1.train.get_global_step()
        saver = Saver()
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            if restore_from:
                saver.restore(sess, restore_from)
            for step in steps:
                assert sess.run(global_step) == step
                sess.run(train, feed(step, r, n))
                if step in save_after:
                    saver.save(sess, os.path.join(save_to, "model.ckpt"), global_step=global_step)
            saver.save(sess, os.path.join(save_to, "model.ckpt"), global_step=global_step)


# CHECKPOINT_CASES=case,...: only those cases (tests/test_hosts.py checks no more).
CASES = os.environ.get("CHECKPOINT_CASES", "hb,sok,replicated,sok-hash").split(",")
for case, backend, model in (("hb", "hb", dense_model), ("sok", "sok", dense_model),
                             ("replicated", "replicated", dense_model),
                             ("sok-hash", "sok", checkpoint_cases.build_hash)):
    if case not in CASES:
        continue
    strategy = CollectiveStrategy(backend)
    n = strategy.world_size()
    if mode in ("write", "reference"):
        run(strategy, model, None, [0, 1], os.path.join(base, case, f"n{n}"))
    if mode == "reference" and case == "sok-hash":
        run(strategy, model, None, [0, 1, 2, 3], os.path.join(base, case, "uninterrupted"), save_after=(2,))
    if case == "sok-hash" and mode == "write" and n == 3:
        table_wise = CollectiveStrategy(backend, sharding={"item": "table_wise"})
        run(table_wise, model, os.path.join(base, case, "n2", "model.ckpt-2"), [2],
            os.path.join(base, case, "table-wise-2to3"))
    if case == "sok-hash" and mode == "nowrite" and n == 1:
        run(strategy, model, os.path.join(base, case, "table-wise-2to3", "model.ckpt-3"), [3],
            os.path.join(base, case, "chain-to1"))
    for source in sources:
        if case in ("sok", "replicated") and (source, n) not in TWO_PAIRS:
            continue
        run(strategy, model, os.path.join(base, case, f"n{source}", "model.ckpt-2"), [2],
            os.path.join(base, case, f"from{source}to{n}"))
host_probe.record_exchange()
