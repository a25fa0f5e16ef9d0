"""Runs the generated programs of a JSON file on every worker (and in one process on rank 0).

argv: programs.json out_dir; writes <out_dir>/rank<r>.npz (program_cases.run_all).
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

import program_cases
from collective import comm

tf.get_logger().setLevel("ERROR")
programs_file, out_dir = sys.argv[1], sys.argv[2]
with open(programs_file, encoding="utf-8") as f:
    programs = json.load(f)
comm.init()
results = program_cases.run_all(programs, comm.rank(), out_dir)
np.savez(os.path.join(out_dir, f"rank{comm.rank()}.npz"), **results)
