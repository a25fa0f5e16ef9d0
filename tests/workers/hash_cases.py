"""Hash-table data, models and references shared by the hash workers and the tests.

Workers build the model on hash tables (keys of any int64 value) on their
share of each global batch; the tests build the same model in plain
single-process TensorFlow on the whole batch, with one ordinary variable row
per distinct key, initialised from :func:`init_vectors` (an independent numpy
twin of ``collective.embedding.key_init``), and compare.
"""

import pathlib
import sys

import numpy as np
import tensorflow as tf

if str(pathlib.Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from embedding_cases import make_optimizer, sparse_value  # noqa: E402  pylint: disable=wrong-import-position

DIM, BATCH, STEPS, CAPACITY = 4, 12, 3, 64
MINVAL, MAXVAL = -0.5, 0.5
SEEDS = {"t1": 7, "t2": 8, "lookup": 9}
OPTIMIZERS = ("Adagrad", "Adam")
# The optimizer whose run places both tables table_wise in each launch (backend, N), the other one training
# them row-wise: each backend and each N meets both optimizers table-wise, at no extra training.
TABLE_WISE = {("hb", 1): "Adagrad", ("hb", 2): "Adam", ("hb", 3): "Adagrad",
              ("sok", 1): "Adam", ("sok", 2): "Adagrad", ("sok", 3): "Adam"}
INT64_MAX, INT64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min
# Keys every step draws from: negative, extreme and ordinary ones.
POOL = np.array([0, 1, -1, -7, 5, 12, INT64_MAX, INT64_MIN, INT64_MAX - 1, 123456789012345, -98765432109,
                 2 ** 40 + 3, 31, -2 ** 62], np.int64)

_M1, _M2, _GOLDEN = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53), np.uint64(0x9E3779B97F4A7C15)


def _fmix(k):
    s = np.uint64(33)
    with np.errstate(over="ignore"):
        k = k ^ (k >> s)
        k = k * _M1
        k = k ^ (k >> s)
        k = k * _M2
        return k ^ (k >> s)


def init_vectors(keys, salt, minval=MINVAL, maxval=MAXVAL, dim=DIM):
    """First vectors of ``keys`` under a uniform initializer: numpy twin of ``key_init``."""
    k = np.asarray(keys, np.int64).reshape(-1).view(np.uint64)
    with np.errstate(over="ignore"):
        h = _fmix(k ^ np.uint64(salt))
        steps = np.arange(1, dim + 1, dtype=np.uint64) * _GOLDEN
        bits = _fmix(h[:, None] + steps[None, :])
    u = ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53
    return (minval + (maxval - minval) * u).astype(np.float32)


def global_batch(step: int):
    """Dense keys [B, 2], sparse keys (rows, keys, weights) with 1-3 keys per row, labels [B, 1]."""
    rng = np.random.default_rng(300 + step)
    fresh = rng.integers(-10 ** 15, 10 ** 15, 4)  # keys first seen in this step
    pool = np.concatenate([POOL, fresh])
    dense = rng.choice(pool, (BATCH, 2))
    dense[0, :] = POOL[6]  # max int64, repeated across rows and workers
    lengths = rng.integers(1, 4, BATCH)
    rows = np.repeat(np.arange(BATCH), lengths)
    keys = rng.choice(pool, rows.size)
    weights = rng.uniform(0.5, 2.0, rows.size).astype(np.float32)
    labels = rng.integers(0, 2, (BATCH, 1)).astype(np.float32)
    return dense, (rows, keys, weights), labels


def local_batch(step: int, rank: int, size: int):
    """Worker ``rank``'s contiguous share of the global batch."""
    dense, (rows, keys, weights), labels = global_batch(step)
    per = BATCH // size
    lo, hi = rank * per, (rank + 1) * per
    keep = (rows >= lo) & (rows < hi)
    return dense[lo:hi], (rows[keep] - lo, keys[keep], weights[keep]), labels[lo:hi]


def uniform(seed):
    return tf.compat.v1.random_uniform_initializer(MINVAL, MAXVAL, seed=seed)


def build_model(optimizer_name, make_tables):
    """Model on placeholders; ``make_tables()`` gives ``(t1, t2, to_ids)`` where ``to_ids`` maps keys to lookup ids."""
    dense_ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
    sp_ids = tf.compat.v1.sparse_placeholder(tf.int64, [None, 3])
    sp_weights = tf.compat.v1.sparse_placeholder(tf.float32, [None, 3])
    labels = tf.compat.v1.placeholder(tf.float32, [None, 1])
    t1, t2, to_ids = make_tables()
    e1 = tf.reshape(tf.nn.embedding_lookup(t1, dense_ids), [-1, 2 * DIM])
    e2 = tf.nn.embedding_lookup_sparse(t2, sp_ids, sp_weights, combiner="mean")
    w = tf.compat.v1.get_variable("w", [3 * DIM, 1], initializer=tf.compat.v1.constant_initializer(
        np.linspace(-0.3, 0.3, 3 * DIM).reshape(-1, 1)))
    b = tf.compat.v1.get_variable("b", [1], initializer=tf.compat.v1.zeros_initializer())
    logits = tf.matmul(tf.nn.relu(tf.concat([e1, e2], 1)), w) + b
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    train_op = make_optimizer(optimizer_name).minimize(loss)

    def feed(batch):
        dense, (rows, keys, weights), lab = batch
        return {dense_ids: to_ids("t1", dense), sp_ids: sparse_value(rows, to_ids("t2", keys), len(dense)),
                sp_weights: sparse_value(rows, weights, len(dense)), labels: lab}

    return loss, train_op, (t1, t2), (w, b), feed


def reference_training(optimizer_name):
    """Plain single-process TensorFlow on the whole batch: ``(losses, {table: {key: vector}}, (w, b))``."""
    batches = [global_batch(step) for step in range(STEPS)]
    keys = {"t1": np.unique(np.concatenate([b[0].ravel() for b in batches])),
            "t2": np.unique(np.concatenate([b[1][1] for b in batches]))}

    def make_tables():
        tables = [tf.compat.v1.get_variable(name, initializer=init_vectors(keys[name], SEEDS[name]))
                  for name in ("t1", "t2")]
        return tables[0], tables[1], lambda name, k: np.searchsorted(keys[name], k)

    with tf.Graph().as_default():
        loss, train_op, tables, dense_vars, feed = build_model(optimizer_name, make_tables)
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            losses = [sess.run([loss, train_op], feed(b))[0] for b in batches]
            values = sess.run(tables)
            held = {name: dict(zip(keys[name].tolist(), v)) for name, v in zip(("t1", "t2"), values)}
            return np.array(losses), held, sess.run(dense_vars)


def worker_training(optimizer_name, strategy, rank, size):
    """The model on hash tables under ``strategy``: losses, per table (keys, vectors) held here, dense weights."""
    from collective.embedding import hash_table  # pylint: disable=import-outside-toplevel

    def make_tables():
        with strategy.embedding_scope():
            t1, t2 = (hash_table.hash_embedding_variable(name, DIM, CAPACITY, initializer=uniform(SEEDS[name]))
                      for name in ("t1", "t2"))
        return t1, t2, lambda name, k: k

    with tf.Graph().as_default():
        loss, train_op, tables, dense_vars, feed = build_model(optimizer_name, make_tables)
        held = {}
        for name, table in zip(("t1", "t2"), tables):
            keys, rows = hash_table.table_of(table).entries()
            held[name] = (keys, tf.gather(table, rows))
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            losses = [sess.run([loss, train_op], feed(local_batch(step, rank, size)))[0] for step in range(STEPS)]
            return np.array(losses), sess.run(held), sess.run(dense_vars)


def words(dense):
    """String keys for a column: ``"w<|key| % 5>"``, empty (missing) where ``key % 3 == 0``."""
    return np.array([[f"w{abs(int(k)) % 5}" if int(k) % 3 else "" for k in row] for row in dense])


BACKENDS = ("hb", "sok")


def run(base_dir: pathlib.Path, backend: str, n: int):
    """``hash_worker.py`` on ``n`` workers, once per pytest session and ``n`` for every backend of
    :data:`BACKENDS` (one launch): ``backend``'s per-rank results."""
    from launcher import load_rank_results, run_workers  # pylint: disable=import-outside-toplevel

    out = pathlib.Path(base_dir) / f"hash-{n}"
    if not (out / "done").exists():
        out.mkdir(parents=True, exist_ok=True)
        run_workers("hash_worker.py", n, [out, ",".join(BACKENDS), *OPTIMIZERS])
        (out / "done").write_text("ok")
    return load_rank_results(out / backend, n)
