"""The launcher: worker environment, failure propagation, clean-up and bad arguments."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

from collective.runtime import launcher as launch
from collective.runtime import multihost
from launcher import run_workers


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("preload", [True, False], ids=["forked", "new-interpreters"])
def test_failing_worker_stops_the_job_with_its_code(tmp_path, preload):
    start = time.monotonic()
    proc = run_workers("exit_code.py", 3, [tmp_path], check=False, timeout=60, preload=preload)
    elapsed = time.monotonic() - start
    assert proc.returncode == 3, proc.stderr
    assert elapsed < 20, f"launcher took {elapsed:.1f}s to stop the job"
    assert "worker 1 exited with code 3" in proc.stderr
    pids = [int(p) for r in range(3) for p in (tmp_path / f"pids{r}.txt").read_text().split()]
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)], "workers or their children outlived the launcher"


def test_the_worker_that_failed_first_names_the_job_s_exit_code(tmp_path):
    """Regression: the launcher reported the lowest failed rank of its poll, so a failure that followed another
    worker's (Horovod's "has been shut down" after a crash) within the same poll took the job's exit code."""
    proc = run_workers("exit_order.py", 3, [tmp_path], check=False, timeout=60)
    assert proc.returncode == 17 and "worker 2 exited with code 17" in proc.stderr, proc.stderr


@pytest.mark.parametrize("n", [1, 2, 3])
def test_each_worker_gets_its_rank_and_the_strategy(n):
    proc = run_workers("echo_env.py", n, env={"COLLECTIVE_STRATEGY": "sok", "CUDA_VISIBLE_DEVICES": ""})
    lines = sorted(line for line in proc.stdout.splitlines() if "HOROVOD_RANK=" in line)
    assert len(lines) == n
    for r in range(n):
        line = next(l for l in lines if l.startswith(f"[{r}] "))
        assert f"HOROVOD_RANK={r} HOROVOD_SIZE={n} COLLECTIVE_STRATEGY=sok CUDA_VISIBLE_DEVICES= " in line
        threads = int(re.search(r"TF_NUM_INTRAOP_THREADS=(\d+)", line).group(1))
        assert threads == max(1, (os.cpu_count() or 1) // n)


def test_missing_script_is_a_clear_error(tmp_path):
    missing = tmp_path / "no_such_script.py"
    proc = run_workers(str(missing), 2, check=False, timeout=60, preload=False)
    assert proc.returncode == 2
    assert f"script {str(missing)!r} does not exist" in proc.stderr


def _probe_reports(proc):
    """``{rank: report}`` from preload_probe.py's JSON lines."""
    reports = {}
    for line in proc.stdout.splitlines():
        prefix, _, text = line.partition(" ")
        if text.startswith("{"):
            reports[int(prefix.strip("[]"))] = json.loads(text)
    return reports


def test_preloaded_workers_run_their_script_as_a_new_interpreter_does():
    """--preload forks the workers from the launcher: each must still see what `python -u script` would give it
    (its argv, sys.path[0], __main__, an empty stdin, unbuffered output, its own logging and random state, atexit
    handlers, the traceback and exit code of an uncaught exception)."""
    runs = {preload: run_workers("preload_probe.py", 3, ["fail"], check=False, timeout=120, preload=preload,
                                 server=False)
            for preload in (True, False)}
    forked, fresh = (_probe_reports(runs[p]) for p in (True, False))
    assert sorted(forked) == sorted(fresh) == [0, 1, 2], (runs[True].stdout, runs[True].stderr)
    # Regression: forked workers shared the launcher's global numpy random state (every rank drew the same).
    assert len({forked[rank]["draw"] for rank in range(3)}) == 3, forked
    for rank in range(3):
        draws = forked[rank].pop("draw"), fresh[rank].pop("draw")
        assert forked[rank] == fresh[rank], rank
        assert draws[0] != draws[1]
    assert forked[0]["name"] == "__main__" and forked[0]["argv"][1:] == ["fail"] and not forked[0]["stdout_buffered"]
    for preload, proc in runs.items():
        assert proc.returncode == 1, (preload, proc.stderr)
        assert "[2] ValueError: probe failure on rank 2" in proc.stderr and "[2] Traceback" in proc.stderr, preload
        for rank in range(3):
            assert f"[{rank}] probe-log INFO rank {rank} logs through its own configuration" in proc.stderr, preload
            assert f"[{rank}] atexit handler of rank {rank} ran" in proc.stdout, preload


def test_preload_refuses_what_it_cannot_fork(tmp_path):
    (tmp_path / "starts_a_thread.py").write_text("import threading, time\n"
                                                 "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
    script = str(tmp_path / "unused.py")
    (tmp_path / "unused.py").write_text("")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    for module, message in [("starts_a_thread", "--preload starts_a_thread: importing it started a thread"),
                            ("no_such_module", "--preload no_such_module: the import failed (ModuleNotFoundError")]:
        proc = subprocess.run([sys.executable, "-m", "collective.launch", "-n", "2", "--preload", module, script],
                              capture_output=True, text=True, timeout=60, env=env)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert launch.main(["-n", "2", "-H", "a:1,b:1", "--preload", "numpy", script]) == 2


def test_worker_count_defaults():
    assert launch.worker_count(None, ["0", "1", "3"]) == 3
    assert launch.worker_count(None, []) == 1
    assert launch.worker_count(2, []) == 2
    with pytest.raises(launch.LaunchError, match="at least 1"):
        launch.worker_count(0, [])


def test_more_workers_than_gpus_is_refused_with_both_numbers():
    """Regression: -n 4 with 2 GPUs gave ranks 0 and 2 GPU 0 (and 1 and 3 GPU 1), which NCCL refuses."""
    proc = run_workers("echo_env.py", 4, env={"CUDA_VISIBLE_DEVICES": "0,1"}, check=False, timeout=60)
    assert proc.returncode == 2, proc.stdout
    assert "HOROVOD_RANK=" not in proc.stdout  # no worker started
    assert ("-n 4 asks for 4 workers but CUDA_VISIBLE_DEVICES lists 2 GPU(s) (0,1)" in proc.stderr
            and "run -n 2, or set CUDA_VISIBLE_DEVICES= (empty) to run 4 workers on CPU" in proc.stderr), proc.stderr
    assert launch.worker_count(2, ["0", "1", "2"]) == 2
    assert launch.worker_count(3, []) == 3  # no GPU: CPU workers, as many as asked
    with pytest.raises(launch.LaunchError, match="nvidia-smi lists 1 GPU"):
        launch.worker_count(2, ["0"], "nvidia-smi")


def test_visible_gpus_follow_cuda_visible_devices():
    assert launch.visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}) == ["0", "1"]
    assert launch.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    env = launch.worker_env({}, 1, 2, ["4", "5"], 8, 1234)
    assert env["CUDA_VISIBLE_DEVICES"] == "5" and env["TF_NUM_INTRAOP_THREADS"] == "4"


def test_hosts_are_handed_to_horovodrun():
    assert launch.total_slots("a:2,b:4") == 6
    cmd = launch.horovodrun_command([sys.executable, "train.py"], 6, "a:2,b:4", nic="eth1", ssh_port=2222)
    assert cmd[-5:] == [sys.executable, "-m", "collective.runtime.hostworker", sys.executable, "train.py"]
    assert cmd[1:3] == ["-m", "collective.runtime.multihost"]
    assert cmd[3:8] == ["--gloo", "-np", "6", "-H", "a:2,b:4"]
    assert cmd[8:10] == ["--network-interfaces", "eth1"] and cmd[cmd.index("--ssh-port") + 1] == "2222"
    with pytest.raises(launch.LaunchError, match="HOST:SLOTS"):
        launch.total_slots("a")
    with pytest.raises(launch.LaunchError, match="names a host twice"):
        launch.total_slots("a:1,a:2")
    assert multihost.ranks_by_host("a:2,b:1,c:4", 5) == {"a": [0, 1], "b": [2], "c": [3, 4]}
    with pytest.raises(launch.LaunchError, match="--ssh-identity-file 'no-such-key' does not exist"):
        launch.horovodrun_command([sys.executable, "train.py"], 2, "a:1,b:1", nic="eth1",
                                  ssh_identity_file="no-such-key")
    # A host that vanishes without closing its connections ends the job at Gloo's timeout: the stall timeout.
    assert launch.hosts_env({}, 90.0)["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "90"
    assert launch.hosts_env({"HOROVOD_GLOO_TIMEOUT_SECONDS": "7"}, 90.0)["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "7"
    assert "HOROVOD_GLOO_TIMEOUT_SECONDS" not in launch.hosts_env({}, 0.0)


def test_hosts_network_interface_is_the_one_on_the_hosts_network(monkeypatch):
    """The launcher picks the local interface whose network holds every remote host (the narrowest one)."""
    addresses = {"h0": "10.1.2.10", "h1": "10.1.2.11", "far": "192.168.9.9", "me": "10.1.2.1"}
    monkeypatch.setattr(multihost, "_resolve", addresses.__getitem__)
    nics = {"lo": [("127.0.0.1", "255.0.0.0")], "eth0": [("10.0.0.5", "255.0.0.0")],
            "br0": [("10.1.2.1", "255.255.255.0")]}
    assert multihost.interface_for(["h0", "h1", "me"], nics) == ("br0", "10.1.2.1")
    with pytest.raises(multihost.HostsError, match="--network-interface"):
        multihost.interface_for(["h0", "far"], nics)
    with pytest.raises(multihost.HostsError, match="without --hosts"):
        multihost.interface_for(["me"], nics)


def _non_loopback_addresses():
    """This machine's IPv4 addresses other than 127.x (from the kernel's routing, no extra package)."""
    import socket

    found = set()
    try:
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent by a UDP connect
        found.add(probe.getsockname()[0])
        probe.close()
    except OSError:
        pass
    try:
        found.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return sorted(a for a in found if not a.startswith("127."))


def test_local_rendezvous_listens_on_loopback_only():
    """Regression: Horovod's RendezvousServer bound every interface, an unauthenticated store reachable from afar."""
    import socket

    server, port, _ = launch._start_rendezvous(2)  # pylint: disable=protected-access
    try:
        assert server._httpd.server_address[0] == "127.0.0.1"  # pylint: disable=protected-access
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        addresses = _non_loopback_addresses()
        if not addresses:
            pytest.skip("this machine has no non-loopback IPv4 address to try the port on")
        for address in addresses:
            with pytest.raises(OSError):
                socket.create_connection((address, port), timeout=5).close()
    finally:
        server.stop()


@pytest.mark.parametrize("argv", [["-np", "3", "-H", "a:2,b:1", "train.py", "-n", "9"],
                                  ["-n", "3", "--hosts", "a:2,b:1", "train.py", "-n", "9"],
                                  ["--num-workers", "3", "-H", "a:2,b:1", "train.py", "-n", "9"]])
def test_horovodrun_spellings_are_accepted(argv):
    """-np and -H as Horovod users type them; what follows the script stays the script's."""
    args = launch.parse_args(argv)
    assert (args.num_workers, args.hosts, args.script, args.args) == (3, "a:2,b:1", "train.py", ["-n", "9"])

