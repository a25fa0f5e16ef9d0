"""Runs worker scripts through ``python -m collective.launch`` for tests."""

from __future__ import annotations

import atexit
import functools
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from collective.runtime.preload import WORKER_MODULES

WORKERS = pathlib.Path(__file__).resolve().parent / "workers"
RECIPES = pathlib.Path(__file__).resolve().parent / "recipes"  # the reference docs' programs (tests/recipes/README.md)
LAUNCH_SERVER = pathlib.Path(__file__).resolve().parent / "launch_server.py"


def _launch_command(script: str, n: int, args: Sequence[str], env: Optional[Dict[str, str]], preload: bool = True):
    path = script if os.path.isabs(script) else str(WORKERS / script)
    full_env = dict(os.environ)
    full_env["CUDA_VISIBLE_DEVICES"] = ""  # the tests run on CPU, any number of workers, GPUs or not
    full_env.update(env or {})
    options = ["--preload", WORKER_MODULES] if preload else []
    return [sys.executable, "-m", "collective.launch", "-n", str(n), *options, path, *map(str, args)], full_env


def run_workers(script: str, n: int, args: Sequence[str] = (), env: Optional[Dict[str, str]] = None,
                timeout: float = 300, check: bool = True, preload: bool = True,
                server: bool = True) -> subprocess.CompletedProcess:
    """Runs ``tests/workers/<script>`` on ``n`` workers; with ``check`` a failure shows all output.

    ``preload=False`` starts each worker as a new interpreter, as the launcher does by default. With ``preload``
    and ``server`` the launcher is forked from the session's warm launch server (tests/launch_server.py) instead of
    started as a new process.
    """
    cmd, full_env = _launch_command(script, n, args, env, preload)
    if preload and server and full_env.get("PYTHONPATH") == os.environ.get("PYTHONPATH"):
        proc = _WARM.run(cmd, full_env, timeout)
    else:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n"
                             f"--- stdout\n{proc.stdout[-8000:]}\n--- stderr\n{proc.stderr[-12000:]}")
    return proc


class _WarmLauncher:
    """The session's launch server, started on first use and stopped when the test process exits."""

    def __init__(self):
        self._proc: Optional[subprocess.Popen] = None
        self._dir = ""
        self._lock = threading.Lock()  # launches may be requested from several threads (run_together)

    def _start(self) -> str:
        with self._lock:
            return self._start_locked()

    def _start_locked(self) -> str:
        if self._proc is None or self._proc.poll() is not None:
            self._dir = tempfile.mkdtemp(prefix="collective-launch-server-")
            path = os.path.join(self._dir, "socket")
            env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
            self._proc = subprocess.Popen([sys.executable, str(LAUNCH_SERVER), path, WORKER_MODULES], env=env,
                                          stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
            line = self._proc.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"the launch server did not start (exit code {self._proc.wait()})")
            atexit.register(self.stop)
        return os.path.join(self._dir, "socket")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _request(self, cmd: List[str], env: Dict[str, str], out_fd: int, err_fd: int) -> socket.socket:
        """Asks the server to fork ``cmd``'s launcher with ``out_fd``, ``err_fd`` as its stdout, stderr; the
        connection that will bring its pid, then its exit code."""
        path = self._start()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.connect(path)
            request = {"argv": cmd[3:], "env": env, "cwd": os.getcwd()}
            socket.send_fds(conn, [json.dumps(request).encode()], [out_fd, err_fd])
        except BaseException:
            conn.close()
            raise
        return conn

    def start(self, cmd: List[str], env: Dict[str, str]) -> "ServedLauncher":
        """``subprocess.Popen(cmd, stdout=PIPE, stderr=STDOUT, text=True, env=env)`` for a launcher command."""
        read_end, write_end = os.pipe()
        try:
            conn = self._request(cmd, env, write_end, write_end)
        finally:
            os.close(write_end)  # the launcher holds it now: the pipe ends when the launcher and its workers do
        stdout = os.fdopen(read_end, "r", encoding="utf-8", errors="replace")
        started = conn.recv(64)
        if not started:
            conn.close()
            raise RuntimeError(f"the launch server did not start {' '.join(cmd)}: {stdout.read()[-4000:]}")
        return ServedLauncher(conn, int(started), stdout)

    def run(self, cmd: List[str], env: Dict[str, str], timeout: float) -> subprocess.CompletedProcess:
        """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)`` for a launcher command."""
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
                self._request(cmd, env, out.fileno(), err.fileno()) as conn:
            conn.settimeout(timeout)
            started = conn.recv(64)  # the launcher's pid, or nothing if it died before it began
            try:
                reply = conn.recv(64) if started else b""
            except socket.timeout:
                os.kill(int(started), signal.SIGKILL)
                raise subprocess.TimeoutExpired(cmd, timeout) from None
            code = int(reply) if reply else 1  # the launcher died without a word: its stderr says why
            texts = []
            for stream in (out, err):
                stream.seek(0)
                texts.append(stream.read().decode(errors="replace"))
        return subprocess.CompletedProcess(cmd, code, *texts)


class ServedLauncher:
    """A launcher forked by the warm launch server, with the part of ``subprocess.Popen`` that tests use on what
    :func:`start_workers` returns: ``pid``, ``stdout`` (stdout and stderr merged, text), ``poll``, ``wait``,
    ``send_signal``, ``kill``. Its exit code is the launcher's; one killed by a signal reports 1."""

    def __init__(self, conn: socket.socket, pid: int, stdout):
        self._conn, self.pid, self.stdout = conn, pid, stdout
        self.returncode: Optional[int] = None

    def _receive(self, timeout: Optional[float]) -> Optional[int]:
        if self.returncode is None:
            self._conn.settimeout(timeout)
            try:
                reply = self._conn.recv(64)
            except (socket.timeout, BlockingIOError):
                return None
            self.returncode = int(reply) if reply else 1
            self._conn.close()
        return self.returncode

    def poll(self) -> Optional[int]:
        return self._receive(0)

    def wait(self, timeout: Optional[float] = None) -> int:
        code = self._receive(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"launcher {self.pid}", timeout)
        return code

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_WARM = _WarmLauncher()


def warm_server_pid() -> Optional[int]:
    """The pid of the session's launch server while it runs, else None."""
    proc = _WARM._proc  # pylint: disable=protected-access
    return proc.pid if proc is not None and proc.poll() is None else None


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


def run_together(calls: Sequence[Callable[[], Any]]) -> List[Tuple[bool, Any]]:
    """Runs ``calls`` (launches) at the same time and returns ``(True, result)`` or ``(False, exception)`` of each,
    in order, once all have ended.

    A one-worker launch leaves one of two cores idle; started beside launches of more workers, it fills it.
    """
    def outcome(call):
        try:
            return True, call()
        except Exception as err:  # pylint: disable=broad-except  (each caller raises its own)
            return False, err

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(outcome, calls))


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


def start_workers(script: str, n: int, args: Sequence[str] = (), env: Optional[Dict[str, str]] = None,
                  server: bool = False):
    """Starts ``tests/workers/<script>`` on ``n`` workers and returns at once.

    The launcher's stdout and stderr come merged, as text, from the returned
    process's ``stdout``; its worker processes die with it. With ``server`` the
    launcher is forked from the session's warm launch server (no TensorFlow
    import of its own) and a :class:`ServedLauncher` is returned, else a
    ``subprocess.Popen`` of ``python -m collective.launch``.
    """
    cmd, full_env = _launch_command(script, n, args, env)
    if server and full_env.get("PYTHONPATH") == os.environ.get("PYTHONPATH"):
        return _WARM.start(cmd, full_env)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, bufsize=1, env=full_env)
