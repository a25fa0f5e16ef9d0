"""The serving-update tests' schedule: incremental_cases' model, its chain, SavedModel versions from the chain.

``write_versions`` trains the chain (a full save at step 2, deltas at 3, 5
and 6) and, without a break, the same steps with a full save every step;
rank 0 then exports version 1 from the chain's base, updates it to version 2
from the delta of step 5 (deltas 3 and 5) and to version 3 from the delta of
step 6, and exports steps 5 and 6 the ordinary way from the full checkpoints.
"""

import json
import os

import numpy as np
import tensorflow as tf

try:
    import incremental_cases as ic  # a worker: tests/workers is on sys.path
except ImportError:
    from workers import incremental_cases as ic

UNSEEN_KEY = 777  # never trained: served as zeros by every version


def signature_def_fn(strategy):
    """The serving signature: ids [B, 2] of ``t`` and keys [B, 2] of ``item`` -> prediction and looked-up rows."""
    from collective.embedding.hash_table import hash_embedding_variable  # pylint: disable=import-outside-toplevel

    def build():
        ids = tf.compat.v1.placeholder(tf.int64, [None, 2], name="ids")
        keys = tf.compat.v1.placeholder(tf.int64, [None, 2], name="keys")
        with strategy.embedding_scope():
            t = tf.compat.v1.get_variable("t", [ic.VOCAB, ic.DIM])
            item = hash_embedding_variable("item", dim=ic.DIM, capacity_per_worker=32)
        t_rows, item_rows = tf.nn.embedding_lookup(t, ids), tf.nn.embedding_lookup(item, keys)
        features = tf.concat([tf.reshape(t_rows, [-1, 2 * ic.DIM]), tf.reshape(item_rows, [-1, 2 * ic.DIM])], 1)
        w = tf.compat.v1.get_variable("w", [4 * ic.DIM, 1])
        b = tf.compat.v1.get_variable("b", [1])
        prediction = tf.matmul(tf.nn.relu(features), w) + b
        return tf.compat.v1.saved_model.predict_signature_def(
            {"ids": ids, "keys": keys}, {"prediction": prediction, "t_rows": t_rows, "item_rows": item_rows})

    return build


def serving_inputs() -> dict:
    """Every row of ``t`` and every key of ``item`` (and one never trained), as the signature's inputs."""
    ids = np.arange(ic.VOCAB, dtype=np.int64).reshape(-1, 2)
    keys = np.resize(np.append(ic.KEYS, UNSEEN_KEY), ids.shape).astype(np.int64)
    return {"ids": ids, "keys": keys}


def write_versions(strategy, out: str) -> dict:
    """Trains the chain and the reference; on rank 0 writes the versions. Returns {name: SavedModel folder}."""
    from collective.integration.serving_update import update_saved_model  # pylint: disable=import-outside-toplevel

    model, reference = os.path.join(out, "model"), os.path.join(out, "reference")
    ic.train_chain(strategy, model)
    ic.train_chain(strategy, reference, full_every_step=True)
    if strategy.rank() != 0:
        return {}
    with strategy.scope():
        export = os.path.join(out, "export")
        versions = {"v1": strategy.export_saved_model(export, os.path.join(model, f"model.ckpt-{ic.BASE_STEP}"),
                                                      signature_def_fn(strategy))}
        versions["v2"] = update_saved_model(export, os.path.join(model, "model.ckpt-5.delta"))
        versions["v3"] = update_saved_model(export, model)  # a model_dir: its newest delta, step 6
        for step in (5, 6):
            versions[f"full{step}"] = strategy.export_saved_model(
                os.path.join(out, f"export_full{step}"), os.path.join(reference, f"model.ckpt-{step}"),
                signature_def_fn(strategy))
    versions = {name: path.decode() for name, path in versions.items()}
    with open(os.path.join(out, "versions.json"), "w") as f:
        json.dump(versions, f)
    return versions
