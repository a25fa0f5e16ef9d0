"""Workers forked from a launcher that imported their heavy modules once: ``python -m collective.launch --preload``.

A TensorFlow worker spends seconds of CPU importing TensorFlow, the same
work in every worker. With ``--preload tensorflow,horovod.tensorflow`` the
launcher imports those modules itself, before it starts any thread, and
forks each worker from that state instead of starting a new interpreter.
A forked worker then runs its script as ``python -u script args`` would:
the script is ``__main__`` with its own ``sys.argv`` and ``sys.path[0]``,
its environment is the one the launcher gives each worker, it leads its own
process group and dies with the launcher, ``sys.exit`` codes and tracebacks
are as Python gives them, and the ``atexit`` handlers run. It then leaves
with ``os._exit``: there is no interpreter teardown to pay for either.

What is not as in a new interpreter: the preloaded modules were imported
with the launcher's environment (the launcher sets the variables every
worker shares, such as the thread counts, before it imports them), and
they are not imported again. A module whose import reads a per-worker
variable, starts a thread or initializes a device must not be preloaded.
"""

from __future__ import annotations

import atexit
import importlib
import io
import logging
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import Callable, Dict, List, Optional, Sequence

logger = logging.getLogger("collective.launch")
# What every collective worker imports: the value of --preload for a job of ours (demo, benchmarks, tests).
WORKER_MODULES = "tensorflow,horovod.tensorflow,collective"


class PreloadError(RuntimeError):
    """A module named by ``--preload`` cannot be imported, or its import started a thread."""


def parse_modules(text: str) -> List[str]:
    """``"tensorflow, horovod.tensorflow"`` -> ``["tensorflow", "horovod.tensorflow"]``."""
    return [name.strip() for name in text.split(",") if name.strip()]


def preload(modules: Sequence[str]) -> None:
    """Imports ``modules`` in this process; refuses a module whose import leaves a Python thread running."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as err:  # pylint: disable=broad-except  (any import failure is the user's to see)
            raise PreloadError(f"--preload {name}: the import failed ({type(err).__name__}: {err}); "
                               "fix the module or leave it out of --preload") from err
        if threading.active_count() > 1:
            raise PreloadError(f"--preload {name}: importing it started a thread "
                               f"({', '.join(t.name for t in threading.enumerate()[1:])}); a forked worker would "
                               "lose it, so leave this module out of --preload")


class ForkedWorker:
    """One forked worker, with the part of ``subprocess.Popen`` the launcher uses.

    Its exit is collected by :func:`reap_in_order`, which also numbers the workers' exits in the order they came.
    """

    def __init__(self, pid: int, stdout, stderr):
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.exit_order: Optional[int] = None
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        """The exit code (``-signal`` when killed), as ``Popen.wait`` (``subprocess.TimeoutExpired`` after ``timeout``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
            time.sleep(0.02)
        return self.returncode


def reap_in_order(workers: Sequence[ForkedWorker]) -> threading.Thread:
    """Starts a thread that waits for ``workers`` (this process's only children) as each one ends, recording
    each exit code and its place in the order of exits; start it after the last fork."""
    by_pid = {worker.pid: worker for worker in workers}

    def reap() -> None:
        order = 0
        while any(worker.returncode is None for worker in by_pid.values()):
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:  # reaped elsewhere: their codes are lost, so say they failed
                for worker in by_pid.values():
                    if worker.returncode is None:
                        worker.exit_order, worker.returncode = order, 1
                return
            worker = by_pid.get(pid)
            if worker is not None:
                worker.exit_order, order = order, order + 1
                worker.returncode = os.waitstatus_to_exitcode(status)

    thread = threading.Thread(target=reap, name="reaper", daemon=True)
    thread.start()
    return thread


def fork_worker(command: Sequence[str], env: Dict[str, str], before_run: Callable[[], None],
                close_in_child: Sequence[int] = ()) -> ForkedWorker:
    """Forks a worker that runs ``command`` (``[python, -u, script, args...]`` or ``[python, -u, -m, module, ...]``).

    ``before_run`` runs in the worker first (the launcher's per-worker setup); ``close_in_child`` are file
    descriptors of the launcher the worker must not keep (the other workers' pipes).
    """
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid == 0:  # the worker: never returns into the launcher's code
        code = 1
        try:
            for fd in (out_read, err_read, *close_in_child):
                os.close(fd)
            os.setsid()
            before_run()
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(out_write, 1)
            os.dup2(err_write, 2)
            for fd in (devnull, out_write, err_write):
                os.close(fd)
            code = _run_as_new_interpreter(list(command[1:]), env)
        finally:
            os._exit(code)  # pylint: disable=protected-access
    os.close(out_write)
    os.close(err_write)
    return ForkedWorker(pid, os.fdopen(out_read, "r", buffering=1), os.fdopen(err_read, "r", buffering=1))


def _unbuffered_text(fd: int, mode: str):
    """``sys.stdout`` / ``sys.stderr`` / ``sys.stdin`` as ``python -u`` makes them."""
    raw = io.FileIO(fd, mode, closefd=False)
    if mode == "r":
        return io.TextIOWrapper(io.BufferedReader(raw))
    return io.TextIOWrapper(raw, write_through=True, line_buffering=False,
                            errors="backslashreplace" if fd == 2 else "strict")


def fresh_process_state(env: Dict[str, str]) -> None:
    """What a new interpreter would have that the launcher's fork does not."""
    os.environ.clear()
    os.environ.update(env)
    sys.stdin, sys.stdout, sys.stderr = _unbuffered_text(0, "r"), _unbuffered_text(1, "w"), _unbuffered_text(2, "w")
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as the interpreter sets it at start-up
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()  # forked workers would share the launcher's global numpy RNG state


def exit_code(err: SystemExit) -> int:
    code = err.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")  # as the interpreter reports a non-integer exit code
    return 1


def _run_as_new_interpreter(python_args: List[str], env: Dict[str, str]) -> int:
    """Runs ``python_args`` (after the interpreter: ``-u script ...`` or ``-u -m module ...``); the exit code."""
    args = [a for a in python_args if a != "-u"]
    fresh_process_state(env)
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(args[0])
            sys.argv = [args[0], *args[1:]]
            sys.path[0] = os.path.dirname(script)
            runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as err:
        code = exit_code(err)
    except BaseException:  # pylint: disable=broad-except  (reported as the interpreter reports it)
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()  # pylint: disable=protected-access
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # pylint: disable=broad-except
                pass
    return code
