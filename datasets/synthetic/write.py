"""Writes synthetic Criteo-shaped Parquet files, one chunk (row group) in memory at a time, or a Criteo TSV."""

from __future__ import annotations

import concurrent.futures
import logging
import os
from typing import List

import numpy as np
import pyarrow.parquet as pq

from collective.cli import progress as progress_bar
from datasets import schema
from datasets.synthetic.generate import Teacher, generate_table

logger = logging.getLogger("datasets.synthetic")


def generate(out_dir: str, rows: int, *, files: int = 1, scale: float = 0.01, seed: int = 0,
             zipf: float = 1.1, teacher_seed: int = 0, row_group_size: int = 65536,
             compression: str = "snappy", progress: bool = True) -> List[str]:
    """Writes ``rows`` rows over ``files`` files ``part-00000.parquet``... in ``out_dir``; returns their paths.

    Rows are split as evenly as possible between files; each file is written
    in row groups of ``row_group_size`` rows. Deterministic in all arguments.
    ``progress``: a bar of rows written on stderr (:func:`collective.cli.progress.bar`).
    """
    if files < 1:
        raise ValueError(f"files={files} must be at least 1")
    if row_group_size < 1:
        raise ValueError(f"row_group_size={row_group_size} must be at least 1")
    os.makedirs(out_dir, exist_ok=True)
    teacher = Teacher.create(teacher_seed, scale=scale, zipf=zipf)
    chunks = []  # (file, stream, rows) in writing order
    for f in range(files):
        file_rows = rows // files + (1 if f < rows % files else 0)
        for chunk, start in enumerate(range(0, file_rows, row_group_size)):
            chunks.append((f, f * 1_000_003 + chunk, min(row_group_size, file_rows - start)))
    paths = [os.path.join(out_dir, f"part-{f:05d}.parquet") for f in range(files)]
    writers = {}

    def make(chunk):
        return generate_table(chunk[2], scale=scale, seed=seed, zipf=zipf, teacher=teacher, stream=chunk[1])

    desc = f"generating {os.path.basename(os.path.normpath(out_dir))}"
    # numpy and Parquet encoding both release the GIL: the next chunk is generated while this one is written.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool, \
            progress_bar.bar(rows, desc, unit="rows", unit_scale=True, disable=not progress) as bar:
        try:
            pending = pool.submit(make, chunks[0]) if chunks else None
            for i, chunk in enumerate(chunks):
                table = pending.result()
                pending = pool.submit(make, chunks[i + 1]) if i + 1 < len(chunks) else None
                if chunk[0] not in writers:
                    writers[chunk[0]] = pq.ParquetWriter(paths[chunk[0]], schema.arrow_schema(),
                                                         compression=compression,
                                                         use_dictionary=list(schema.CATEGORICAL))
                writers[chunk[0]].write_table(table, row_group_size=row_group_size)
                bar.update(chunk[2])
        finally:
            for writer in writers.values():
                writer.close()
    for f, path in enumerate(paths):
        if f not in writers:  # a file with no rows still gets the schema
            pq.ParquetWriter(path, schema.arrow_schema(), compression=compression).close()
    logger.info("wrote %d synthetic rows to %d file(s) in %s", rows, files, out_dir)
    return paths


def write_criteo_tsv(table, path: str) -> int:
    """Writes ``table`` (Criteo-shaped, as :func:`generate_table` makes it) as a Criteo TSV, what
    ``python -m datasets.criteo`` converts: counts undo the numeric transform, ids become 8 hex digits.
    Returns the file's size in bytes."""
    cols = [table.column(schema.LABEL).to_numpy().astype(np.int64).astype(str)]
    for name in schema.DENSE:
        cols.append(np.round(np.expm1(table.column(name).to_numpy())).astype(np.int64).astype(str))
    for name in schema.CATEGORICAL:
        cols.append(np.char.mod("%08x", table.column(name).to_numpy() * 2654435761 % (1 << 32)))
    lines = cols[0]
    for col in cols[1:]:
        lines = np.char.add(np.char.add(lines, "\t"), col)
    with open(path, "w") as f:
        f.write("\n".join(lines.tolist()) + "\n")
    return os.path.getsize(path)
