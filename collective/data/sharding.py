"""Which files and row groups each worker reads: disjoint shares that cover everything.

A *piece* is one row group of one file. Worker ``rank`` of ``world_size``
reads whole files (file ``i`` goes to worker ``i % world_size``) when the
files divide evenly among the workers, and otherwise every row group in
file order (piece ``j`` goes to worker ``j % world_size``), which balances
the shares when there are fewer files than workers or an uneven count.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import List, Optional, Sequence, Tuple

from collective.data.files import DataError, ParquetFileInfo

logger = logging.getLogger("collective.data")

SHARD_MODES = ("auto", "file", "row_group")


@dataclasses.dataclass(frozen=True)
class Piece:
    """Row group ``row_group`` of ``path``, holding ``num_rows`` rows."""

    path: str
    row_group: int
    num_rows: int


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


def shard_mode(num_files: int, world_size: int, mode: str = "auto") -> str:
    """``file`` or ``row_group``: what ``auto`` picks for this many files and workers."""
    if mode not in SHARD_MODES:
        raise DataError(f"shard_by={mode!r} is not one of {', '.join(SHARD_MODES)}")
    if mode == "auto":
        return "file" if num_files % world_size == 0 else "row_group"
    return mode


def shard_pieces(infos: Sequence[ParquetFileInfo], rank: int, world_size: int,
                 mode: str = "auto") -> List[Piece]:
    """The pieces worker ``rank`` of ``world_size`` reads, in file and row-group order."""
    mode = shard_mode(len(infos), world_size, mode)
    pieces: List[Piece] = []
    index = 0
    for file_index, info in enumerate(infos):
        for rg, rows in enumerate(info.row_group_rows):
            owner = file_index if mode == "file" else index
            if owner % world_size == rank:
                pieces.append(Piece(info.path, rg, rows))
            index += 1
    if not pieces:
        logger.warning("worker %d of %d gets no data: %d file(s) with %d row group(s) in all; "
                       "write more row groups (smaller row_group_size) or more files",
                       rank, world_size, len(infos), index)
    return pieces
