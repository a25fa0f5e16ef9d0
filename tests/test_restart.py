"""Kill -9 one worker mid-training, restart the job, and end with the weights of an uninterrupted run.

Two APIs train restart_cases' model (sharded tables ``t1``, ``t2`` with Adam
slots, a dense layer, and a hash-table vocabulary ``item`` with Adagrad
slots) with a checkpoint every step:

- ``strategy.estimator()`` (sok exchange) on 2 workers: worker 1 holds right
  after it writes its part of the step-2 checkpoint, while worker 0 has
  written its part and waits in the save's barrier. The test kills worker 1
  with SIGKILL there, which leaves a checkpoint written but never merged,
  and reruns the job on 3 workers.
- HybridBackend's ``hb.train.MonitoredTrainingSession`` (hb exchange) on 2
  workers: worker 0, which merges the checkpoints, holds after step 2 while
  worker 1 waits inside step 3. The test kills worker 0 and reruns on 2.

The killed launcher must exit non-zero with no worker left running, and the
latest checkpoint must be the last complete one. The rerun must start from
it and end with the checkpoint of an uninterrupted run: tables, dense
variables and their Adam slots against plain single-process TensorFlow on
the same global batches (``checkpoint_cases.reference``), and the hash table
with its Adagrad slots, key by key, against one worker (this process)
trained without a break.
"""

import dataclasses
import os
import pathlib
import shutil
import signal
import threading
import time
from typing import Callable, Dict, List

import pytest
import tensorflow as tf

from collective import CollectiveStrategy
from collective.checkpoint import Saver

from launcher import LAUNCH_SERVER, run_workers, start_workers, warm_server_pid
from workers import checkpoint_cases as cc
from workers import restart_cases as rc

pytestmark = pytest.mark.timeout(900)
LAST_STEP, HOLD_STEP = 5, 2
# Seconds for a launch to reach the held step, and for the workers left to go once the launcher has exited.
START_TIMEOUT, EXIT_GRACE = 300, 10


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One API's run: ``killed_n`` workers until ``victim`` is killed at ``held_line``, then ``resumed_n``."""

    script: str
    killed_n: int
    victim: int
    held_line: str
    resumed_n: int
    latest: int  # the step of the last complete checkpoint once the victim is killed
    mid_save: bool  # killed after writing its part of the next checkpoint


SCENARIOS = {
    "estimator": Scenario("restart_estimator.py", killed_n=2, victim=1, resumed_n=3, latest=HOLD_STEP - 1,
                          held_line=f"[1] rank 1 holding after writing its part of step {HOLD_STEP}", mid_save=True),
    "mts": Scenario("restart_mts.py", killed_n=2, victim=0, resumed_n=2, latest=HOLD_STEP,
                    held_line=f"[0] rank 0 holding after step {HOLD_STEP}", mid_save=False),
}


@dataclasses.dataclass
class Restart:
    """What the killed run left and what the rerun printed."""

    scenario: Scenario
    model_dir: pathlib.Path
    killed_code: int
    killed_output: str
    left_running: List[int]
    latest_after_kill: str
    files_after_kill: List[str]
    kept: str  # a copy of the latest checkpoint after the kill (the rerun may delete it from model_dir)
    resumed_output: str


class Output:
    """Reads a process's output lines in a thread, so the test can wait for one of them."""

    def __init__(self, stream):
        self.lines: List[str] = []
        self.closed = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self.closed = True
            self._changed.notify_all()

    def wait_for(self, line: str, timeout: float) -> None:
        """Returns once ``line`` has been printed; fails if the process ends first or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while line not in self.lines:
                remaining = deadline - time.monotonic()
                if self.closed or remaining <= 0:
                    raise AssertionError(f"no line {line!r} ({'the job ended' if self.closed else 'timeout'}):\n"
                                         + self.text()[-8000:])
                self._changed.wait(remaining)

    def text(self) -> str:
        return "\n".join(self.lines)

    def join(self) -> None:
        self._thread.join(timeout=10)


def read_pid(pid_dir: pathlib.Path, rank: int) -> int:
    return int((pid_dir / f"rank{rank}.pid").read_text())


def running(pid: int, script: str) -> bool:
    """Whether ``pid`` is a live (not zombie) process running ``script``, from /proc: a worker of a launcher
    started for it, or one forked by the warm launch server, whose command line it keeps."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return False
    ours = script in cmdline or (str(LAUNCH_SERVER) in cmdline and pid != warm_server_pid())
    return stat.rsplit(")", 1)[1].split()[0] != "Z" and ours


def still_running(pids: List[int], script: str) -> List[int]:
    """The workers among ``pids`` still running ``EXIT_GRACE`` seconds from now (none: returns at once)."""
    deadline = time.monotonic() + EXIT_GRACE
    while True:
        alive = [pid for pid in pids if running(pid, script)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def kill_mid_training(scenario: Scenario, model_dir: pathlib.Path, pid_dir: pathlib.Path):
    """Starts the killed run, SIGKILLs its victim once it holds; returns (launcher's code, output, worker pids)."""
    victim = scenario.victim
    proc = start_workers(scenario.script, scenario.killed_n,
                         [model_dir, pid_dir, LAST_STEP, f"{victim}:{HOLD_STEP}"], server=True)
    output = Output(proc.stdout)
    try:
        output.wait_for(scenario.held_line, START_TIMEOUT)
        os.kill(read_pid(pid_dir, victim), signal.SIGKILL)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()  # its workers die with it
            proc.wait()
    output.join()
    return code, output.text(), [read_pid(pid_dir, r) for r in range(scenario.killed_n)]


def keep_checkpoint(prefix: str, directory: pathlib.Path) -> str:
    """Copies the checkpoint files of ``prefix`` into ``directory``; returns the copy's prefix."""
    directory.mkdir()
    for path in pathlib.Path(prefix).parent.glob(pathlib.Path(prefix).name + ".*"):
        shutil.copy(path, directory / path.name)
    return str(directory / pathlib.Path(prefix).name)


@pytest.fixture(scope="module", params=sorted(SCENARIOS))
def restart(request, tmp_path_factory) -> Restart:
    """The killed run and the rerun of one scenario."""
    scenario = SCENARIOS[request.param]
    base = tmp_path_factory.mktemp(request.param)
    model_dir = base / "model"
    code, killed_output, pids = kill_mid_training(scenario, model_dir, base / "pids")
    left = still_running(pids, scenario.script)
    latest = tf.train.latest_checkpoint(str(model_dir))
    files = sorted(str(p.relative_to(model_dir)) for p in model_dir.rglob("*"))
    kept = keep_checkpoint(latest, base / "after_kill") if latest else ""
    resumed = run_workers(scenario.script, scenario.resumed_n, [model_dir, base / "pids_resumed", LAST_STEP],
                          timeout=400)
    return Restart(scenario, model_dir, code, killed_output, left, latest, files, kept, resumed.stdout)


@pytest.fixture(scope="module")
def uninterrupted() -> Callable[[int], Dict]:
    """checkpoint_cases.reference(steps), computed once per number of steps."""
    cache: Dict[int, Dict] = {}

    def at(steps: int) -> Dict:
        if steps not in cache:
            cache[steps] = cc.reference(steps)
        return cache[steps]

    return at


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory) -> pathlib.Path:
    """This process trains the model as one worker, without a break, and checkpoints every step."""
    model_dir = tmp_path_factory.mktemp("one_worker")
    strategy = CollectiveStrategy("hb")
    with strategy.scope(), tf.Graph().as_default():
        inputs = rc.placeholders()
        _, train_op = rc.build(inputs, strategy)
        saver = Saver(max_to_keep=None)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(LAST_STEP):
                sess.run(train_op, {inputs[key]: value for key, value in rc.local_inputs(step, 0, 1).items()})
                saver.save(sess, str(model_dir / "model.ckpt"), global_step=step + 1)
    return model_dir


def test_killed_job_exits_nonzero_and_leaves_no_worker_running(restart):
    assert restart.killed_code == 137, restart.killed_output[-4000:]
    victim = restart.scenario.victim
    assert f"worker {victim} was killed by SIGKILL (exit code 137)" in restart.killed_output
    assert "out-of-memory killer" in restart.killed_output  # the usual sender of a SIGKILL nobody in the job sent
    assert restart.left_running == [], f"workers still running after the launcher exited: {restart.left_running}"


def test_latest_checkpoint_after_the_kill_is_the_last_complete_one(restart, uninterrupted, one_worker):
    latest, files = restart.scenario.latest, restart.files_after_kill
    assert restart.latest_after_kill == str(restart.model_dir / f"model.ckpt-{latest}"), files
    assert f"model.ckpt-{latest + 1}.index" not in files
    if restart.scenario.mid_save:
        # Every worker's part of the next checkpoint is on disk, but it was never merged.
        parts = f"model.ckpt-{latest + 1}_temp"
        assert {f"{parts}/part-00000-of-00002.index", f"{parts}/part-00001-of-00002.index"} <= set(files), files
    cc.assert_checkpoint_equals(restart.kept, uninterrupted(latest), "latest after the kill")
    cc.assert_hash_checkpoints_equal(restart.kept, str(one_worker / f"model.ckpt-{latest}"))


def test_rerun_starts_from_that_checkpoint(restart):
    for r in range(restart.scenario.resumed_n):
        assert f"[{r}] rank {r} started at step {restart.scenario.latest}" in restart.resumed_output, \
            restart.resumed_output[-4000:]


def test_rerun_ends_with_the_weights_of_an_uninterrupted_run(restart, uninterrupted, one_worker):
    final = str(restart.model_dir / f"model.ckpt-{LAST_STEP}")
    assert tf.train.latest_checkpoint(str(restart.model_dir)) == final
    what = f"killed on {restart.scenario.killed_n} workers, resumed on {restart.scenario.resumed_n}"
    cc.assert_checkpoint_equals(final, uninterrupted(LAST_STEP), what)
    cc.assert_hash_checkpoints_equal(final, str(one_worker / f"model.ckpt-{LAST_STEP}"))


def test_rerun_leaves_no_parts_of_the_killed_save(restart):
    """Regression: the parts a killed save wrote on 2 workers stayed in model.ckpt-2_temp after the 3-worker
    rerun saved step 2 (its own parts have other names), a whole copy of the model that nothing removed."""
    assert sorted(str(p.relative_to(restart.model_dir)) for p in restart.model_dir.rglob("*_temp*")) == []


@pytest.mark.parametrize("script", ["restart_mts.py", "restart_estimator.py"])
def test_sigterm_saves_the_step_reached_on_every_worker_and_exits_143(tmp_path, uninterrupted, one_worker, script):
    """Preemption: SIGTERM to the launcher; the workers finish their step, save it together and exit.

    The job checkpoints at its start only: without the preemption save the latest checkpoint is step 0.
    """
    model_dir, pid_dir = tmp_path / "model", tmp_path / "pids"
    pid_dir.mkdir()
    proc = start_workers(script, 2, [model_dir, pid_dir, LAST_STEP], env={"RESTART_PREEMPTIBLE": "1"}, server=True)
    output = Output(proc.stdout)
    output.wait_for("[1] rank 1 step 2", START_TIMEOUT)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=120)
    output.join()
    assert code == 143, output.text()[-4000:]
    step = rc.checkpoint_step(str(model_dir))
    assert 2 <= step < LAST_STEP, output.text()[-4000:]
    for r in range(2):
        assert f"[{r}] preempted: checkpoint {model_dir / f'model.ckpt-{step}'} saved" in output.text()
    assert not still_running([read_pid(pid_dir, r) for r in range(2)], script)
    cc.assert_checkpoint_equals(str(model_dir / f"model.ckpt-{step}"), uninterrupted(step), "preempted")
    cc.assert_hash_checkpoints_equal(str(model_dir / f"model.ckpt-{step}"), str(one_worker / f"model.ckpt-{step}"))
    # The same command again resumes there and ends as an uninterrupted run.
    rerun = run_workers(script, 2, [model_dir, pid_dir, LAST_STEP], timeout=START_TIMEOUT)
    if script == "restart_mts.py":
        assert f"[0] rank 0 started at step {step}" in rerun.stdout
    final = str(model_dir / f"model.ckpt-{LAST_STEP}")
    cc.assert_checkpoint_equals(final, uninterrupted(LAST_STEP), "resumed after preemption")
    cc.assert_hash_checkpoints_equal(final, str(one_worker / f"model.ckpt-{LAST_STEP}"))


def test_a_stopped_worker_stalls_the_job_and_the_launcher_names_it(tmp_path):
    """SIGSTOP one worker mid-training: the launcher ends the job, names that rank and leaves no process."""
    model_dir, pid_dir = tmp_path / "model", tmp_path / "pids"
    pid_dir.mkdir()
    timeout = 6
    proc = start_workers("restart_mts.py", 2, [model_dir, pid_dir, 1000],
                         env={"RESTART_PREEMPTIBLE": "1", "COLLECTIVE_STALL_TIMEOUT": str(timeout)}, server=True)
    output = Output(proc.stdout)
    output.wait_for("[1] rank 1 step 2", START_TIMEOUT)
    pids = [read_pid(pid_dir, r) for r in range(2)]
    os.kill(pids[1], signal.SIGSTOP)
    stopped_at = time.monotonic()
    code = proc.wait(timeout=timeout + 60)
    elapsed = time.monotonic() - stopped_at
    output.join()
    assert code == 124, output.text()[-4000:]
    assert elapsed < timeout + 10, f"the launcher took {elapsed:.0f} s"
    text = output.text()
    assert "the job stalled: no worker made progress" in text, text[-4000:]
    assert "rank 1 holds it up" in text and "its process is stopped" in text, text[-4000:]
    assert "rank 0 wait: inside step" in text, text[-4000:]
    assert not still_running(pids, "restart_mts.py")


def test_a_long_save_on_rank_0_is_not_a_stall(tmp_path, uninterrupted):
    """The others wait in the save's barrier longer than the stall timeout: the job goes on and ends well."""
    model_dir, pid_dir = tmp_path / "model", tmp_path / "pids"
    pid_dir.mkdir()
    proc = run_workers("restart_mts.py", 2, [model_dir, pid_dir, LAST_STEP],
                       env={"RESTART_SLOW_SAVE": "9:2", "COLLECTIVE_STALL_TIMEOUT": "3"}, timeout=START_TIMEOUT)
    assert "[0] rank 0 saving step 2 slowly" in proc.stdout
    cc.assert_checkpoint_equals(str(model_dir / f"model.ckpt-{LAST_STEP}"), uninterrupted(LAST_STEP), "after a long save")


def test_after_training_an_export_is_no_stall_and_sigterm_ends_the_worker(tmp_path):
    """Regressions: a slow first step, and rank 0's export after rank 1 exited, were reported as stalls (blaming
    the rank that had exited), and a SIGTERM after the session closed was taken for a preemption notice no step
    would act on: the worker ran on and exited 0, and a launcher stopping the job had to kill it."""
    seconds = 3.5  # each slow part stalls the job for longer than the stall timeout below
    proc = run_workers("after_training.py", 2, [tmp_path / "model", seconds], check=False, timeout=START_TIMEOUT,
                       env={"COLLECTIVE_STALL_TIMEOUT": "2"})
    output = proc.stdout + proc.stderr
    assert "the job stalled" not in output and "saving a checkpoint after this step" not in output, output[-4000:]
    assert "[0] rank 0 exported with heartbeat phase export" in proc.stdout, output[-4000:]
    assert list((tmp_path / "model" / "export").glob("*/saved_model.pb")), output[-4000:]
    assert proc.returncode == 143 and "worker 0 was killed by SIGTERM (exit code 143)" in proc.stderr, output[-4000:]
    assert "still running after SIGTERM" not in proc.stdout
