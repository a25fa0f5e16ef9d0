"""Where the suite's time goes: wall and CPU-seconds per test file, workers included.

Under ``make test`` (tests/timed.py) the suite runs in a cgroup of its own and CPU is the cgroup's: every
process the tests start, orphans included. Elsewhere it is what the test process and every process it waited
for used (``RUSAGE_SELF`` + ``RUSAGE_CHILDREN``), plus the warm launch server's own and reaped children's time
while it runs: a lower bound, since workers that end up reparented are missed. Tests run one at a time, so
each test's difference is its own. The table is printed at the end of the run and kept in
``.pytest_cache/collective-times.json``.
"""

from __future__ import annotations

import json
import os
import pathlib
import resource
import time
from collections import defaultdict
from typing import Callable, Dict, Optional

import pytest

import cgroup_clock

_TICKS = os.sysconf("SC_CLK_TCK")


def process_tree_seconds(pid: int) -> float:
    """CPU-seconds of process ``pid`` and of the children it has reaped (utime + stime + cutime + cstime)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / _TICKS


def own_seconds() -> float:
    """CPU-seconds of this process and of every child it has waited for."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


class SuiteClock:
    """Adds each test's wall and CPU time to its file."""

    def __init__(self, server_pid: Callable[[], Optional[int]]):
        self._server_pid = server_pid
        self._server_seen: Dict[int, float] = {}
        self.wall: Dict[str, float] = defaultdict(float)
        self.cpu: Dict[str, float] = defaultdict(float)
        self.tests: Dict[str, int] = defaultdict(int)

    def _cpu(self) -> float:
        folder = os.environ.get(cgroup_clock.ENV)
        counted = cgroup_clock.seconds(folder) if folder else None
        if counted is not None:
            return counted
        total = own_seconds()
        pid = self._server_pid()
        if pid is not None:
            self._server_seen[pid] = process_tree_seconds(pid)
        # A server that has exited is counted in RUSAGE_CHILDREN from then on, not here.
        return total + sum(s for p, s in self._server_seen.items() if os.path.exists(f"/proc/{p}"))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):  # pylint: disable=unused-argument
        start_wall, start_cpu = time.monotonic(), self._cpu()
        yield
        name = item.nodeid.split("::", 1)[0]
        self.wall[name] += time.monotonic() - start_wall
        self.cpu[name] += self._cpu() - start_cpu
        self.tests[name] += 1

    def pytest_terminal_summary(self, terminalreporter, config):  # pylint: disable=unused-argument
        if not self.tests:
            return
        rows = sorted(self.cpu, key=self.cpu.get, reverse=True)
        path = pathlib.Path(config.rootpath, ".pytest_cache", "collective-times.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({f: {"tests": self.tests[f], "wall_s": round(self.wall[f], 1),
                                        "cpu_s": round(self.cpu[f], 1)} for f in rows}, indent=1))
        write = terminalreporter.write_line
        how = "every process, from the run's cgroup" if os.environ.get(cgroup_clock.ENV) else \
            "the processes waited for: a lower bound"
        terminalreporter.section(f"time per file (CPU-seconds of {how})")
        shown = rows if len(rows) <= 25 else rows[:20]
        for name in shown:
            write(f"{self.cpu[name]:8.1f} CPU-s {self.wall[name]:8.1f} s wall {self.tests[name]:5d} tests  {name}")
        if len(shown) < len(rows):
            rest = rows[len(shown):]
            write(f"{sum(self.cpu[f] for f in rest):8.1f} CPU-s {sum(self.wall[f] for f in rest):8.1f} s wall "
                  f"{sum(self.tests[f] for f in rest):5d} tests  the other {len(rest)} files")
        write(f"{sum(self.cpu.values()):8.1f} CPU-s {sum(self.wall.values()):8.1f} s wall "
              f"{sum(self.tests.values()):5d} tests  in all (table: {path.relative_to(config.rootpath)})")
