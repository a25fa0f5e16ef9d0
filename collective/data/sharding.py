"""Which files, row groups and rows each worker reads: disjoint shares that cover everything.

A *piece* is a run of rows of one row group of one file (usually the whole
row group). ``shard_by`` chooses how worker ``rank`` of ``world_size`` shares them:

- ``file``: whole files, file ``i`` to worker ``i % world_size``;
- ``row_group``: whole row groups in file order, row group ``j`` to worker ``j % world_size``;
- ``rows``: contiguous, balanced row ranges of the files taken in order (worker ``r`` reads rows
  ``[r * T // N, (r + 1) * T // N)`` of the ``T`` rows), cut at row-group boundaries; shares differ by
  at most one row, whatever the layout (one file with one row group, as pandas and Spark often write,
  trains on any N);
- ``auto`` (the default): the first of ``file``, ``row_group`` and ``rows`` that gives every worker
  the same rows within 10% of a share. ``row_group`` keeps one process's batches: with row groups of
  ``batch_size / N`` rows, step ``s`` of N workers reads the rows one process reads at step ``s``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import List, Optional, Sequence, Tuple

from collective.data.files import DataError, ParquetFileInfo

logger = logging.getLogger("collective.data")

SHARD_MODES = ("auto", "file", "row_group", "rows")


@dataclasses.dataclass(frozen=True)
class Piece:
    """``num_rows`` rows of row group ``row_group`` of ``path``, from its row ``first_row`` on."""

    path: str
    row_group: int
    num_rows: int
    first_row: int = 0


def resolve_rank(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """``(rank, world_size)``: the arguments where given, else this worker's from ``collective.context``."""
    if rank is None or world_size is None:
        from collective import context
        ctx = context.get()
        rank = ctx.rank if rank is None else rank
        world_size = ctx.world_size if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise DataError(f"shard rank {rank} does not fit world size {world_size}; "
                        "rank must be in [0, world_size)")
    return rank, world_size


def _whole_pieces(infos: Sequence[ParquetFileInfo], rank: int, world_size: int, by_file: bool) -> List[Piece]:
    pieces: List[Piece] = []
    index = 0
    for file_index, info in enumerate(infos):
        for rg, rows in enumerate(info.row_group_rows):
            if (file_index if by_file else index) % world_size == rank:
                pieces.append(Piece(info.path, rg, rows))
            index += 1
    return pieces


def _row_range_pieces(infos: Sequence[ParquetFileInfo], rank: int, world_size: int) -> List[Piece]:
    total = sum(sum(info.row_group_rows) for info in infos)
    begin, end = rank * total // world_size, (rank + 1) * total // world_size
    pieces: List[Piece] = []
    offset = 0
    for info in infos:
        for rg, rows in enumerate(info.row_group_rows):
            lo, hi = max(begin, offset), min(end, offset + rows)
            if lo < hi:
                pieces.append(Piece(info.path, rg, hi - lo, lo - offset))
            offset += rows
    return pieces


def _plan(infos: Sequence[ParquetFileInfo], rank: int, world_size: int, mode: str) -> List[Piece]:
    if mode == "rows":
        return _row_range_pieces(infos, rank, world_size)
    return _whole_pieces(infos, rank, world_size, by_file=mode == "file")


def _balanced(infos: Sequence[ParquetFileInfo], world_size: int, mode: str) -> bool:
    """Whether ``mode`` gives every worker the same rows, within 10% of a share (and one row)."""
    if mode == "file" and len(infos) % world_size:
        return False
    shares = [sum(p.num_rows for p in _plan(infos, r, world_size, mode)) for r in range(world_size)]
    return max(shares) - min(shares) <= max(1.0, 0.1 * sum(shares) / world_size)


def shard_mode(infos: Sequence[ParquetFileInfo], world_size: int, mode: str = "auto") -> str:
    """``file``, ``row_group`` or ``rows``: ``mode``, or what ``auto`` picks for these files."""
    if mode not in SHARD_MODES:
        raise DataError(f"shard_by={mode!r} is not one of {', '.join(SHARD_MODES)}")
    if mode == "auto":
        return next((m for m in ("file", "row_group") if _balanced(infos, world_size, m)), "rows")
    return mode


def shard_pieces(infos: Sequence[ParquetFileInfo], rank: int, world_size: int,
                 mode: str = "auto") -> List[Piece]:
    """The pieces worker ``rank`` of ``world_size`` reads, in file and row-group order."""
    mode = shard_mode(infos, world_size, mode)
    pieces = _plan(infos, rank, world_size, mode)
    if not pieces:
        row_groups = sum(len(info.row_group_rows) for info in infos)
        hint = ("there are fewer rows than workers" if mode == "rows" else
                "read with shard_by='rows' (balanced row ranges), or write more files or row groups")
        logger.warning("worker %d of %d gets no data (shard_by=%s): %d file(s) with %d row group(s) in all; %s",
                       rank, world_size, mode, len(infos), row_groups, hint)
    return pieces
