"""Progress reports from workers to ``python -m collective.launch``, which turns a stalled worker into an error.

The launcher gives each worker a file (``COLLECTIVE_HEARTBEAT_FILE``). The
worker writes one line to it, ``<phase> <steps finished> <unix time>``, when
a training step starts (``step``), when it ends (``idle``) and around work
that every worker takes part in or waits for (``save``, ``evaluate``,
``export``), which never counts as a stall. :class:`HeartbeatHook` writes the
step lines; ``collective.integration.session.MonitoredTrainingSession`` and
``strategy.estimator()`` add it. A program that trains without either sends
no heartbeat (a save or an export there leaves none behind), and the launcher
cannot tell a stall from slow work: Gloo's own timeout is then the limit.

Step lines cost no file write on the step's path: when the previous line
went out less than :data:`STEP_LINE_INTERVAL` seconds ago, the newest
``step``/``idle`` state is left to a background thread, which writes it
within that interval. Stall timeouts are minutes, so the launcher sees
the same progress; every other phase change is written at once.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Iterator, Optional

import tensorflow as tf

from collective.runtime.stall import ENV

STEP_LINE_INTERVAL = 0.5
"""Seconds: ``step``/``idle`` lines closer together than this are written by the background thread."""
_STEP_PHASES = ("step", "idle")
_state: dict = {"steps": 0, "phase": None}  # phase None: no report yet
_written = {"line": None, "phase": None, "at": float("-inf")}  # the last line in the file and when it went out
_lock = threading.Lock()
_flusher: dict = {"thread": None}


def _path() -> Optional[str]:
    return os.environ.get(ENV) or None


def beat(phase: str, steps: Optional[int] = None) -> None:
    """Reports ``phase`` after ``steps`` finished steps (default: the count so far) to the launcher, if any."""
    path = _path()
    with _lock:
        if steps is not None:
            _state["steps"] = steps
        _state["phase"] = phase
        if path is None:
            return
        if phase in _STEP_PHASES and _written["phase"] in _STEP_PHASES and \
                time.monotonic() - _written["at"] < STEP_LINE_INTERVAL:
            _start_flusher()
            return
        _write(path)


def _write(path: str) -> None:
    """Writes the current state (the caller holds ``_lock``)."""
    line = f"{_state['phase']} {_state['steps']}"
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{line} {time.time():.3f}\n")
    _written.update(line=line, phase=_state["phase"], at=time.monotonic())


def _start_flusher() -> None:
    if _flusher["thread"] is None or not _flusher["thread"].is_alive():
        _flusher["thread"] = threading.Thread(target=_flush_forever, name="collective-heartbeat", daemon=True)
        _flusher["thread"].start()


def _flush_forever() -> None:
    """Writes the newest state whenever it differs from the file's, every :data:`STEP_LINE_INTERVAL` seconds."""
    while True:
        time.sleep(STEP_LINE_INTERVAL)
        with _lock:
            path = _path()
            if path is not None and _state["phase"] is not None and \
                    f"{_state['phase']} {_state['steps']}" != _written["line"]:
                _write(path)


def _clear() -> None:
    """Takes the report back: the launcher sees no heartbeat from this worker, as before the first one."""
    with _lock:
        _state["phase"] = None
        _written.update(line=None, phase=None, at=float("-inf"))
        path = _path()
        if path is not None:
            with open(path, "w", encoding="utf-8"):
                pass


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Reports ``name`` (e.g. ``save``) for the duration of the block, then the phase before it (if any)."""
    before = _state["phase"]
    beat(name)
    try:
        yield
    finally:
        if before is None:
            _clear()
        else:
            beat(before)


class HeartbeatHook(tf.compat.v1.train.SessionRunHook):
    """Reports each training step's start and end (and ``idle`` from session creation on)."""

    def begin(self):
        if _state["phase"] is None:
            beat("idle")

    def before_run(self, run_context):
        beat("step")

    def after_run(self, run_context, run_values):
        beat("idle", _state["steps"] + 1)
