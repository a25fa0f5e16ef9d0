"""Deterministic per-rank inputs for the collective tests, shared by worker and test."""

import numpy as np

DIM = 3


def dense(rank: int, dtype=np.float32) -> np.ndarray:
    return (np.arange(2 * DIM, dtype=np.float64).reshape(2, DIM) * (rank + 1) + 0.5).astype(dtype)


def upstream(rank: int, shape, dtype=np.float32) -> np.ndarray:
    """The weights a worker's loss puts on a collective's output: loss = sum(y * upstream)."""
    size = int(np.prod(shape))
    return ((np.arange(size, dtype=np.float64).reshape(shape) % 5 + 1) * (rank + 2) / 8).astype(dtype)


def gather_rows(rank: int) -> int:
    """Rank 0 contributes no rows: allgather with an empty input."""
    return rank


def gather_input(rank: int, dtype=np.float32) -> np.ndarray:
    n = gather_rows(rank)
    return (np.arange(n * DIM, dtype=np.float64).reshape(n, DIM) + 100 * rank).astype(dtype)


def gather_ids(rank: int) -> np.ndarray:
    return np.arange(gather_rows(rank), dtype=np.int64) + (1 << 40) * (rank + 1)


def splits(rank: int, size: int) -> np.ndarray:
    """Rows rank sends to each worker: uneven, with zeros."""
    return np.array([(rank + j) % 3 for j in range(size)], dtype=np.int32)


def alltoall_input(rank: int, size: int, dtype=np.float32) -> np.ndarray:
    rows = int(splits(rank, size).sum())
    return (np.arange(rows * DIM, dtype=np.float64).reshape(rows, DIM) + 1000 * rank).astype(dtype)


def alltoall_ids(rank: int, size: int) -> np.ndarray:
    rows = int(splits(rank, size).sum())
    return np.arange(rows, dtype=np.int64) * 7 + (1 << 35) * rank



def text(rank: int) -> str:
    """A rank's text for broadcast_string: multi-byte characters, a different length on every rank."""
    return f"rank {rank}: é€" + "x" * (7 * rank)
