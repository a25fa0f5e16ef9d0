"""Which files, row groups and rows each worker reads: disjoint shares that cover everything.

A *piece* is a run of rows of one row group of one file (usually the whole
row group). ``shard_by`` chooses how worker ``rank`` of ``world_size`` shares them:

- ``file``: whole files, file ``i`` to worker ``i % world_size``;
- ``row_group``: whole row groups in file order, row group ``j`` to worker ``j % world_size``;
- ``rows``: contiguous, balanced row ranges of the files taken in order (worker ``r`` reads rows
  ``[r * T // N, (r + 1) * T // N)`` of the ``T`` rows), cut at row-group boundaries; shares differ by
  at most one row, whatever the layout (one file with one row group, as pandas and Spark often write,
  trains on any N);
- ``auto`` (the default): ``file`` when the files divide evenly among the workers and give each the
  same number of rows, else ``rows``.
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


def shard_mode(file_rows: Sequence[int], world_size: int, mode: str = "auto") -> str:
    """``file``, ``row_group`` or ``rows``: ``mode``, or what ``auto`` picks for files of these row counts."""
    if mode not in SHARD_MODES:
        raise DataError(f"shard_by={mode!r} is not one of {', '.join(SHARD_MODES)}")
    if mode == "auto":
        even = len(file_rows) % world_size == 0 and \
            len({sum(file_rows[r::world_size]) for r in range(world_size)}) == 1
        return "file" if even else "rows"
    return mode


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


def shard_pieces(infos: Sequence[ParquetFileInfo], rank: int, world_size: int,
                 mode: str = "auto") -> List[Piece]:
    """The pieces worker ``rank`` of ``world_size`` reads, in file and row-group order."""
    mode = shard_mode([sum(info.row_group_rows) for info in infos], world_size, mode)
    if mode == "rows":
        pieces = _row_range_pieces(infos, rank, world_size)
    else:
        pieces = []
        index = 0
        for file_index, info in enumerate(infos):
            for rg, rows in enumerate(info.row_group_rows):
                owner = file_index if mode == "file" else index
                if owner % world_size == rank:
                    pieces.append(Piece(info.path, rg, rows))
                index += 1
    if not pieces:
        row_groups = sum(len(info.row_group_rows) for info in infos)
        hint = ("there are fewer rows than workers" if mode == "rows" else
                "read with shard_by='rows' (balanced row ranges), or write more files or row groups")
        logger.warning("worker %d of %d gets no data (shard_by=%s): %d file(s) with %d row group(s) in all; %s",
                       rank, world_size, mode, len(infos), row_groups, hint)
    return pieces
