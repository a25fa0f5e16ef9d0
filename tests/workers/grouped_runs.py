"""One launch of grouped_worker.py per (backend, world size), shared by the test modules that read it."""

import functools
import pathlib
import tempfile
from typing import Dict, List

import numpy as np

from launcher import load_rank_results, run_workers


@functools.lru_cache(maxsize=None)
def grouped_results(backend: str, n: int) -> List[Dict[str, np.ndarray]]:
    """Every rank's results of tests/workers/grouped_worker.py on ``n`` workers."""
    with tempfile.TemporaryDirectory(prefix=f"grouped-{backend}-{n}-") as out:
        run_workers("grouped_worker.py", n, [out, backend])
        return load_rank_results(pathlib.Path(out), n)
