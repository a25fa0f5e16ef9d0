"""SOK v2's tables: ``sok.init``, ``sok.Variable``, ``sok.DynamicVariable`` and ``sok.filter_variables``.

A ``sok.Variable`` is one logical ``[rows, dim]`` table laid out by
:class:`collective.embedding.layout.ShardLayout` (row ``i`` on worker
``i % N``); the returned object is this worker's local ``tf.Variable`` tagged
with its :class:`~collective.embedding.table.ShardInfo`. A
``sok.DynamicVariable`` is a hash-table vocabulary
(:func:`collective.embedding.hash_table.hash_embedding_variable`). Both
checkpoint as whole logical tables (:mod:`collective.sok.checkpoint`).
"""

from __future__ import annotations

from typing import Iterable, Optional, Tuple

import numpy as np
import tensorflow as tf

from collective import comm
from collective.checkpoint import touched
from collective.embedding import hash_table
from collective.embedding.table import shard_initial_value, shard_of, tag
from collective.sharding import shards
from collective.sharding.planner import TableSpec
from collective.sok.checkpoint import not_saved, save_logical
from collective.sok.init import refuse_tf_distribute

DEFAULT_CAPACITY = 1 << 16
_count = {"Variable": 0, "DynamicVariable": 0}


def init(**kwargs) -> None:
    """SOK v2's ``sok.init()``: starts Horovod/collective's communication (arguments are accepted and unused)."""
    refuse_tf_distribute("sok.init")
    comm.init()


def _name(kind: str, name: Optional[str]) -> str:
    if name:
        return name
    _count[kind] += 1
    return f"sok_{kind}_{_count[kind] - 1}"


def _check_mode(mode: str, name: str) -> None:
    if mode == "distributed":
        return
    if isinstance(mode, str) and mode.startswith("localized:"):
        raise NotImplementedError(
            f"sok.Variable '{name}': mode={mode!r} (the whole table on one worker) is not supported: collective's "
            "layouts are row-sharded (i % N) or replicated on every worker; use mode='distributed'")
    raise ValueError(f"sok.Variable '{name}': mode={mode!r} must be 'distributed' or 'localized:<rank>'")


def Variable(initial_value=None, shape=None, initializer=None, dtype=None, name: Optional[str] = None,  # noqa: N802
             trainable: bool = True, mode: str = "distributed") -> tf.Variable:
    """SOK v2's ``sok.Variable``: a ``[rows, dim]`` table whose rows are spread over the workers.

    Args:
      initial_value: the whole logical table (array or tensor; every worker
        passes the same) or a callable giving it; or None with ``shape`` and ``initializer``.
      shape: ``[rows, dim]`` when ``initial_value`` is None.
      initializer: a Keras/TF initializer (default uniform in [-0.05, 0.05]).
      dtype: the values' dtype (default: that of ``initial_value``, else float32).
      name: the variable's name.
      mode: ``"distributed"``; ``"localized:<rank>"`` is refused (see docs/sok.md).

    Returns:
      This worker's rows as a ``tf.Variable`` (``shard_of(var)`` gives the logical shape).
    """
    refuse_tf_distribute("sok.Variable")
    comm.init()
    name = _name("Variable", name)
    _check_mode(mode, name)
    if initial_value is not None:
        if callable(initial_value):
            initial_value = initial_value()
        value = np.asarray(initial_value.numpy() if hasattr(initial_value, "numpy") else initial_value)
        if value.ndim != 2:
            raise ValueError(f"sok.Variable '{name}': initial value must be 2-D [rows, dim], got shape {value.shape}")
        dtype = tf.as_dtype(dtype or (value.dtype if value.dtype.kind == "f" else tf.float32))
        shape, initializer = value.shape, tf.keras.initializers.Constant(value.astype(dtype.as_numpy_dtype))
    else:
        if shape is None or len(shape) != 2:
            raise ValueError(f"sok.Variable '{name}': give initial_value, or shape=[rows, dim] with an initializer")
        dtype = tf.as_dtype(dtype or tf.float32)
        initializer = tf.keras.initializers.get(initializer) if initializer is not None else \
            tf.keras.initializers.RandomUniform(-0.05, 0.05)
    info = shards.place(TableSpec(name, int(shape[0]), int(shape[1]), dtype.name, api="sok"))
    with tf.init_scope():
        local = shard_initial_value(initializer, info, dtype)
    if tf.executing_eagerly():
        var = tf.Variable(local, name=name, trainable=trainable, dtype=dtype)
    else:
        var = tf.compat.v1.get_variable(name, initializer=local, trainable=trainable, dtype=dtype,
                                        use_resource=True)
    var = save_logical(tag(var, shards.renamed(info, var.name.split(":")[0])))
    return touched.record_update_times(var)  # for sok.incremental_dump


def _dynamic_initializer(value, name: str):
    if value is None or value == "random":
        return tf.keras.initializers.RandomUniform(-0.05, 0.05)
    if value == "ones":
        return tf.keras.initializers.Ones()
    if value == "zeros":
        return tf.keras.initializers.Zeros()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return tf.keras.initializers.Constant(float(value))
    try:
        return tf.keras.initializers.get(value)
    except ValueError as err:
        raise ValueError(f"sok.DynamicVariable '{name}': initializer={value!r} is not 'random', 'ones', 'zeros', "
                         "a number or a Keras initializer") from err


def DynamicVariable(dimension: int, initializer=None, var_type: Optional[str] = None,  # noqa: N802
                    key_type=tf.int64, dtype=tf.float32, name: Optional[str] = None,
                    init_capacity: Optional[int] = None, max_capacity: Optional[int] = None,
                    mode: str = "distributed", **kwargs) -> tf.Variable:
    """SOK v2's ``sok.DynamicVariable``: a hash vocabulary of ``dimension``-wide vectors, any int64/int32 key.

    A key's row is made on its first lookup in training, its first vector
    drawn from ``initializer`` (``"random"``, ``"ones"``, ``"zeros"``, a
    number or a Keras initializer). Each worker holds at most
    ``max_capacity`` (else ``init_capacity``, else 65536) keys. With both and
    ``init_capacity < max_capacity`` it allocates ``init_capacity`` rows and
    grows up to ``max_capacity`` (``hash_embedding_variable``'s
    ``initial_capacity_per_worker``) in graph mode; otherwise (and eagerly)
    it is allocated at its capacity. ``var_type``
    (SOK's storage: ``hbm``, ``hybrid``) does not change anything here.

    HKV's ``evict_strategy`` (``"kLru"``/``"kLfu"``, or ``"lru"``/``"lfu"``)
    makes a full table evict instead of failing; unlike HKV's per-bucket
    eviction on insert, it runs every ``evict_every_steps`` global steps with
    one threshold agreed by all workers
    (:class:`~collective.embedding.hash_table.VocabularyPolicy`, whose other
    options ``min_count``, ``steps_to_live``, ... are accepted as keyword
    arguments too).
    """
    refuse_tf_distribute("sok.DynamicVariable")
    comm.init()
    name = _name("DynamicVariable", name)
    _check_mode(mode, name)
    if tf.as_dtype(key_type) not in (tf.int64, tf.int32):
        raise ValueError(f"sok.DynamicVariable '{name}': key_type={key_type!r} must be tf.int64 or tf.int32")
    capacity = int(max_capacity or init_capacity or DEFAULT_CAPACITY)
    initial = int(init_capacity) if max_capacity and init_capacity and int(init_capacity) < capacity else None
    policy = _policy_keywords(name, kwargs)
    with tf.init_scope():
        if tf.executing_eagerly():  # growth works in graphs; an eager table is allocated at its capacity
            initial = None
        var = hash_table.hash_embedding_variable(name, int(dimension), capacity,
                                                 _dynamic_initializer(initializer, name), dtype=dtype,
                                                 key_dtype=key_type, initial_capacity_per_worker=initial, api="sok",
                                                 **policy)
    var.m_key_dtype = tf.as_dtype(key_type)
    index = hash_table.table_of(var)
    if isinstance(index, hash_table.HashTable):  # not in an export graph
        for state in index.variables:
            not_saved(state)
        save_logical(var)
    return touched.record_update_times(var)  # for sok.incremental_dump


_HKV_STRATEGIES = {"klru": "lru", "klfu": "lfu", "lru": "lru", "lfu": "lfu"}


def _policy_keywords(name: str, kwargs: dict) -> dict:
    """The :class:`VocabularyPolicy` keyword arguments among ``DynamicVariable``'s extra ones (HKV's names mapped)."""
    policy = {k: kwargs[k] for k in hash_table.POLICY_KEYWORDS if k in kwargs}
    strategy = policy.get("evict_strategy")
    if strategy is not None:
        if str(strategy).lower() not in _HKV_STRATEGIES:
            raise ValueError(f"sok.DynamicVariable '{name}': evict_strategy={strategy!r} is not supported; use "
                             "'kLru' or 'kLfu' (HKV's epoch and customized scores have no N-invariant equivalent)")
        policy["evict_strategy"] = _HKV_STRATEGIES[str(strategy).lower()]
    return policy


def is_sok_variable(var) -> bool:
    """Whether ``var`` is a SOK table (``sok.Variable``, ``sok.DynamicVariable`` or a v1 layer's table)."""
    return shard_of(var) is not None


def filter_variables(variables: Iterable) -> Tuple[list, list]:
    """SOK v2's ``sok.filter_variables``: ``(sok variables, other variables)``, order kept."""
    variables = list(variables)
    return [v for v in variables if is_sok_variable(v)], [v for v in variables if not is_sok_variable(v)]
