"""Reports what this worker sees of its interpreter, as JSON on stdout; ``fail`` makes the last rank raise.

Run with and without the launcher's ``--preload``: the reports must agree except for the random draws. The
failing rank raises only once the others have ended (each leaves a file in a folder of this launch as its last
exit handler): a failure stops the job, and on a loaded machine it could stop a rank that had not reported yet.
"""

import atexit
import json
import logging
import os
import pathlib
import shutil
import sys
import tempfile
import time

import numpy as np

rank, size = int(os.environ["HOROVOD_RANK"]), int(os.environ["HOROVOD_SIZE"])
fail = sys.argv[1:] == ["fail"]
ended = pathlib.Path(tempfile.gettempdir()) / f"preload-probe-{os.environ['HOROVOD_GLOO_RENDEZVOUS_PORT']}"
if fail and rank < size - 1:
    ended.mkdir(exist_ok=True)
    atexit.register(lambda: (ended / str(rank)).touch())  # registered first: runs last
logging.basicConfig(level=logging.INFO, format="probe-log %(levelname)s %(message)s")
logging.info("rank %d logs through its own configuration", rank)
atexit.register(lambda: print(f"atexit handler of rank {rank} ran", flush=True))
print(json.dumps({"rank": rank, "name": __name__, "argv": sys.argv, "path0": sys.path[0], "stdin": sys.stdin.read(),
                  "stdout_buffered": not sys.stdout.write_through, "draw": float(np.random.rand()),
                  "threads": os.environ["OMP_NUM_THREADS"], "log_level": logging.getLogger().level}))
if fail and rank == size - 1:
    deadline = time.monotonic() + 60
    while (not ended.is_dir() or len(list(ended.iterdir())) < size - 1) and time.monotonic() < deadline:
        time.sleep(0.05)
    shutil.rmtree(ended, ignore_errors=True)
    raise ValueError(f"probe failure on rank {rank}")
