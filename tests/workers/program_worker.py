"""Runs one life of the generated programs of a JSON file on every worker (and the plain process on rank 0).

argv: programs.json work_dir out_dir life; writes <out_dir>/rank<r>.npz (program_life.run_all). ``work_dir``
holds each program's model_dir and exports from one launch to the next.
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

import program_life
from collective import comm

tf.get_logger().setLevel("ERROR")
programs_file, work_dir, out_dir, life = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
with open(programs_file, encoding="utf-8") as f:
    programs = json.load(f)
comm.init()
results = program_life.run_all(programs, comm.rank(), work_dir, life)
np.savez(os.path.join(out_dir, f"rank{comm.rank()}.npz"), **results)
