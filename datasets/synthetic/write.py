"""Writes synthetic Criteo-shaped Parquet files, one chunk (row group) in memory at a time."""

from __future__ import annotations

import logging
import os
from typing import List

import pyarrow.parquet as pq

from datasets import schema
from datasets.synthetic.generate import Teacher, generate_table

logger = logging.getLogger("datasets.synthetic")


def generate(out_dir: str, rows: int, *, files: int = 1, scale: float = 0.01, seed: int = 0,
             zipf: float = 1.1, teacher_seed: int = 0, row_group_size: int = 65536,
             compression: str = "snappy") -> List[str]:
    """Writes ``rows`` rows over ``files`` files ``part-00000.parquet``... in ``out_dir``; returns their paths.

    Rows are split as evenly as possible between files; each file is written
    in row groups of ``row_group_size`` rows. Deterministic in all arguments.
    """
    if files < 1:
        raise ValueError(f"files={files} must be at least 1")
    if row_group_size < 1:
        raise ValueError(f"row_group_size={row_group_size} must be at least 1")
    os.makedirs(out_dir, exist_ok=True)
    teacher = Teacher.create(teacher_seed, scale=scale, zipf=zipf)
    paths = []
    for f in range(files):
        file_rows = rows // files + (1 if f < rows % files else 0)
        path = os.path.join(out_dir, f"part-{f:05d}.parquet")
        with pq.ParquetWriter(path, schema.arrow_schema(), compression=compression) as writer:
            for chunk, start in enumerate(range(0, file_rows, row_group_size)):
                n = min(row_group_size, file_rows - start)
                writer.write_table(generate_table(n, scale=scale, seed=seed, zipf=zipf, teacher=teacher,
                                                  stream=f * 1_000_003 + chunk),
                                   row_group_size=row_group_size)
        paths.append(path)
    logger.info("wrote %d synthetic rows to %d file(s) in %s", rows, files, out_dir)
    return paths
