"""Runs worker scripts through ``python -m collective.launch`` for tests."""

from __future__ import annotations

import functools
import os
import pathlib
import subprocess
import sys
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

WORKERS = pathlib.Path(__file__).resolve().parent / "workers"
FAST_EXIT = pathlib.Path(__file__).resolve().parent / "fast_exit.py"


def _launch_command(script: str, n: int, args: Sequence[str], env: Optional[Dict[str, str]], fast_exit: bool = True):
    path = script if os.path.isabs(script) else str(WORKERS / script)
    full_env = dict(os.environ)
    full_env["CUDA_VISIBLE_DEVICES"] = ""  # the tests run on CPU, any number of workers, GPUs or not
    full_env.update(env or {})
    # Each worker runs its script through fast_exit.py: the same program, without the interpreter's teardown.
    runner = [str(FAST_EXIT)] if fast_exit else []
    return [sys.executable, "-m", "collective.launch", "-n", str(n), *runner, path, *map(str, args)], full_env


def run_workers(script: str, n: int, args: Sequence[str] = (), env: Optional[Dict[str, str]] = None,
                timeout: float = 300, check: bool = True, fast_exit: bool = True) -> subprocess.CompletedProcess:
    """Runs ``tests/workers/<script>`` on ``n`` workers; with ``check`` a failure shows all output.

    ``fast_exit=False`` hands the script to the launcher itself (to test what the launcher does with it).
    """
    cmd, full_env = _launch_command(script, n, args, env, fast_exit)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n"
                             f"--- stdout\n{proc.stdout[-8000:]}\n--- stderr\n{proc.stderr[-12000:]}")
    return proc


def launch_once(fn: Callable) -> Callable:
    """Caches ``fn``'s result per arguments, failures included: a failed launch is not rerun by every test."""
    outcomes: Dict[tuple, tuple] = {}

    @functools.wraps(fn)
    def cached(*args):
        if args not in outcomes:
            try:
                outcomes[args] = (True, fn(*args))
            except Exception as err:  # pylint: disable=broad-except
                outcomes[args] = (False, err)
        ok, value = outcomes[args]
        if not ok:
            raise value
        return value

    return cached


def load_rank_results(out_dir: pathlib.Path, n: int) -> List[Dict[str, np.ndarray]]:
    """The ``rank<r>.npz`` files the workers wrote, in rank order."""
    results = []
    for r in range(n):
        with np.load(out_dir / f"rank{r}.npz") as data:
            results.append({k: data[k] for k in data.files})
    return results


def held(full: np.ndarray, backend: str, r: int, n: int) -> np.ndarray:
    """The rows of the logical table ``full`` that rank ``r`` of ``n`` holds under ``backend``."""
    return full if backend == "replicated" else full[r::n]


def start_workers(script: str, n: int, args: Sequence[str] = (),
                  env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    """Starts ``tests/workers/<script>`` on ``n`` workers and returns at once.

    The launcher's stdout and stderr come merged, as text, from the returned
    process's ``stdout``; its worker processes die with it.
    """
    cmd, full_env = _launch_command(script, n, args, env)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, bufsize=1, env=full_env)
