"""Reads Criteo TSV files (plain or gzip) in blocks and validates them column by column.

Each block is parsed by pyarrow's streaming CSV reader with every column as
a string; validation, the numeric transform and hex decoding are vectorised.
Rows with the wrong number of fields are caught by the reader, rows with a
bad value by :func:`validate`; both are reported by physical line number.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, List, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from datasets import schema

# What a valid field looks like (the serving graph of modelzoo.criteo_serving checks requests with these too).
INTEGER_PATTERN = r"^-?[0-9]{1,18}$"
HEX_PATTERN = r"^[0-9a-fA-F]{1,16}$"
NIBBLE = np.full(256, 0, dtype=np.uint64)  # hex digit character -> its value
for _c in range(10):
    NIBBLE[ord("0") + _c] = _c
for _c in range(6):
    NIBBLE[ord("a") + _c] = NIBBLE[ord("A") + _c] = 10 + _c


@dataclasses.dataclass
class Rejected:
    """A row left out: file, 1-based line number and why."""

    path: str
    line: int
    reason: str


class TsvBlocks:
    """Streams ``path`` as record batches of string columns; counts and numbers malformed lines.

    Attributes:
      skipped_lines: sorted 1-based numbers of lines with the wrong field count.
      raw: the underlying file (its position measures progress in file bytes).
    """

    def __init__(self, path: str, block_size: int = 1 << 24):
        self.path = path
        self.skipped: List[Rejected] = []
        self.raw = pa.OSFile(path, "rb")
        with open(path, "rb") as probe:
            gzipped = probe.read(2) == b"\x1f\x8b"
        stream = pa.CompressedInputStream(self.raw, "gzip") if gzipped else self.raw
        self.reader = pacsv.open_csv(
            stream,
            read_options=pacsv.ReadOptions(column_names=list(schema.COLUMNS), use_threads=False,
                                           block_size=block_size),
            parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False, escape_char=False,
                                             ignore_empty_lines=False, invalid_row_handler=self._invalid),
            convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in schema.COLUMNS},
                                                 strings_can_be_null=False, quoted_strings_can_be_null=False))
        self._rows = 0

    def _invalid(self, row) -> str:
        self.skipped.append(Rejected(self.path, int(row.number) if row.number is not None else -1,
                                     f"{row.actual_columns} fields instead of {row.expected_columns}"))
        return "skip"

    def line_numbers(self, index: np.ndarray) -> np.ndarray:
        """1-based line numbers of rows ``index`` (0-based over the rows read, malformed lines excluded)."""
        s = np.array(sorted(r.line for r in self.skipped), dtype=np.int64)
        valid_before = s - 1 - np.arange(len(s))
        return index + 1 + np.searchsorted(valid_before, index, side="right")

    def __iter__(self) -> Iterator[Tuple[int, pa.RecordBatch]]:
        """Yields ``(first_row_index, batch)``."""
        for batch in self.reader:
            start = self._rows
            self._rows += batch.num_rows
            yield start, batch

    def close(self) -> None:
        self.raw.close()


def validate(batch: pa.RecordBatch) -> Tuple[np.ndarray, List[str]]:
    """``(ok, reasons)``: which rows are valid, and for each invalid row the first bad column."""
    n = batch.num_rows
    ok = np.ones(n, dtype=bool)
    reason = np.full(n, "", dtype=object)

    def check(name: str, good: pa.Array, what: str) -> None:
        good = pc.fill_null(good, False).to_numpy(zero_copy_only=False)
        newly = ok & ~good
        reason[newly] = f"{name}={what}"
        ok[:] &= good

    label = batch.column(schema.LABEL)
    check(schema.LABEL, pc.is_in(label, value_set=pa.array(["0", "1"])), "not 0 or 1")
    for name in schema.DENSE:
        col = batch.column(name)
        check(name, pc.or_(pc.equal(col, ""), pc.match_substring_regex(col, INTEGER_PATTERN)), "not an integer")
    for name in schema.CATEGORICAL:
        col = batch.column(name)
        check(name, pc.or_(pc.equal(col, ""), pc.match_substring_regex(col, HEX_PATTERN)), "not hexadecimal")
    bad = np.flatnonzero(~ok)
    values = [batch.column(r.split("=")[0])[int(i)].as_py() for i, r in zip(bad, reason[bad])]
    return ok, [f"{r.split('=')[0]}={v!r} is {r.split('=')[1]}" for r, v in zip(reason[bad], values)]


def numeric(column: pa.Array, log_transform: bool = True) -> np.ndarray:
    """A validated integer column as float32: missing -> 0, negatives -> 0, then log(x + 1)."""
    filled = pc.if_else(pc.equal(column, ""), "0", column)
    values = np.maximum(pc.cast(filled, pa.int64()).to_numpy(zero_copy_only=False), 0).astype(np.float64)
    return (np.log1p(values) if log_transform else values).astype(np.float32)


def hex_values(column: pa.Array) -> Tuple[np.ndarray, np.ndarray]:
    """``(values, present)`` of a validated hex column: uint64 values, and False where empty."""
    column = pc.cast(column, pa.string()) if column.type != pa.string() else column
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n = len(column)
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int32)[column.offset:column.offset + n + 1]
    data = np.frombuffer(column.buffers()[2], dtype=np.uint8) if column.buffers()[2] is not None else \
        np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    present = lengths > 0
    values = np.zeros(n, dtype=np.uint64)
    chars = data[offsets[0]:offsets[-1]]
    if len(chars):
        nibbles = NIBBLE[chars]
        row_of = np.repeat(np.arange(n), lengths)
        position_from_end = (offsets[1:][row_of] - offsets[0]) - 1 - np.arange(len(chars))
        shifted = nibbles << (np.uint64(4) * position_from_end.astype(np.uint64))
        starts = offsets[:-1][present] - offsets[0]
        values[present] = np.bitwise_or.reduceat(shifted, starts)
    return values, present
