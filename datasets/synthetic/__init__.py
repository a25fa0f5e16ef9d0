"""Criteo-shaped synthetic data with learnable labels (``python -m datasets.synthetic --help``).

Public API:
  generate(out_dir, rows, *, files=1, scale=0.01, seed=0, zipf=1.1, teacher_seed=0,
           row_group_size=65536, compression="snappy", progress=True) -> list of paths
  generate_table(rows, *, scale=0.01, seed=0, zipf=1.1, teacher=None, stream=0) -> pyarrow.Table
  cardinalities(scale=0.01) -> table sizes;  Teacher.create(teacher_seed=0, ctr=0.25)
  write_criteo_tsv(table, path) -> bytes written   (a generated table as a Criteo TSV)
"""

from datasets.synthetic.generate import Teacher, cardinalities, default_teacher, generate_table, zipf_ranks
from datasets.synthetic.write import generate, write_criteo_tsv

__all__ = ["Teacher", "cardinalities", "default_teacher", "generate", "generate_table", "write_criteo_tsv",
           "zipf_ranks"]
