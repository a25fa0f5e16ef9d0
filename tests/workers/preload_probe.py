"""Reports what this worker sees of its interpreter, as JSON on stdout; ``fail`` makes the last rank raise.

Run with and without the launcher's ``--preload``: the reports must agree except for the random draws.
"""

import atexit
import json
import logging
import os
import sys

import numpy as np

rank, size = int(os.environ["HOROVOD_RANK"]), int(os.environ["HOROVOD_SIZE"])
logging.basicConfig(level=logging.INFO, format="probe-log %(levelname)s %(message)s")
logging.info("rank %d logs through its own configuration", rank)
atexit.register(lambda: print(f"atexit handler of rank {rank} ran", flush=True))
print(json.dumps({"rank": rank, "name": __name__, "argv": sys.argv, "path0": sys.path[0], "stdin": sys.stdin.read(),
                  "stdout_buffered": not sys.stdout.write_through, "draw": float(np.random.rand()),
                  "threads": os.environ["OMP_NUM_THREADS"], "log_level": logging.getLogger().level}))
if sys.argv[1:] == ["fail"] and rank == size - 1:
    raise ValueError(f"probe failure on rank {rank}")
