"""Vocabulary policies (admission, eviction, LRU/LFU at capacity) and growth: data, model, a numpy model of the decisions.

Workers train a small model on one hash table with a policy on their share
of each global batch. The tests compare every worker count with the
1-worker run of the same program key by key (values, optimizer slots,
counts, last-seen steps), and the 1-worker run's decisions (which keys are
held after each step, with which count and last step) with
:class:`PolicyModel`, an independent numpy model of
``collective.embedding.hash_table.policy``. Growing tables (``GROWTH``) start
below their capacity; each ``TWINS`` pair trains the same data with the same
policy, one growing and one allocated at its capacity, to be compared bit for bit.
"""

import pathlib
import sys

import numpy as np
import tensorflow as tf

if str(pathlib.Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from embedding_cases import make_optimizer  # noqa: E402  pylint: disable=wrong-import-position

DIM, BATCH, SEED = 4, 12, 21
BUCKETS = 1024  # collective.embedding.hash_table.dynamic.HISTOGRAM_BUCKETS
# name: (policy keyword arguments, optimizer, steps, total capacity (split over workers) or None: 64 per worker)
CASES = {
    "admit": (dict(min_count=2, steps_to_live=3, evict_every_steps=2, evict_at_checkpoint=True, default_value=0.25),
              "Adagrad", 9, None),
    "l2": (dict(l2_weight_threshold=0.55, evict_every_steps=1), "Adam", 6, None),
    "lru": (dict(evict_strategy="lru", evict_every_steps=1, max_fill=0.6, fill_after_evict=0.3), "Adagrad", 8, 42),
    "lfu": (dict(evict_strategy="lfu", evict_every_steps=1, max_fill=0.6, fill_after_evict=0.3,
                 min_count=2, counter_steps_to_live=4), "Adagrad", 8, 42),
    # Eviction only when a checkpoint is saved (DeepRec's rule), by MonitoredTrainingSession's saver hook.
    "ckpt": (dict(steps_to_live=2, evict_every_steps=None, evict_at_checkpoint=True, min_count=2),
             "Adagrad", 9, None),
    "none": (dict(), "Adam", 8, None),
    "grow_none": (dict(), "Adam", 8, None),
    "grow_lru": (dict(evict_strategy="lru", evict_every_steps=1, max_fill=0.6, fill_after_evict=0.3), "Adagrad", 8, 42),
}
SAVES = {"admit": (5, 9), "ckpt": (3, 6, 9)}
"""Steps after which a case saves a checkpoint (an eviction run where its policy evicts at checkpoints); the
held keys recorded for a step are those after its save."""
MTS_CASES = ("ckpt",)
"""Cases trained in MonitoredTrainingSession, whose saver hook saves every 3 steps (the others: a plain session
with ``collective.checkpoint.Saver``: a full save at 5 and a delta at the end)."""
# initial_capacity_per_worker of the growing cases: admit (its counter table grows too) is also the checkpoint
# restored on another worker count; grow_lru's load factor 0.7 makes its sizes 5, 11, 22 (then 42 on one worker,
# which it reaches before the LRU rule fires at 60% of 42), 5, 11, 21 on two workers.
GROWTH = {"admit": 4, "grow_none": 2, "grow_lru": 4}
LOAD_FACTOR = {"grow_lru": 0.7}
TWINS = {"grow_none": "none", "grow_lru": "lru"}  # growing case: the same case allocated at its capacity
BACKENDS = ("hb", "sok")
# The owner side of a lookup is the same code on both backends. hb runs every case with tf.compat.v1.train
# optimizers and the checkpoint round trips (the export in the 1-worker job); sok runs SOK v2 programs
# (sok.DynamicVariable with HKV's strategy names, sok.lookup_sparse, sok.OptimizerWrapper around a Keras optimizer,
# no global step: the policy makes one that follows the optimizer's iterations) with admission and LRU/LFU.
BACKEND_CASES = {"hb": tuple(CASES), "sok": ("admit", "lru", "lfu")}
RUNS = [(backend, case) for backend in BACKENDS for case in BACKEND_CASES[backend]]


def capacity(case: str, n: int) -> int:
    total = CASES[case][3]
    return 64 if total is None else total // n


def global_batch(case: str, step: int):
    """Dense keys [B, 2] from a window drifting by 5 keys a step (old keys go cold, new ones arrive), labels [B, 1]."""
    rng = np.random.default_rng(1000 * list(CASES).index(TWINS.get(case, case)) + step)
    window = np.arange(5 * step, 5 * step + 14, dtype=np.int64)
    keys = rng.choice(window, (BATCH, 2))
    labels = rng.integers(0, 2, (BATCH, 1)).astype(np.float32)
    return keys, labels


def local_batch(case: str, step: int, rank: int, size: int):
    keys, labels = global_batch(case, step)
    per = BATCH // size
    return keys[rank * per:(rank + 1) * per], labels[rank * per:(rank + 1) * per]


def build(strategy, case: str, n: int, with_optimizer: bool = True, backend: str = "hb", policy=None):
    """The model on one hash table with ``case``'s policy (or ``policy``):
    ``(table, keys, labels, loss, train_op, optimizer)``.

    ``backend="sok"`` builds the SOK v2 program (see ``BACKEND_CASES``).
    """
    from collective.embedding import hash_table  # pylint: disable=import-outside-toplevel

    policy = dict(CASES[case][0] if policy is None else policy)
    keys = tf.compat.v1.placeholder(tf.int64, [None, 2])
    labels = tf.compat.v1.placeholder(tf.float32, [None, 1])
    if backend == "sok":
        return _build_sok(case, n, policy, keys, labels, with_optimizer)
    step = tf.compat.v1.train.get_or_create_global_step()
    with strategy.embedding_scope():
        table = hash_table.hash_embedding_variable(
            "table", DIM, capacity(case, n), initializer=tf.compat.v1.random_uniform_initializer(-0.5, 0.5, seed=SEED),
            initial_capacity_per_worker=GROWTH.get(case), load_factor=LOAD_FACTOR.get(case, 0.5), **policy)
    e = tf.reshape(tf.nn.embedding_lookup(table, keys), [-1, 2 * DIM])
    loss = _loss(e, labels)
    opt = make_optimizer(CASES[case][1]) if with_optimizer else None
    train_op = opt.minimize(loss, global_step=step) if with_optimizer else None
    return table, keys, labels, loss, train_op, opt


def _loss(e, labels):
    width = int(e.shape[1])
    w = tf.compat.v1.get_variable("w", [width, 1], initializer=tf.compat.v1.constant_initializer(
        np.linspace(-0.4, 0.4, width).reshape(-1, 1)))
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=tf.matmul(e, w)))


def _build_sok(case, n, policy, keys, labels, with_optimizer):
    """SOK v2: DynamicVariable (kLru/kLfu), lookup_sparse (sum of a sample's 2 keys), Keras Adagrad, no global step."""
    from collective import sok  # pylint: disable=import-outside-toplevel

    if "evict_strategy" in policy:
        policy["evict_strategy"] = {"lru": "kLru", "lfu": "kLfu"}[policy["evict_strategy"]]
    table = sok.DynamicVariable(dimension=DIM, initializer=tf.keras.initializers.RandomUniform(-0.5, 0.5, seed=SEED),
                                max_capacity=capacity(case, n), name="table", **policy)
    batch = tf.shape(keys, out_type=tf.int64)[0]
    at = tf.stack([tf.repeat(tf.range(batch), 2), tf.tile(tf.range(2, dtype=tf.int64), [batch])], axis=1)
    e = sok.lookup_sparse(table, tf.SparseTensor(at, tf.reshape(keys, [-1]), tf.stack([batch, 2])), combiners="sum")
    loss = _loss(e, labels)
    if not with_optimizer:
        return table, keys, labels, loss, None, None
    assert CASES[case][1] == "Adagrad"
    wrapper, dense = sok.OptimizerWrapper(tf.keras.optimizers.legacy.Adagrad(0.4)), \
        tf.keras.optimizers.legacy.Adagrad(0.4)
    w = [v for v in tf.compat.v1.trainable_variables() if v.op.name == "w"]
    grads = tf.gradients(loss, [table] + w)
    train_op = tf.group(wrapper.apply_gradients([(grads[0], table)]), dense.apply_gradients(zip(grads[1:], w)))
    return table, keys, labels, loss, train_op, wrapper


class PolicyModel:
    """Numpy model of a policy's decisions: held keys with (count, last step), the counter table, evictions.

    ``norms(keys)`` gives the values' L2 norms when the policy has an L2 rule.
    """

    def __init__(self, policy: dict, total_capacity: int):
        self.p = dict(policy)
        self.total = total_capacity
        self.held = {}
        self.counter = {}

    def lookup(self, keys, step: int) -> None:
        min_count = self.p.get("min_count", 1)
        for key in np.unique(keys).tolist():
            if key in self.held:
                self.held[key] = (self.held[key][0] + 1, step)
                continue
            count = self.counter.get(key, (0, step))[0] + 1
            if count >= min_count:
                self.held[key] = (count, step)
                if min_count > 1:
                    self.counter[key] = (0, step)
            else:
                self.counter[key] = (count, step)

    def after_save(self, step: int, norms=None) -> None:
        """A checkpoint saved at ``step``: an eviction run there when the policy evicts at checkpoints."""
        if self.p.get("evict_at_checkpoint"):
            self.evict(step, norms)

    def after_update(self, new_step: int, norms=None) -> None:
        every = self.p.get("evict_every_steps", 100)
        if every is None or new_step <= 0 or new_step % every:
            return
        self.evict(new_step, norms)

    def evict(self, new_step: int, norms=None) -> None:
        ttl, thr = self.p.get("steps_to_live"), self.p.get("l2_weight_threshold")
        keep = {k: True for k in self.held}
        for key, (_, last) in self.held.items():
            if ttl is not None and new_step - last > ttl:
                keep[key] = False
            if thr is not None and norms(key) < thr:
                keep[key] = False
        strategy = self.p.get("evict_strategy")
        if strategy:
            alive = [k for k in self.held if keep[k]]
            lru = strategy == "lru"
            value = {k: min(max(new_step - self.held[k][1] if lru else self.held[k][0], 0), BUCKETS - 1)
                     for k in alive}
            if len(alive) > int(self.p.get("max_fill", 0.9) * self.total):
                target = int(self.p.get("fill_after_evict", 0.75) * self.total)
                if lru:
                    limit = max([a for a in range(1, BUCKETS + 1) if sum(v < a for v in value.values()) <= target]
                                + [2])  # the keys of the last step (1 step old) always stay
                    stays = {k: value[k] < limit for k in alive}
                else:
                    fits = [c for c in range(BUCKETS) if sum(v >= c for v in value.values()) <= target]
                    limit = min(fits + [BUCKETS - 1])
                    stays = {k: value[k] >= limit for k in alive}
                for k in alive:
                    keep[k] = stays[k]
        self.held = {k: v for k, v in self.held.items() if keep[k]}
        if self.p.get("min_count", 1) > 1:
            cttl = self.p.get("counter_steps_to_live", ttl)
            self.counter = {k: (c, last) for k, (c, last) in self.counter.items()
                            if c > 0 and (cttl is None or new_step - last <= cttl)}
