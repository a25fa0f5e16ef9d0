"""Stall detection for ``python -m collective.launch``: reads the workers' heartbeats (TensorFlow-free).

Each worker writes ``<phase> <steps finished> <unix time>`` to its own file
(``collective.heartbeat``). When no worker's phase or step count has changed
for ``COLLECTIVE_STALL_TIMEOUT`` seconds, and none is in work that every
worker takes part in or waits for (a checkpoint save, an evaluation), the
job is stalled: :meth:`StallWatch.check` says which rank holds the others up,
its last finished step, and what the others wait in.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Dict, List, Optional, Sequence

ENV = "COLLECTIVE_HEARTBEAT_FILE"
TIMEOUT_ENV = "COLLECTIVE_STALL_TIMEOUT"
DEFAULT_TIMEOUT = 300.0
EXEMPT_PHASES = ("save", "evaluate")
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
    """Watches ``files[rank]``; :meth:`check` returns the stall message once the job has stalled."""

    def __init__(self, files: Sequence[str], pids: Sequence[int], timeout: float):
        self.files, self.pids, self.timeout = list(files), list(pids), timeout
        self._last: Optional[tuple] = None
        self._since = time.monotonic()

    def check(self, now: Optional[float] = None) -> Optional[str]:
        now = time.monotonic() if now is None else now
        beats = [read_beat(f) for f in self.files]
        if all(b is None for b in beats):
            return None  # no heartbeats (a program without the hooks): nothing to judge by
        snapshot = tuple(beats)
        if snapshot != self._last or any(b is not None and b.phase in EXEMPT_PHASES for b in beats):
            self._last, self._since = snapshot, now
            return None
        if now - self._since < self.timeout:
            return None
        return self._describe(beats, now - self._since)

    def _describe(self, beats: List[Optional[Beat]], idle: float) -> str:
        steps = {r: (b.steps if b else -1) for r, b in enumerate(beats)}
        behind = [r for r, s in steps.items() if s == min(steps.values())]
        if len(behind) == len(beats):  # all finished as many steps: the ones not inside the next step hold it up
            outside = [r for r, b in enumerate(beats) if b is not None and b.phase != "step"]
            stopped = [r for r in behind if process_state(self.pids[r]) in _PROCESS_STATES]
            behind = stopped or (outside if 0 < len(outside) < len(beats) else behind)
        lines = [f"the job stalled: no worker made progress for {idle:.0f} s ({TIMEOUT_ENV}={self.timeout:g})"]
        for r in behind:
            lines.append(f"rank {r} holds it up: {self._where(r, beats[r])}")
        waiting: Dict[str, List[int]] = {}
        for r, b in enumerate(beats):
            if r not in behind:
                waiting.setdefault(self._where(r, b), []).append(r)
        for where, ranks in waiting.items():
            lines.append(f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} wait: {where}")
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


def timeout_from_env(environ: Optional[Dict[str, str]] = None) -> float:
    """``COLLECTIVE_STALL_TIMEOUT`` in seconds (default 300; 0 turns detection off)."""
    value = (environ if environ is not None else os.environ).get(TIMEOUT_ENV, str(DEFAULT_TIMEOUT))
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV}={value!r} is not a number of seconds") from None
    if seconds < 0:
        raise ValueError(f"{TIMEOUT_ENV}={value!r} must be >= 0 (0 turns stall detection off)")
    return seconds
