"""First vectors of hash-table keys: a function of the key, the same on 1 or N workers.

A hash table writes a row when a key is first seen, on whichever worker owns
the key, in whatever step the key first appears. For training to be the same
on any number of workers the vector must depend on the key alone, so the
user's initializer is not called; its distribution is reproduced from
counter-based random bits::

    h   = fmix64(key ^ salt)                      salt: the initializer's seed, else a hash of the table name
    u_j = (fmix64(h + (j + 1) * GOLDEN) >> 11 + 0.5) / 2**53      in (0, 1), j = 0 .. dim-1

(``fmix64`` is MurmurHash3's finaliser, as in :mod:`collective.kernels.reference`;
arithmetic wraps modulo 2**64). ``u`` becomes the initializer's
distribution: ``minval + (maxval - minval) * u`` for uniform,
``mean + stddev * ndtri(u)`` for normal, and the inverse CDF restricted to
two standard deviations for truncated normal (TensorFlow's truncation).
Variance-scaling initialisers (Glorot, He, LeCun) take their fan from the
per-worker shape ``[capacity_per_worker, dim]``.
"""

from __future__ import annotations

import hashlib
import math
from typing import Tuple

import numpy as np
import tensorflow as tf

from collective.kernels.reference import FMIX64_MUL1, FMIX64_MUL2, FMIX64_SHIFT

GOLDEN = 0x9E3779B97F4A7C15
_TRUNCATION_LOW = 0.5 * math.erfc(2.0 / math.sqrt(2.0))  # Phi(-2)
_TRUNCATED_STDDEV = 0.87962566103423978  # stddev of a standard normal truncated at +-2
SUPPORTED = ("zeros, ones, constant (scalar or [dim]), random_uniform, random_normal, truncated_normal, "
             "variance_scaling / glorot / he / lecun (TF1, TF2 or Keras classes), or a Python number")
DEFAULT = ("uniform", -0.05, 0.05)  # SOK's default embedding initializer

Spec = Tuple[str, object, object]


def fmix64(k: tf.Tensor) -> tf.Tensor:
    """MurmurHash3's 64-bit finaliser of uint64 ``k`` in TensorFlow ops (``collective.kernels.reference``'s)."""
    shift = tf.constant(FMIX64_SHIFT, tf.uint64)
    k = tf.bitwise.bitwise_xor(k, tf.bitwise.right_shift(k, shift))
    k = k * tf.constant(FMIX64_MUL1, tf.uint64)
    k = tf.bitwise.bitwise_xor(k, tf.bitwise.right_shift(k, shift))
    k = k * tf.constant(FMIX64_MUL2, tf.uint64)
    return tf.bitwise.bitwise_xor(k, tf.bitwise.right_shift(k, shift))


def salt_of(seed, table_name: str) -> int:
    """The 64-bit salt of a table: its initializer's seed when given, else a hash of its name."""
    if seed is not None:
        return int(seed) & (2 ** 64 - 1)
    return int.from_bytes(hashlib.blake2b(table_name.encode(), digest_size=8).digest(), "little")


def uniform_bits(keys: tf.Tensor, dim: int, salt: int) -> tf.Tensor:
    """``[len(keys), dim]`` float64 in (0, 1), a function of (key, column, salt) only."""
    k = tf.bitcast(tf.cast(keys, tf.int64), tf.uint64)
    h = fmix64(tf.bitwise.bitwise_xor(k, tf.constant(salt, tf.uint64)))
    steps = tf.bitcast(tf.range(1, dim + 1, dtype=tf.int64), tf.uint64) * tf.constant(GOLDEN, tf.uint64)
    bits = fmix64(h[:, None] + steps[None, :])
    return (tf.cast(tf.bitwise.right_shift(bits, tf.constant(11, tf.uint64)), tf.float64) + 0.5) * 2.0 ** -53


def spec_of(initializer, table_name: str, fan_shape: Tuple[int, int]) -> Spec:
    """``(kind, a, b)`` reproducing ``initializer``: constant value, uniform bounds, or (truncated) normal moments."""
    if initializer is None:
        return DEFAULT
    if isinstance(initializer, (int, float)) and not isinstance(initializer, bool):
        return ("constant", float(initializer), None)
    cls = type(initializer).__name__.lower()
    if all(hasattr(initializer, a) for a in ("scale", "mode", "distribution")):
        return _variance_scaling(initializer, fan_shape)
    if hasattr(initializer, "minval") and hasattr(initializer, "maxval"):
        return ("uniform", float(initializer.minval), float(initializer.maxval))
    if hasattr(initializer, "mean") and hasattr(initializer, "stddev"):
        kind = "truncated_normal" if "truncated" in cls else "normal"
        return (kind, float(initializer.mean), float(initializer.stddev))
    if "zeros" in cls:
        return ("constant", 0.0, None)
    if "ones" in cls:
        return ("constant", 1.0, None)
    if "constant" in cls and hasattr(initializer, "value"):
        value = np.asarray(initializer.value, dtype=np.float64)
        if value.ndim == 0 or (value.ndim == 1 and value.shape[0] == fan_shape[1]):
            return ("constant", value, None)
        raise ValueError(f"hash table '{table_name}': a constant initializer must be a scalar or a vector of "
                         f"dim={fan_shape[1]} values (every key starts the same), got shape {value.shape}")
    raise TypeError(f"hash table '{table_name}': initializer {initializer!r} cannot give each key its own "
                    f"first vector; use one of: {SUPPORTED}")


def _variance_scaling(initializer, fan_shape: Tuple[int, int]) -> Spec:
    fan_in, fan_out = fan_shape
    mode = str(initializer.mode).lower()
    n = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2.0}[mode]
    scale = float(initializer.scale) / max(1.0, n)
    distribution = str(initializer.distribution).lower()
    if distribution == "uniform":
        limit = math.sqrt(3.0 * scale)
        return ("uniform", -limit, limit)
    if distribution in ("normal", "truncated_normal"):
        return ("truncated_normal", 0.0, math.sqrt(scale) / _TRUNCATED_STDDEV)
    return ("normal", 0.0, math.sqrt(scale))


def values_of(spec: Spec, keys: tf.Tensor, dim: int, salt: int, dtype: tf.DType) -> tf.Tensor:
    """First vectors ``[len(keys), dim]`` of ``keys`` under ``spec``."""
    kind, a, b = spec
    if kind == "constant":
        row = tf.constant(np.broadcast_to(np.asarray(a, np.float64), [dim]), tf.float64)
        return tf.cast(tf.tile(row[None, :], [tf.size(keys), 1]), dtype)
    u = uniform_bits(keys, dim, salt)
    if kind == "uniform":
        out = a + (b - a) * u
    elif kind == "normal":
        out = a + b * tf.math.ndtri(u)
    else:
        out = a + b * tf.math.ndtri(_TRUNCATION_LOW + (1.0 - 2.0 * _TRUNCATION_LOW) * u)
    return tf.cast(out, dtype)


class KeyInitializer:
    """Callable ``keys -> [len(keys), dim]`` first vectors of one table."""

    def __init__(self, initializer, table_name: str, dim: int, capacity: int, dtype: tf.DType):
        self.spec = spec_of(initializer, table_name, (int(capacity), int(dim)))
        self.salt = salt_of(getattr(initializer, "seed", None), table_name)
        self.dim = int(dim)
        self.dtype = tf.as_dtype(dtype)

    def __call__(self, keys: tf.Tensor) -> tf.Tensor:
        return values_of(self.spec, tf.reshape(keys, [-1]), self.dim, self.salt, self.dtype)
