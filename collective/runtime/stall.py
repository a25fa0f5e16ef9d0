"""Stall detection for ``python -m collective.launch``: reads the workers' heartbeats (TensorFlow-free).

Each worker writes ``<phase> <steps finished> <unix time>`` to its own file
(``collective.runtime.heartbeat``). When no worker's phase or step count has changed
for ``COLLECTIVE_STALL_TIMEOUT`` seconds, and none is in work that every
worker takes part in or waits for (a checkpoint save, an evaluation, an
export), the job is stalled: :meth:`StallWatch.check` says which rank holds
the others up, its last finished step, and what the others wait in. While a
worker has finished no step yet (graph building, session creation and the
first run of a big model), ``COLLECTIVE_FIRST_STEP_TIMEOUT`` is the limit
instead. Workers that have exited (with code 0: any other code ends the job)
are never blamed; the ones still running are judged alone.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Collection, Dict, List, Optional, Sequence

ENV = "COLLECTIVE_HEARTBEAT_FILE"
TIMEOUT_ENV = "COLLECTIVE_STALL_TIMEOUT"
DEFAULT_TIMEOUT = 300.0
FIRST_STEP_TIMEOUT_ENV = "COLLECTIVE_FIRST_STEP_TIMEOUT"
DEFAULT_FIRST_STEP_TIMEOUT = 1800.0
EXEMPT_PHASES = ("save", "evaluate", "export")
EXIT_CODE = 124
_PROCESS_STATES = {"T": "its process is stopped (SIGSTOP or a debugger)", "t": "its process is being traced",
                   "D": "its process waits in uninterruptible I/O (a stuck filesystem?)",
                   "Z": "its process has exited"}


@dataclasses.dataclass(frozen=True)
class Beat:
    """A worker's last report: its phase (``step``, ``idle``, ``save``, ...) and the steps it finished."""

    phase: str
    steps: int


def read_beat(path: str) -> Optional[Beat]:
    """The report in ``path``; None before the first one (or while it is being written)."""
    try:
        with open(path, encoding="utf-8") as f:
            phase, steps, _ = f.read().split()
        return Beat(phase, int(steps))
    except (OSError, ValueError):
        return None


def process_state(pid: int) -> str:
    """Linux's one-letter state of ``pid`` (``R``, ``S``, ``T``, ``D``, ...), '' where unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


class StallWatch:
    """Watches ``files[rank]``; :meth:`check` returns the stall message once the job has stalled.

    ``timeout`` is the limit in seconds once every running worker has
    finished a step; ``first_step_timeout`` the limit while one has not
    (0: no limit then).
    """

    def __init__(self, files: Sequence[str], pids: Sequence[int], timeout: float,
                 first_step_timeout: float = DEFAULT_FIRST_STEP_TIMEOUT):
        self.files, self.pids, self.timeout = list(files), list(pids), timeout
        self.first_step_timeout = first_step_timeout
        self._last: Optional[tuple] = None
        self._since = time.monotonic()

    def check(self, now: Optional[float] = None, exited: Collection[int] = ()) -> Optional[str]:
        """The stall message, or None; ``exited``: the ranks whose process has exited (with code 0)."""
        now = time.monotonic() if now is None else now
        beats = [read_beat(f) for f in self.files]
        running = [r for r in range(len(beats)) if r not in exited]
        if all(beats[r] is None for r in running):
            return None  # no heartbeats (a program without the hooks, or all done): nothing to judge by
        snapshot = (tuple(beats), frozenset(exited))
        if snapshot != self._last or any(beats[r] is not None and beats[r].phase in EXEMPT_PHASES for r in running):
            self._last, self._since = snapshot, now
            return None
        first_step = any(beats[r] is None or beats[r].steps == 0 for r in running)
        limit, name = ((self.first_step_timeout, FIRST_STEP_TIMEOUT_ENV) if first_step
                       else (self.timeout, TIMEOUT_ENV))
        if limit <= 0 or now - self._since < limit:
            return None
        return self._describe(beats, running, now - self._since, f"{name}={limit:g}")

    def _describe(self, beats: List[Optional[Beat]], running: List[int], idle: float, limit: str) -> str:
        steps = {r: (beats[r].steps if beats[r] else -1) for r in running}
        behind = [r for r, s in steps.items() if s == min(steps.values())]
        if len(behind) == len(running):  # all finished as many steps: the ones not inside the next step hold it up
            outside = [r for r in running if beats[r] is not None and beats[r].phase != "step"]
            stopped = [r for r in behind if process_state(self.pids[r]) in _PROCESS_STATES]
            behind = stopped or (outside if 0 < len(outside) < len(running) else behind)
        lines = [f"the job stalled: no worker made progress for {idle:.0f} s ({limit})"]
        for r in behind:
            lines.append(f"rank {r} holds it up: {self._where(r, beats[r])}")
        waiting: Dict[str, List[int]] = {}
        for r in running:
            if r not in behind:
                waiting.setdefault(self._where(r, beats[r]), []).append(r)
        for where, ranks in waiting.items():
            lines.append(f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} wait: {where}")
        done = len(beats) - len(running)
        if done:
            lines.append(f"{done} other worker{'s' if done > 1 else ''} finished (exit code 0)")
        return "\n".join(lines)

    def _where(self, rank: int, beat: Optional[Beat]) -> str:
        if beat is None:
            text = "no heartbeat yet (still starting, or training without MonitoredTrainingSession/Estimator)"
        elif beat.phase == "step":
            text = f"inside step {beat.steps + 1} (last finished step {beat.steps})"
        else:
            text = f"{beat.phase} after step {beat.steps} (last finished step {beat.steps})"
        state = _PROCESS_STATES.get(process_state(self.pids[rank]))
        return f"{text}; {state}" if state else text


def timeout_from_env(environ: Optional[Dict[str, str]] = None, name: str = TIMEOUT_ENV) -> float:
    """``COLLECTIVE_STALL_TIMEOUT`` in seconds (default 300; 0 turns detection off).

    With ``name=FIRST_STEP_TIMEOUT_ENV``: ``COLLECTIVE_FIRST_STEP_TIMEOUT`` (default 1800; 0: no limit
    before a worker's first finished step).
    """
    default = DEFAULT_FIRST_STEP_TIMEOUT if name == FIRST_STEP_TIMEOUT_ENV else DEFAULT_TIMEOUT
    value = (environ if environ is not None else os.environ).get(name, str(default))
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number of seconds") from None
    if seconds < 0:
        off = "stall detection" if name == TIMEOUT_ENV else "the limit before the first step"
        raise ValueError(f"{name}={value!r} must be >= 0 (0 turns {off} off)")
    return seconds
