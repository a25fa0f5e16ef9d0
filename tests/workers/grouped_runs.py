"""One launch of grouped_worker.py per world size for every backend, shared by the test modules that read it."""

import pathlib
import tempfile
from typing import Dict, List

import numpy as np

from launcher import launch_once, load_rank_results, run_workers

BACKENDS = ("hb", "sok", "replicated")


@launch_once
def _all_backends(n: int) -> Dict[str, List[Dict[str, np.ndarray]]]:
    with tempfile.TemporaryDirectory(prefix=f"grouped-{n}-") as out:
        run_workers("grouped_worker.py", n, [out, ",".join(BACKENDS)])
        return {b: load_rank_results(pathlib.Path(out) / b, n) for b in BACKENDS}


def grouped_results(backend: str, n: int) -> List[Dict[str, np.ndarray]]:
    """Every rank's results of tests/workers/grouped_worker.py on ``n`` workers under ``backend``."""
    return _all_backends(n)[backend]
