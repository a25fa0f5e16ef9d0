"""Multi-host jobs on simulated hosts: ``python -m collective.launch --hosts ...`` through horovodrun over ssh.

``scripts/local_hosts.sh up 3`` makes hosts host0..host2 (network namespaces on one bridge, an sshd each,
docs/hosts.md); the module's finaliser takes them down whatever happens. A host that cannot be made fails
the tests with the reason: they are never skipped.

- One launch on host0:2,host1:1 (3 workers, 2 hosts) trains checkpoint_cases' model on hb, sok and
  replicated and checkpoints it: each checkpoint equals plain single-process TensorFlow's. hb's lookups
  there go through the hierarchical exchange (host0's 2 ranks merge their ids before they cross hosts). The same launch
  records where each worker ran (host name and address, global/local/cross rank, the GPU picked from a
  list of two per host) and, while it runs, every socket the launcher's processes listen on.
- A TF1-behaviour program (tests/workers/placement_chain.py: ref variables, a raw session) on the same 2 hosts
  goes through the hierarchical exchange too, and its checkpoint equals one process's.
- That 2-host checkpoint restores on 1 host (host0:2) and on 3 hosts (host0:1,host1:1,host2:1), and
  training continues as uninterrupted.
- A host lost mid-step (every process of host0's namespace killed, its sshd included, while it saves an
  incremental checkpoint) ends the job within the stall timeout and leaves no worker running on the other
  host; the log names the host and its ranks; the chain, begun on 2 hosts, continues on 2 others with 3
  workers from its last complete delta and ends as one uninterrupted process's run.
- The checkpoint write and the TF1 program need only the hosts: they run at the same time (a launch over ssh
  leaves a core idle in its start and rendezvous).
- In-process, without hosts: collective.runtime.hostworker stops its worker when its ssh session ends; the
  hierarchical exchange's relays (numpy) send each id across hosts once per host, as the byte model counts.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence, Set, Tuple

import numpy as np
import psutil
import pytest
import tensorflow as tf

from collective import CollectiveStrategy, byte_model
from collective.checkpoint import latest_incremental_checkpoint
from collective.runtime import hostmap
from collective.runtime.launcher import hosts_env as launch_env
from collective.sharding import planner

from launcher import WORKERS, run_together
from test_incremental_checkpoint import restore_and_save  # noqa: F401  (a fixture)  pylint: disable=unused-import
from test_restart import Output
from workers import checkpoint_cases as cc
from workers import incremental_cases as ic
from workers import placement_chain as chain

pytestmark = pytest.mark.timeout(1800)
ROOT = pathlib.Path(__file__).resolve().parent.parent
HOSTS_SCRIPT = ROOT / "scripts" / "local_hosts.sh"
BRIDGE_ADDRESS = "10.213.47.1"  # this machine on the simulated hosts' bridge (scripts/local_hosts.sh)
HOST_ADDRESSES = {"host0": "10.213.47.10", "host1": "10.213.47.11", "host2": "10.213.47.12"}
BACKENDS = ("hb", "sok", "replicated")
LAUNCH_TIMEOUT = 900
LOST_STALL_TIMEOUT = 90
HOLD_STEP, LAST_STEP = 3, 4  # the lost host dies inside the save of delta HOLD_STEP


def _hosts_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(HOSTS_SCRIPT), *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def hosts(request):
    """host0..host2, taken down at the end of the module even when a test fails."""
    request.addfinalizer(lambda: _hosts_script("down"))
    made = _hosts_script("up", "3")
    if made.returncode != 0:
        pytest.fail(f"the simulated hosts cannot be made: scripts/local_hosts.sh up 3 exited {made.returncode}\n"
                    f"{made.stdout}\n{made.stderr}", pytrace=False)
    return sorted(HOST_ADDRESSES)


def _launch_command(hosts: str, script: str, args: Sequence, stall_timeout: Optional[float] = None) -> List[str]:
    options = ["--stall-timeout", str(stall_timeout)] if stall_timeout is not None else []
    return [sys.executable, "-m", "collective.launch", "--hosts", hosts, *options, str(WORKERS / script),
            *map(str, args)]


def _env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env.update(extra or {})
    return env


def _listening(pid: int) -> Set[Tuple[str, str, int]]:
    """(process name, address, port) of every TCP socket that ``pid`` and its descendants listen on."""
    found = set()
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return found
    for proc in procs:
        try:
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.add((" ".join(proc.cmdline()[1:4]), conn.laddr.ip, conn.laddr.port))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def launch(hosts: str, script: str, args: Sequence, env: Optional[Dict[str, str]] = None,
           sockets: Optional[Set] = None) -> str:
    """Runs ``tests/workers/<script>`` on ``hosts`` through the launcher; returns its output, fails with it.

    With ``sockets`` the listening sockets of the launcher's processes are added to it while the job runs.
    """
    proc = subprocess.Popen(_launch_command(hosts, script, args), env=_env(env), cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = Output(proc.stdout)
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if sockets is not None:
                sockets |= _listening(proc.pid)
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
        code = proc.wait()
        output.join()
    assert code == 0, f"--hosts {hosts} {script} exited {code}:\n{output.text()[-12000:]}"
    return output.text()


@pytest.fixture(scope="module")
def reference():
    return {2: cc.reference(2), 3: cc.reference(3)}


def _write_checkpoints(base: pathlib.Path) -> dict:
    """Checkpoints written on 2 hosts (3 workers), where each worker ran, and what the launcher listened on."""
    probes = base / "probes"
    probes.mkdir()
    sockets: Set = set()
    env = {"HOST_PROBE_DIR": str(probes), "HOST_PROBE_GPUS": "0,1", "CHECKPOINT_CASES": ",".join(BACKENDS)}
    output = launch("host0:2,host1:1", "checkpoint_worker.py", [base, "write"], env=env, sockets=sockets)
    where = {r: json.loads((probes / f"rank{r}.json").read_text()) for r in range(3)}
    exchanges = {r: json.loads((probes / f"rank{r}.exchange.json").read_text()) for r in range(3)}
    return {"base": base, "where": where, "exchanges": exchanges, "sockets": sockets, "output": output}


def _tf1_program(base: pathlib.Path) -> pathlib.Path:
    """tests/workers/placement_chain.py's first stage under TF1 behaviour on 2 hosts (3 workers): its directory
    (the checkpoint ``model.ckpt``, the exchange probes)."""
    (base / "probes").mkdir()
    launch("host0:2,host1:1", "placement_chain.py", [0, "hb", "tf1", "-", base / "model.ckpt", "row_wise",
                                                     "row_wise"], env={"HOST_PROBE_DIR": str(base / "probes")})
    return base


@pytest.fixture(scope="module")
def first_launches(hosts, tmp_path_factory):
    """The two launches that need nothing but the hosts, at the same time (each one's ssh starts, rendezvous and
    single-threaded graph building leave a core to the other): ``(ok, value)`` of :func:`_write_checkpoints` and
    of :func:`_tf1_program`."""
    return dict(zip(("written", "tf1"), run_together([
        lambda: _write_checkpoints(tmp_path_factory.mktemp("hosts")),
        lambda: _tf1_program(tmp_path_factory.mktemp("tf1"))])))


def _value(outcome: Tuple[bool, object]):
    ok, value = outcome
    if not ok:
        raise value
    return value


@pytest.fixture(scope="module")
def written(first_launches):
    return _value(first_launches["written"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_hosts_train_as_one_process(written, reference, backend):
    cc.assert_checkpoint_equals(str(written["base"] / backend / "n3" / "model.ckpt-2"), reference[2],
                                f"{backend} on host0:2,host1:1")


def test_hb_crosses_the_two_hosts_hierarchically(written):
    """hb's parity above is the hierarchical exchange's: every worker routed through host0's 2 ranks and host1's 1."""
    assert all(e == {"hierarchical": [[0, 1], [2]]} for e in written["exchanges"].values()), written["exchanges"]


def test_each_worker_runs_on_its_host_with_its_local_rank_and_gpu(written):
    """Ranks fill host0's 2 slots, then host1's; each host says it has GPUs 0,1 and pins by local rank."""
    expected = {0: ("host0", 0, 2, 0, "0"), 1: ("host0", 1, 2, 0, "1"), 2: ("host1", 0, 1, 1, "0")}
    for rank, (host, local_rank, local_size, cross_rank, gpu) in expected.items():
        got = written["where"][rank]
        assert (got["hostname"], got["addresses"]) == (host, [HOST_ADDRESSES[host]]), got
        assert (got["rank"], got["size"], got["local_rank"], got["local_size"]) == (rank, 3, local_rank, local_size)
        assert got["cross_rank"] == cross_rank and got["env_local_rank"] == str(local_rank), got
        assert (got["gpu"], got["visible_device_list"], got["device"]) == (gpu, gpu, "/gpu:0"), got


def test_the_rendezvous_listens_on_the_bridge_address_only(written):
    sockets = written["sockets"]
    assert any("collective.runtime.multihost" in name for name, _, _ in sockets), sockets
    assert {address for _, address, _ in sockets} == {BRIDGE_ADDRESS}, sockets


def test_hb_with_tf1_behaviour_crosses_the_two_hosts_hierarchically_as_one_process(first_launches):
    """A TF1-behaviour program (ref variables, a raw session, collective's Saver) on host0:2,host1:1: hb routes
    through the hosts' relays and the checkpoint holds one process's tables and Adagrad slots."""
    base = _value(first_launches["tf1"])
    probes, prefix = base / "probes", str(base / "model.ckpt")
    assert all(json.loads((probes / f"rank{r}.exchange.json").read_text()) == {"hierarchical": [[0, 1], [2]]}
               for r in range(3))
    expected = chain.reference(1)[0]
    for key in chain.KEYS:
        np.testing.assert_allclose(tf.train.load_variable(prefix, key), expected[key], rtol=1e-5, atol=1e-6,
                                   err_msg=f"hb, TF1 behaviour, on host0:2,host1:1: {key}")


@pytest.fixture(scope="module")
def restored(written):
    """The 2-host checkpoint restored on 1 host (2 workers) and on 3 hosts (3 workers), one step trained."""
    base = written["base"]
    launch("host0:2", "checkpoint_worker.py", [base, "nowrite", 3], env={"CHECKPOINT_CASES": ",".join(BACKENDS)})
    # checkpoint_worker restores sok's and replicated's dense tables on 2 pairs of worker counts, not 3 to 3.
    launch("host0:1,host1:1,host2:1", "checkpoint_worker.py", [base, "nowrite", 3], env={"CHECKPOINT_CASES": "hb"})
    return base


@pytest.mark.parametrize("backend, n", [(b, 2) for b in BACKENDS] + [("hb", 3)])
def test_checkpoint_of_two_hosts_restores_on_one_and_on_three(restored, reference, backend, n):
    cc.assert_checkpoint_equals(str(restored / backend / f"from3to{n}" / "model.ckpt-3"), reference[3],
                                f"{backend}: written on 2 hosts, restored by {n} workers on {n - 1 or 1} host(s)")


def _kill_host(name: str) -> List[int]:
    """SIGKILLs every process of the simulated host's namespace (its sshd and the workers it started)."""
    listed = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, check=True)
    pids = [int(pid) for pid in listed.stdout.split()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def test_a_lost_host_ends_the_job_naming_it_and_its_chain_continues_on_other_hosts(hosts, tmp_path,
                                                                                   restore_and_save):
    """Rank 0 (host0) holds inside the save of delta 3 of a MonitoredTrainingSession chain while rank 1 (host1)
    waits for it; host0 dies. The rerun on host1:2,host2:1 resumes from delta 2 and ends as uninterrupted."""
    ic.train_chain(CollectiveStrategy("hb"), str(tmp_path / "ref"), full_every_step=True)
    model_dir = tmp_path / "m"
    cmd = _launch_command("host0:1,host1:1", "incremental_worker.py",
                          [tmp_path, "hb", tmp_path / "pids2", f"hold:{HOLD_STEP}", f"mts:m:{LAST_STEP}"],
                          stall_timeout=LOST_STALL_TIMEOUT)
    proc = subprocess.Popen(cmd, env=_env(), cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = Output(proc.stdout)
    try:
        deadline = time.monotonic() + LAUNCH_TIMEOUT
        while not any(f"rank 0 holding before the manifest of step {HOLD_STEP}" in line for line in output.lines):
            assert proc.poll() is None and time.monotonic() < deadline, output.text()[-8000:]
            time.sleep(0.5)
        killed_at = time.monotonic()
        assert _kill_host("host0")
        code = proc.wait(timeout=LOST_STALL_TIMEOUT + 60)
        took = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        output.join()
    text = output.text()
    assert code != 0 and took < LOST_STALL_TIMEOUT, (code, took, text[-8000:])
    assert "host host0 lost (ranks 0)" in text, text[-8000:]
    left = _workers_left("host1", "incremental_worker.py", grace=15)
    assert left == [], f"workers of the failed job still running on host1: {left}"
    assert latest_incremental_checkpoint(str(model_dir)) == str(model_dir / f"model.ckpt-{HOLD_STEP - 1}.delta")

    resumed = launch("host1:2,host2:1", "incremental_worker.py", [tmp_path, "sok", tmp_path / "pids3", "mts:m:6"])
    for r in range(3):
        assert f"rank {r} mts started at step {HOLD_STEP - 1}" in resumed, resumed[-4000:]
    for step in range(2, 7):
        written = json.loads((model_dir / f"model.ckpt-{step}.delta.manifest.json").read_text())
        assert written["world_size"] == (2 if step < HOLD_STEP else 3), (step, written["world_size"])
    latest = latest_incremental_checkpoint(str(model_dir))
    assert latest == str(model_dir / "model.ckpt-6.delta")
    ic.assert_same_model(restore_and_save(latest, tmp_path), str(tmp_path / "ref" / "model.ckpt-6"),
                         "a chain begun on 2 hosts, host0 lost, continued on host1:2,host2:1")


def _workers_left(host: str, script: str, grace: float) -> List[int]:
    """The processes of ``host`` running ``script`` ``grace`` seconds from now (none: returns at once)."""
    deadline = time.monotonic() + grace
    while True:
        left = []
        for pid in subprocess.run(["ip", "netns", "pids", host], capture_output=True, text=True).stdout.split():
            try:
                if script in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                    left.append(int(pid))
            except FileNotFoundError:
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def test_hostworker_ends_its_worker_when_its_ssh_session_ends(tmp_path):
    """In-process, no hosts: a shell stands for the sshd session and exits; the worker under the wrapper stops."""
    worker, pid_file = tmp_path / "worker.py", tmp_path / "worker.pid"
    worker.write_text("import os, sys, time\n"
                      "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
                      "time.sleep(120)\n")
    session = subprocess.Popen(["sh", "-c", f"'{sys.executable}' -m collective.runtime.hostworker "
                                f"'{sys.executable}' '{worker}' '{pid_file}' & sleep 3"], cwd=ROOT)
    assert session.wait(timeout=60) == 0
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the worker never started"
        time.sleep(0.1)
    pid = int(pid_file.read_text())
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"worker {pid} still runs after its session ended"
        time.sleep(0.2)


def _routed_crossings(hosts: hostmap.HostMap, ids_by_rank, owner) -> int:
    """Ids that cross hosts when each rank's ids go to the relay ``hosts.relays`` names on its own host, each relay
    merges what it got, and sends each id to its owner (numpy, the route of exchanges/hierarchical.py)."""
    crossing = 0
    for h, ranks in enumerate(hosts.hosts):
        at_relay = {local: set() for local in range(len(ranks))}
        for r in ranks:
            relays = hosts.relays(r)
            for i in np.unique(ids_by_rank[r]):
                at_relay[relays[owner(i)]].add(int(i))
        for local, merged in at_relay.items():
            for i in merged:
                assert hosts.relays(ranks[local])[owner(i)] == local
                crossing += hosts.host_of(owner(i)) != h
    return crossing


@pytest.mark.parametrize("given", ["host0:2,host1:1", "host0:2,host1:2", "host0:1,host1:3,host2:2", "a:4,b:4"])
def test_hierarchical_route_crosses_hosts_once_per_host_as_the_byte_model_counts(given):
    """In-process: the relays merge every host's ids for one owner on one rank, so the ids crossing hosts are the
    byte model's per-host count, never more than the flat exchange's per-rank count; the planner picks the
    hierarchical exchange on several hosts with a host of several workers, and the launcher exports the hosts."""
    size = sum(int(h.split(":")[1]) for h in given.split(","))
    env = launch_env({}, 0.0, given)
    assert env[hostmap.HOSTS_ENV] == given and env["HOROVOD_DYNAMIC_PROCESS_SETS"] == "1"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(hostmap.HOSTS_ENV, given)
        where = hostmap.from_env(size)
    assert [r for ranks in where.hosts for r in ranks] == list(range(size))
    rng = np.random.default_rng(size)
    ids_by_rank = [rng.zipf(1.3, 40) % 50 for _ in range(size)]

    def owner(ids):
        return np.asarray(ids) % size

    hier = byte_model.cross_host_ids(ids_by_rank, owner, where.hosts, hierarchical=True)
    flat = byte_model.cross_host_ids(ids_by_rank, owner, where.hosts, hierarchical=False)
    assert _routed_crossings(where, ids_by_rank, lambda i: int(i) % size) == hier
    assert 0 < hier < flat
    assert planner.hierarchical_pays([len(r) for r in where.hosts])
    assert not planner.hierarchical_pays([1, 1]) and not planner.hierarchical_pays([4])


def test_the_byte_model_counts_an_id_two_ranks_of_a_host_ask_once_across_hosts():
    hosts, ids = [[0, 1], [2]], [[5, 5, 3], [5], [1]]
    owner = lambda ids: np.asarray(ids) % 3  # noqa: E731  5 -> rank 2 (host1), 3 -> rank 0, 1 -> rank 1 (host0)
    assert byte_model.cross_host_ids(ids, owner, hosts, hierarchical=False) == 3  # 5 from ranks 0 and 1, 1 from 2
    assert byte_model.cross_host_ids(ids, owner, hosts, hierarchical=True) == 2
