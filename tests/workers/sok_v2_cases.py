"""Shared data of the SOK v2 test: tables, batches and the model's initial weights."""
import numpy as np

GLOBAL_BATCH = 12  # divides by 1, 2 and 3 workers
STEPS = 3
# name -> (rows, dim); "c" is the DynamicVariable, its keys are KEYS_C.
TABLES = {"a": (40, 4), "b": (30, 3)}
DIM_C = 4
INIT_C = 0.1
KEYS_C = np.array([10 ** 9 * (k % 3 - 1) + 7919 * k for k in range(-12, 13)], np.int64)  # negative keys too
COMBINERS = ("sum", "mean", "mean")


def initial_tables():
    rng = np.random.default_rng(7)
    return {k: rng.uniform(-0.5, 0.5, size=shape).astype(np.float64) for k, shape in TABLES.items()}


def dense_weights():
    rng = np.random.default_rng(8)
    width = sum(d for _, d in TABLES.values()) + DIM_C
    return rng.uniform(-0.5, 0.5, size=(width, 1)), np.zeros([1])


def batch(step):
    """Per table a list of id lists (one per sample, some empty), and the labels."""
    rng = np.random.default_rng(100 + step)
    ids = {}
    for k, (rows, _) in TABLES.items():
        ids[k] = [list(rng.integers(0, rows, size=rng.integers(0, 4))) for _ in range(GLOBAL_BATCH)]
    ids["c"] = [list(rng.choice(KEYS_C, size=rng.integers(1, 4))) for _ in range(GLOBAL_BATCH)]
    return ids, rng.normal(size=(GLOBAL_BATCH, 1))
