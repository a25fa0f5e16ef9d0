"""Criteo TSV (Kaggle display advertising / Terabyte ``day_N``) -> Parquet in the shared schema.

Streams every input in blocks (constant memory apart from the vocabulary),
writes ``part-00000.parquet``... of ``rows_per_file`` rows, ``meta.json``
(:func:`datasets.schema.write_meta`: table sizes, options, counts) and, with
a frequency threshold, ``vocabulary.arrow``; :func:`convert_dataset` writes
the ``train/`` + ``test/`` layout the model zoo reads. Malformed rows are
counted, logged with their file and line, and skipped.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from collective.cli import progress as progress_bar
from datasets import schema
from datasets.criteo.parse import Rejected, TsvBlocks, hex_values, numeric, validate
from datasets.criteo.vocab import FrequencyCounter, Vocabulary, hashed_ids, table_sizes

logger = logging.getLogger("datasets.criteo")
VOCABULARY_FILE = "vocabulary.arrow"


@dataclasses.dataclass
class ConversionSummary:
    """What a conversion did. ``rejected`` lists the first ``max_reported`` rejected rows."""

    rows_written: int = 0
    rows_rejected: int = 0
    rejected: List[Rejected] = dataclasses.field(default_factory=list)
    bytes_read: int = 0
    seconds: float = 0.0
    files: List[str] = dataclasses.field(default_factory=list)
    table_sizes: List[int] = dataclasses.field(default_factory=list)
    vocabulary_path: Optional[str] = None

    def __str__(self) -> str:
        mb = self.bytes_read / 1e6
        return (f"{self.rows_written} rows written to {len(self.files)} file(s), {self.rows_rejected} rejected; "
                f"{mb:.1f} MB read in {self.seconds:.1f} s ({mb / max(self.seconds, 1e-9):.1f} MB/s)")


class _RollingWriter:
    """Writes tables into ``part-NNNNN.parquet`` files of at most ``rows_per_file`` rows."""

    def __init__(self, out_dir: str, rows_per_file: int, row_group_size: int):
        self.out_dir, self.rows_per_file, self.row_group_size = out_dir, rows_per_file, row_group_size
        self.files: List[str] = []
        self._writer: Optional[pq.ParquetWriter] = None
        self._rows_in_file = 0

    def write(self, table: pa.Table) -> None:
        while table.num_rows:
            if self._writer is None or self._rows_in_file >= self.rows_per_file:
                self.close()
                path = os.path.join(self.out_dir, f"part-{len(self.files):05d}.parquet")
                self._writer = pq.ParquetWriter(path, schema.arrow_schema())
                self.files.append(path)
                self._rows_in_file = 0
            take = min(table.num_rows, self.rows_per_file - self._rows_in_file)
            self._writer.write_table(table.slice(0, take), row_group_size=self.row_group_size)
            self._rows_in_file += take
            table = table.slice(take)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _check_inputs(inputs: Sequence[str]) -> List[str]:
    paths = [os.fspath(p) for p in inputs]
    if not paths:
        raise ValueError("no input files; give one or more Criteo TSV files (plain or .gz)")
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"Criteo input {path!r} does not exist (working directory {os.getcwd()})")
    return paths


def _valid_blocks(paths: Sequence[str], block_size: int, bar: tqdm, summary: ConversionSummary,
                  max_reported: int, report: bool):
    """Yields the valid rows of every block; counts (and with ``report`` logs) the rejected ones."""
    done = 0
    for path in paths:
        blocks = TsvBlocks(path, block_size)
        reported_skips = 0
        try:
            for start, batch in blocks:
                ok, reasons = validate(batch)
                bar.update(done + blocks.raw.tell() - bar.n)
                if report:
                    bad = np.flatnonzero(~ok)
                    if len(bad):
                        lines = blocks.line_numbers(start + bad)
                        _reject(summary, [Rejected(path, int(l), r) for l, r in zip(lines, reasons)], max_reported)
                    new_skips = blocks.skipped[reported_skips:]
                    reported_skips = len(blocks.skipped)
                    _reject(summary, new_skips, max_reported)
                yield batch.filter(pa.array(ok)) if not ok.all() else batch
            if report:
                _reject(summary, blocks.skipped[reported_skips:], max_reported)
        finally:
            done += os.path.getsize(path)
            blocks.close()
        bar.update(done - bar.n)


def _reject(summary: ConversionSummary, rows: List[Rejected], max_reported: int) -> None:
    summary.rows_rejected += len(rows)
    for row in rows:
        if len(summary.rejected) < max_reported:
            summary.rejected.append(row)
            logger.warning("skipping %s line %d: %s", row.path, row.line, row.reason)


def _vocabulary_and_rows(paths: Sequence[str], out_dir: str, summary: ConversionSummary, *, min_count: int,
                         hash_buckets: Optional[int], vocabulary: Optional[str], count_rows: bool, block_size: int,
                         progress: bool, max_reported: int) -> Tuple[Optional[Vocabulary], int]:
    """The vocabulary ids come from (None when hashing) and, when asked or counted anyway, the valid rows."""
    vocab = Vocabulary.load(vocabulary) if vocabulary is not None else None
    if vocabulary is None and hash_buckets is None and min_count < 1:
        raise ValueError(f"min_count={min_count} must be at least 1")
    counter = FrequencyCounter() if vocabulary is None and hash_buckets is None else None
    if counter is None and not count_rows:
        return vocab, -1
    rows = 0
    total = sum(os.path.getsize(p) for p in paths)
    with progress_bar.bar(total, "counting", unit="B", unit_scale=True, disable=not progress) as bar:
        for batch in _valid_blocks(paths, block_size, bar, summary, max_reported, report=False):
            rows += batch.num_rows
            if counter is not None:
                for name in schema.CATEGORICAL:
                    values, present = hex_values(batch.column(name))
                    counter.update(name, values[present])
    if counter is not None:
        vocab = counter.vocabulary(min_count)
        summary.vocabulary_path = os.path.join(out_dir, VOCABULARY_FILE)
        vocab.save(summary.vocabulary_path)
    return vocab, rows


def _convert(paths: Sequence[str], writers: Sequence[Tuple["_RollingWriter", int]], summary: ConversionSummary,
             vocab: Optional[Vocabulary], hash_buckets: Optional[int], log_transform: bool, block_size: int,
             progress: bool, max_reported: int) -> None:
    """Converts the valid rows of ``paths`` in order: the first ``limit`` to the first writer, and so on
    (a limit < 0: every row that is left)."""
    total = sum(os.path.getsize(p) for p in paths)
    index, written = 0, 0
    with progress_bar.bar(total, "converting", unit="B", unit_scale=True, disable=not progress) as bar:
        for batch in _valid_blocks(paths, block_size, bar, summary, max_reported, report=True):
            table = _convert_block(batch, vocab, hash_buckets, log_transform)
            while table.num_rows:
                writer, limit = writers[index]
                take = table.num_rows if limit < 0 else min(table.num_rows, limit - written)
                writer.write(table.slice(0, take))
                written += take
                table = table.slice(take)
                if table.num_rows:
                    index, written = index + 1, 0
            summary.rows_written += batch.num_rows


def convert(inputs: Union[str, Sequence[str]], out_dir: str, *, min_count: int = 1,
            hash_buckets: Optional[int] = None, vocabulary: Optional[str] = None, log_transform: bool = True,
            rows_per_file: int = 1 << 22, row_group_size: int = 1 << 17, block_size: int = 1 << 24,
            progress: bool = True, max_reported: int = 100) -> ConversionSummary:
    """Converts Criteo TSV ``inputs`` into Parquet files in ``out_dir`` (one split; see :func:`convert_dataset`
    for the train/test layout the model zoo reads).

    Categorical ids (0 = missing or rare) come from, in order of precedence:
    an existing ``vocabulary`` file (e.g. the training days' for the test
    day), ``hash_buckets`` (one pass: ``1 + value % (hash_buckets - 1)``), or
    a vocabulary of values seen at least ``min_count`` times (two passes;
    saved as ``out_dir/vocabulary.arrow``). Numeric columns become
    ``log(x + 1)`` with negatives clipped to 0 (``log_transform=False``: x
    clipped, untransformed); missing numbers are 0.
    """
    started = time.perf_counter()
    paths = _check_inputs([inputs] if isinstance(inputs, (str, os.PathLike)) else inputs)
    os.makedirs(out_dir, exist_ok=True)
    summary = ConversionSummary()
    vocab, _ = _vocabulary_and_rows(paths, out_dir, summary, min_count=min_count, hash_buckets=hash_buckets,
                                    vocabulary=vocabulary, count_rows=False, block_size=block_size,
                                    progress=progress, max_reported=max_reported)
    writer = _RollingWriter(out_dir, rows_per_file, row_group_size)
    try:
        _convert(paths, [(writer, -1)], summary, vocab, hash_buckets, log_transform, block_size, progress,
                 max_reported)
    finally:
        writer.close()
    _finish(summary, paths, writer.files, vocab, hash_buckets, total_bytes=sum(os.path.getsize(p) for p in paths),
            started=started)
    _write_meta(out_dir, summary, {"rows": summary.rows_written}, min_count=min_count, hash_buckets=hash_buckets,
                vocabulary=vocabulary, log_transform=log_transform, inputs=paths)
    return summary


def convert_dataset(inputs: Union[str, Sequence[str]], out_dir: str, *, test_inputs: Sequence[str] = (),
                    test_fraction: float = 0.0, min_count: int = 1, hash_buckets: Optional[int] = None,
                    vocabulary: Optional[str] = None, log_transform: bool = True, rows_per_file: int = 1 << 22,
                    row_group_size: int = 1 << 17, block_size: int = 1 << 24, progress: bool = True,
                    max_reported: int = 100) -> ConversionSummary:
    """Converts Criteo TSV files into the layout the model zoo reads (``--data out_dir``).

    ``out_dir/train/`` and ``out_dir/test/`` hold Parquet files,
    ``out_dir/meta.json`` the table sizes (:func:`datasets.schema.write_meta`)
    and, with a frequency threshold, ``out_dir/vocabulary.arrow``. The test
    split is ``test_inputs`` (Criteo 1TB: the last day, ``day_23``) or else
    the last ``test_fraction`` of the valid rows of ``inputs`` in file order
    (Kaggle's ``train.txt`` is in time order). The vocabulary counts every
    input row, the test split's included, as DLRM's reference preprocessing
    does. Ids are as in :func:`convert`.
    """
    started = time.perf_counter()
    train_paths = _check_inputs([inputs] if isinstance(inputs, (str, os.PathLike)) else inputs)
    test_paths = _check_inputs(test_inputs) if test_inputs else []
    if test_paths and test_fraction:
        raise ValueError("give the test split as test_inputs or as test_fraction, not both")
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction={test_fraction} must be in [0, 1)")
    paths = train_paths + test_paths
    for split in ("train", "test"):
        os.makedirs(os.path.join(out_dir, split), exist_ok=True)
    summary = ConversionSummary()
    vocab, rows = _vocabulary_and_rows(paths, out_dir, summary, min_count=min_count, hash_buckets=hash_buckets,
                                       vocabulary=vocabulary, count_rows=bool(test_fraction), block_size=block_size,
                                       progress=progress, max_reported=max_reported)
    if test_fraction:
        train_rows = rows - int(round(rows * test_fraction))
    else:
        train_rows = -1 if not test_paths else None
    train = _RollingWriter(os.path.join(out_dir, "train"), rows_per_file, row_group_size)
    test = _RollingWriter(os.path.join(out_dir, "test"), rows_per_file, row_group_size)
    splits = {}
    try:
        if train_rows is None:  # test days given: every row of the training files, then every row of the test days
            _convert(train_paths, [(train, -1)], summary, vocab, hash_buckets, log_transform, block_size, progress,
                     max_reported)
            splits["train"] = summary.rows_written
            _convert(test_paths, [(test, -1)], summary, vocab, hash_buckets, log_transform, block_size, progress,
                     max_reported)
        else:
            _convert(paths, [(train, train_rows), (test, -1)], summary, vocab, hash_buckets, log_transform,
                     block_size, progress, max_reported)
            splits["train"] = summary.rows_written if train_rows < 0 else min(train_rows, summary.rows_written)
    finally:
        train.close()
        test.close()
    splits["test"] = summary.rows_written - splits["train"]
    if not splits["test"]:
        logger.warning("the test split of %s is empty: give test_inputs (--test) or test_fraction (--test_fraction)",
                       out_dir)
    _finish(summary, paths, train.files + test.files, vocab, hash_buckets,
            total_bytes=sum(os.path.getsize(p) for p in paths), started=started)
    _write_meta(out_dir, summary, {"train_rows": splits["train"], "test_rows": splits["test"]}, min_count=min_count,
                hash_buckets=hash_buckets, vocabulary=vocabulary, log_transform=log_transform,
                inputs=train_paths, test_inputs=test_paths, test_fraction=test_fraction)
    return summary


def _finish(summary: ConversionSummary, paths: Sequence[str], files: List[str], vocab: Optional[Vocabulary],
            hash_buckets: Optional[int], total_bytes: int, started: float) -> None:
    order = {path: i for i, path in enumerate(paths)}
    summary.rejected.sort(key=lambda r: (order[r.path], r.line))
    summary.files = files
    summary.bytes_read = total_bytes
    summary.table_sizes = table_sizes(vocab, hash_buckets)
    summary.seconds = time.perf_counter() - started
    logger.info("%s", summary)


def _convert_block(batch: pa.RecordBatch, vocab: Optional[Vocabulary], hash_buckets: Optional[int],
                   log_transform: bool) -> pa.Table:
    columns: Dict[str, np.ndarray] = {
        schema.LABEL: pa.compute.cast(batch.column(schema.LABEL), pa.float32()).to_numpy(zero_copy_only=False)}
    for name in schema.DENSE:
        columns[name] = numeric(batch.column(name), log_transform)
    for name in schema.CATEGORICAL:
        values, present = hex_values(batch.column(name))
        columns[name] = vocab.lookup(name, values, present) if vocab is not None else \
            hashed_ids(values, present, hash_buckets)
    return pa.Table.from_pydict(columns, schema=schema.arrow_schema())


def _write_meta(out_dir: str, summary: ConversionSummary, rows: Dict[str, int], **options) -> None:
    schema.write_meta(out_dir, summary.table_sizes, format="criteo", **rows, rows_rejected=summary.rows_rejected,
                      files=[os.path.relpath(f, out_dir) for f in summary.files],
                      vocabulary=VOCABULARY_FILE if summary.vocabulary_path else None, options=options)
