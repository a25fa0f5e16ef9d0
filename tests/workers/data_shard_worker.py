"""Reads this worker's share of the Parquet files in argv[1] through collective.data; writes rank<r>.npz.

The rank and world size come from the launcher's environment (collective.context).
"""

import os
import sys

import numpy as np

import collective.data as cd
from collective import context

in_dir, out_dir, shard_by = sys.argv[1], sys.argv[2], sys.argv[3]
ctx = context.get()
ds = cd.parquet_dataset(in_dir, batch_size=7, fields=["row"], shard_by=shard_by)
rows = [batch["row"].numpy() for batch in ds]
rows = np.concatenate(rows) if rows else np.zeros([0], np.int64)
np.savez(os.path.join(out_dir, f"rank{ctx.rank}.npz"), rows=rows, world_size=ctx.world_size)
