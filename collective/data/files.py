"""Finds Parquet files, reads their footers and checks that they agree.

Everything here reads metadata only (a file's footer), so building the plan
of a large data set costs milliseconds per file.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from typing import List, Optional, Sequence, Tuple, Union

import pyarrow as pa
import pyarrow.parquet as pq

PathLike = Union[str, "os.PathLike[str]"]
FileSpec = Union[PathLike, Sequence[PathLike]]


class DataError(ValueError):
    """Input files or columns that the reader cannot use; the message names them."""


@dataclasses.dataclass(frozen=True)
class ParquetFileInfo:
    """One file's footer: where it is, its row groups and its schema."""

    path: str
    row_group_rows: Tuple[int, ...]
    schema: pa.Schema

    @property
    def num_rows(self) -> int:
        return sum(self.row_group_rows)


def expand_filenames(filenames: FileSpec) -> List[str]:
    """Paths from a path, a glob pattern, a directory (its ``*.parquet``) or a list of those.

    The order is kept for explicit lists and sorted within each pattern or
    directory, so every worker sees the same list.
    """
    if isinstance(filenames, (str, os.PathLike)):
        filenames = [filenames]
    paths: List[str] = []
    for item in filenames:
        item = os.fspath(item)
        if os.path.isdir(item):
            found = sorted(glob.glob(os.path.join(item, "*.parquet")))
            if not found:
                raise DataError(f"directory {item!r} holds no *.parquet files; "
                                "give the files themselves or write them there first")
            paths.extend(found)
        elif any(c in item for c in "*?["):
            found = sorted(glob.glob(item))
            if not found:
                raise DataError(f"pattern {item!r} matches no file; check the path")
            paths.extend(found)
        else:
            if not os.path.isfile(item):
                raise DataError(f"Parquet file {item!r} does not exist (working directory {os.getcwd()}); "
                                "check the path or create it first")
            paths.append(item)
    if not paths:
        raise DataError("no input files given; pass at least one Parquet file")
    return paths


def read_info(path: str) -> ParquetFileInfo:
    """Reads the footer of ``path``; a file that is not Parquet gets an error naming it."""
    try:
        meta = pq.ParquetFile(path).metadata
        schema = pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"cannot read {path!r} as Parquet: {exc}") from exc
    rows = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
    return ParquetFileInfo(path=path, row_group_rows=rows, schema=schema)


def select_fields(info: ParquetFileInfo, fields: Optional[Sequence[str]]) -> pa.Schema:
    """The schema of ``fields`` (all columns when None) in ``info``; names a missing column."""
    if fields is None:
        return info.schema
    missing = [f for f in fields if info.schema.get_field_index(f) < 0]
    if missing:
        raise DataError(f"column(s) {', '.join(map(repr, missing))} not found in {info.path!r}; "
                        f"it has: {', '.join(info.schema.names)}")
    return pa.schema([info.schema.field(f) for f in fields])


def check_same_schema(infos: Sequence[ParquetFileInfo], fields: Optional[Sequence[str]]) -> pa.Schema:
    """The common schema of ``fields`` across files; raises naming the first file and column that differ."""
    reference = select_fields(infos[0], fields)
    for info in infos[1:]:
        schema = select_fields(info, fields if fields is not None else reference.names)
        if fields is None and len(info.schema) != len(reference):
            extra = sorted(set(info.schema.names) ^ set(reference.names))
            raise DataError(f"{info.path!r} and {infos[0].path!r} have different columns "
                            f"(differing: {', '.join(extra)}); pass fields=[...] to read the common ones")
        for ref_field in reference:
            field = schema.field(ref_field.name)
            if not field.type.equals(ref_field.type):
                raise DataError(f"column {ref_field.name!r} is {field.type} in {info.path!r} but "
                                f"{ref_field.type} in {infos[0].path!r}; rewrite the files with one schema")
    return reference
