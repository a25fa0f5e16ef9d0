"""collective.runtime.stall's detector on heartbeat files written here (a fake clock), and the launcher's Job around it.

No TensorFlow: the Job tests run tiny Python processes that write heartbeat lines as workers do.
"""

import logging
import os
import sys

import pytest

from collective.runtime import launcher as launch
from collective.runtime import stall


def _watch(tmp_path, beats, **kwargs):
    """A StallWatch over one file per rank, holding ``beats[rank]`` (None: no heartbeat yet)."""
    files = [str(tmp_path / f"rank{r}") for r in range(len(beats))]
    _write(files, beats)
    return stall.StallWatch(files, [os.getpid()] * len(files), **kwargs), files


def _write(files, beats):
    for path, line in zip(files, beats):
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"{line} 0.0\n" if line else "")


def test_a_slow_first_step_has_its_own_limit(tmp_path):
    """Regression: graph building and the first run of a big model took longer than the stall timeout: a stall."""
    watch, files = _watch(tmp_path, ["step 0", None], timeout=10)  # rank 1 still builds its graph
    assert watch.check(now=0) is None
    assert watch.check(now=60) is None  # COLLECTIVE_FIRST_STEP_TIMEOUT (default 1800 s) applies, not 10 s
    message = watch.check(now=1801)
    assert message and "COLLECTIVE_FIRST_STEP_TIMEOUT=1800" in message
    _write(files, ["idle 1", "idle 1"])
    assert watch.check(now=2000) is None
    assert "COLLECTIVE_STALL_TIMEOUT=10" in watch.check(now=2011)  # after the first step: the stall timeout

    (tmp_path / "off").mkdir()
    off, _ = _watch(tmp_path / "off", ["step 0", "step 0"], timeout=10, first_step_timeout=0)
    assert off.check(now=0) is None and off.check(now=10 ** 6) is None


def test_first_step_timeout_from_the_environment():
    name = stall.FIRST_STEP_TIMEOUT_ENV
    assert stall.timeout_from_env({}, name) == 1800
    assert stall.timeout_from_env({name: "0"}, name) == 0
    with pytest.raises(ValueError, match="COLLECTIVE_FIRST_STEP_TIMEOUT='-1' must be >= 0"):
        stall.timeout_from_env({name: "-1"}, name)


def test_an_exited_rank_is_never_named_and_the_running_ones_are_judged_alone(tmp_path):
    watch, _ = _watch(tmp_path, ["idle 5", "idle 5", "step 5"], timeout=10)
    assert watch.check(now=0, exited={0, 1}) is None
    message = watch.check(now=11, exited={0, 1})
    assert "rank 2 holds it up: inside step 6" in message and "2 other workers finished" in message
    assert "rank 0" not in message and "rank 1" not in message and "ranks" not in message
    # Rank 1 exited in the middle of an export phase it never closed: only the running ranks' phases count.
    watch, _ = _watch(tmp_path, ["idle 5", "export 5"], timeout=10)
    assert watch.check(now=0, exited={1}) is None
    assert "rank 0 holds it up" in watch.check(now=11, exited={1})


_WORKER = """
import os, sys, time
rank = int(os.environ["RANK"])
with open(os.environ["COLLECTIVE_HEARTBEAT_FILE"], "w") as f:
    f.write(sys.argv[1 + rank] + " 3 0.0\\n")
time.sleep(float(sys.argv[3]) if rank == 0 else 0)
"""


def _job(tmp_path, phase0: str, phase1: str, seconds: float, timeout: float, caplog) -> int:
    """Rank 1 reports ``phase1`` and exits 0 at once; rank 0 reports ``phase0`` and works ``seconds``."""
    files = [str(tmp_path / f"rank{r}") for r in range(2)]
    envs = [dict(os.environ, RANK=str(r), COLLECTIVE_HEARTBEAT_FILE=files[r]) for r in range(2)]
    job = launch.Job([sys.executable, "-c", _WORKER, phase0, phase1, str(seconds)], envs)
    with caplog.at_level(logging.ERROR, logger="collective.launch"):
        return job.wait(stall.StallWatch(files, [p.pid for p in job.procs], timeout))


def test_an_export_on_rank_0_after_the_others_exited_is_no_stall(tmp_path, caplog):
    """Regression: an export longer than the stall timeout ended the job with 124."""
    assert _job(tmp_path, "export", "idle", 2.5, 1, caplog) == 0, caplog.text


def test_the_launcher_never_blames_a_worker_that_exited(tmp_path, caplog):
    """Regression: rank 0 worked on without heartbeats; the stall message blamed rank 1, which had exited 0."""
    assert _job(tmp_path, "idle", "idle", 60, 1, caplog) == stall.EXIT_CODE
    assert "rank 0 holds it up: idle after step 3" in caplog.text, caplog.text
    assert "rank 1" not in caplog.text and "1 other worker finished (exit code 0)" in caplog.text
