"""Starts one worker process per device: ``python -m collective.launch``.

    python -m collective.launch [-n N] [--hosts HOST:SLOTS,...] SCRIPT [ARGS...]
    python -m collective.launch [-n N] -m MODULE [ARGS...]

On one host it starts a Horovod Gloo rendezvous bound to loopback and N
worker processes with Horovod's rank and size variables, one GPU each where
there are GPUs, and TensorFlow's thread pools split between them. Every
output line is prefixed with its worker's rank. When a worker fails the others
are stopped and the launcher exits with that worker's code; Ctrl-C stops
everything. With ``--hosts`` the job is handed to ``horovodrun`` with the same
environment, through :mod:`collective.runtime.multihost` (the interface on the
hosts' network, the rendezvous bound to it, failures named with their host);
there each worker sees every GPU of its host and the library pins it to the one
of its local rank (:mod:`collective.runtime.devices`). docs/hosts.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence, Set, Union

from collective.runtime import devices, hostmap, multihost
from collective.runtime.devices import too_many_workers, visible_gpus
from collective.runtime.preload import ForkedWorker, PreloadError, fork_worker, parse_modules, preload, reap_in_order
from collective.runtime.stall import DEFAULT_FIRST_STEP_TIMEOUT, FIRST_STEP_TIMEOUT_ENV
from collective.runtime.stall import DEFAULT_TIMEOUT as DEFAULT_STALL_TIMEOUT
from collective.runtime.stall import ENV as HEARTBEAT_ENV
from collective.runtime.stall import EXIT_CODE as STALL_EXIT_CODE
from collective.runtime.stall import StallWatch, timeout_from_env

logger = logging.getLogger("collective.launch")

# The local job's rendezvous listens here only.
LOOPBACK = "127.0.0.1"
# Seconds a worker gets to exit after SIGTERM before it is killed: when the job fails or on Ctrl-C, and when the
# launcher itself gets SIGTERM (a preemption notice: the workers save a checkpoint first).
_GRACE_SECONDS = 5.0
_STOP_GRACE_SECONDS = 60.0
_PASSED_THROUGH = ("COLLECTIVE_STRATEGY", "COLLECTIVE_KERNELS", "COLLECTIVE_REPLICATE_BELOW_BYTES",
                   "HB_COMM_DEFAULT", "HB_COMM_POOL_CAPACITY")


class LaunchError(RuntimeError):
    """The job cannot be started as asked."""


def worker_count(requested: Optional[int], gpus: Sequence[str], gpu_source: str = "CUDA_VISIBLE_DEVICES") -> int:
    """How many workers to start: ``-n`` if given, else one per GPU, else 1.

    Each worker needs a GPU of its own where there are GPUs (NCCL refuses two
    ranks on one device), so ``-n`` above the GPU count is refused;
    ``gpu_source`` names where ``gpus`` came from, for the message.
    """
    if requested is not None:
        if requested < 1:
            raise LaunchError(f"-n {requested}: the number of workers must be at least 1")
        if gpus and requested > len(gpus):
            raise LaunchError(too_many_workers(requested, gpus, gpu_source, f"-n {requested}", f"run -n {len(gpus)}"))
        return requested
    if gpus:
        return len(gpus)
    logger.info("no GPU visible and no -n given: starting 1 worker (pass -n N for more CPU workers)")
    return 1


def worker_command(script: Optional[str], module: Optional[str], args: Sequence[str]) -> List[str]:
    """The Python command line each worker runs; checks that the script exists."""
    if module:
        return [sys.executable, "-u", "-m", module, *args]
    if not script:
        raise LaunchError("nothing to run: give a script path (or -m MODULE) after the launcher's options")
    if not os.path.isfile(script):
        raise LaunchError(f"script {script!r} does not exist (looked in {os.getcwd()}); "
                          "give the path of a Python file, or use -m MODULE")
    return [sys.executable, "-u", script, *args]


def worker_env(base: Dict[str, str], rank: int, size: int, gpus: Sequence[str], cores: int,
               rendezvous_port: int) -> Dict[str, str]:
    """The environment of worker ``rank`` of ``size`` on this host."""
    env = dict(base)
    threads = max(1, cores // size)
    env.update({
        "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(size),
        "HOROVOD_LOCAL_RANK": str(rank), "HOROVOD_LOCAL_SIZE": str(size),
        "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1",
        "HOROVOD_HOSTNAME": "localhost",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": LOOPBACK,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous_port),
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": "lo",
        "COLLECTIVE_RANK": str(rank), "COLLECTIVE_WORLD_SIZE": str(size),
        "COLLECTIVE_LOCAL_RANK": str(rank), "COLLECTIVE_LOCAL_SIZE": str(size),
        "TF_NUM_INTRAOP_THREADS": str(threads),
        "TF_NUM_INTEROP_THREADS": str(min(2, threads)),
        "OMP_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
    })
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = gpus[rank % len(gpus)]
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _start_rendezvous(size: int, serve_later: bool = False):
    """A Horovod Gloo rendezvous server for ``size`` local slots, listening on loopback only.

    Horovod's ``RendezvousServer.start`` binds every interface (``find_port``
    binds ``('', port)``), and its store takes unauthenticated reads and
    writes: a local job has no reason to let other machines reach it.
    Returns ``(server, port, serve)``: ``serve()`` starts its thread, which
    with ``serve_later`` is left to the caller (after forking workers).
    """
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer, RendezvousServer

    server = RendezvousServer(verbose=0)
    httpd = RendezvousHTTPServer((LOOPBACK, 0), RendezvousHandler, 0)  # port 0: the kernel picks a free one
    server._httpd = httpd  # pylint: disable=protected-access
    server.init(get_host_assignments(parse_hosts(f"localhost:{size}"), size))

    def serve() -> None:
        thread = threading.Thread(target=httpd.serve_forever, name="rendezvous", daemon=True)
        thread.start()
        server._listen_thread = thread  # pylint: disable=protected-access

    if not serve_later:
        serve()
    return server, httpd.server_address[1], serve


def _die_with_launcher() -> None:
    """Runs in each worker before exec: the kernel kills it if the launcher dies (Linux)."""
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _pump(stream, rank: int, sink) -> None:
    prefix = f"[{rank}] "
    for line in iter(stream.readline, ""):
        sink.write(prefix + line)
        sink.flush()
    stream.close()


class Job:
    """N local worker processes, watched together.

    With ``fork`` each worker is forked from this process (``--preload``, :mod:`collective.runtime.preload`)
    instead of started as a new interpreter; every worker is forked before any output thread starts.
    """

    def __init__(self, command: List[str], envs: List[Dict[str, str]], fork: bool = False):
        self.procs: List[Union[subprocess.Popen, ForkedWorker]] = []
        self._threads: List[threading.Thread] = []
        for env in envs:
            if fork:
                ours = [stream.fileno() for proc in self.procs for stream in (proc.stdout, proc.stderr)]
                proc = fork_worker(command, env, before_run=_die_with_launcher, close_in_child=ours)
            else:
                # Each worker leads its own process group so that stopping it
                # also stops whatever it started.
                proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        stdin=subprocess.DEVNULL, text=True, bufsize=1, start_new_session=True,
                                        preexec_fn=_die_with_launcher)
            self.procs.append(proc)
        if fork:
            reap_in_order(self.procs)
        for rank, proc in enumerate(self.procs):
            for stream, sink in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
                t = threading.Thread(target=_pump, args=(stream, rank, sink), daemon=True)
                t.start()
                self._threads.append(t)

    def wait(self, watch: Optional[StallWatch] = None) -> int:
        """Waits for every worker; on the first failure, or a stall ``watch`` reports, stops the rest.

        Returns the job's exit code (:data:`collective.runtime.stall.EXIT_CODE` for a stall).
        """
        next_check = time.monotonic() + 1.0
        exited: Set[int] = set()
        while True:
            codes = [(rank, proc.poll()) for rank, proc in enumerate(self.procs)]
            failed = [(rank, code) for rank, code in codes if code not in (None, 0)]
            if failed:
                # The worker that failed first: the others' failures are often its consequence (Horovod's "has
                # been shut down"). Forked workers know their order of exit; started ones, their order of rank.
                rank, code = min(failed, key=lambda failure: (_exit_order(self.procs[failure[0]]), failure[0]))
                exit_code = code if code > 0 else 128 - code
                logger.error("worker %d %s; stopping the other workers", rank, exit_reason(code))
                self.stop()
                return exit_code
            exited.update(rank for rank, code in codes if code == 0)
            if len(exited) == len(self.procs):
                self._drain()
                return 0
            if watch is not None and time.monotonic() >= next_check:
                next_check = time.monotonic() + 1.0
                stalled = watch.check(exited=exited)  # polled just before: a worker that has exited is never blamed
                if stalled:
                    logger.error("%s\nstopping the job", stalled)
                    self.stop()
                    return STALL_EXIT_CODE
            time.sleep(0.05)

    def stop(self, grace: float = _GRACE_SECONDS) -> None:
        """Stops every worker still running: SIGTERM, then SIGKILL after ``grace`` seconds."""
        for proc in self.procs:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.procs:
            # The group may outlive its leader: kill it whatever the leader did.
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
        self._drain()

    def _drain(self) -> None:
        for t in self._threads:
            t.join(timeout=2.0)


def _exit_order(proc: Union[subprocess.Popen, ForkedWorker]) -> float:
    order = getattr(proc, "exit_order", None)
    return float("inf") if order is None else order


def exit_reason(code: int) -> str:
    """How a worker ended, for the log: its exit code, or the signal that killed it (with a hint for SIGKILL)."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    text = f"was killed by {name} (exit code {128 - code})"
    if -code == signal.SIGKILL:
        text += ("; nobody in this job sent it, so the likeliest sender is the kernel's out-of-memory killer: see "
                 "`dmesg | grep -i oom`, and give the job more memory or fewer workers per host")
    return text


def _signal_group(proc: Union[subprocess.Popen, ForkedWorker], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_grace_seconds() -> float:
    """``COLLECTIVE_STOP_GRACE_SECONDS``: how long workers get after SIGTERM (to save a checkpoint) before SIGKILL."""
    value = os.environ.get("COLLECTIVE_STOP_GRACE_SECONDS", str(_STOP_GRACE_SECONDS))
    try:
        seconds = float(value)
    except ValueError:
        raise LaunchError(f"COLLECTIVE_STOP_GRACE_SECONDS={value!r} is not a number of seconds") from None
    if seconds < 0:
        raise LaunchError(f"COLLECTIVE_STOP_GRACE_SECONDS={value!r} must be >= 0")
    return seconds


def run_local(command: List[str], size: int, gpus: Sequence[str], stall_timeout: float = DEFAULT_STALL_TIMEOUT,
              first_step_timeout: float = DEFAULT_FIRST_STEP_TIMEOUT, preload_modules: Sequence[str] = ()) -> int:
    """Runs ``command`` as ``size`` workers on this host and returns the job's exit code.

    Workers report progress to files in a temporary folder (:mod:`collective.runtime.stall`); with a
    ``stall_timeout`` (seconds, 0: off) a job whose workers make no progress that long is stopped,
    ``first_step_timeout`` (0: no limit) being the limit while a worker has finished no step. With
    ``preload_modules`` the launcher imports them and forks the workers (:mod:`collective.runtime.preload`).
    """
    server, port, serve = _start_rendezvous(size, serve_later=bool(preload_modules))
    cores = os.cpu_count() or 1
    base = dict(os.environ)
    beats = tempfile.mkdtemp(prefix="collective-heartbeats-")
    files = [os.path.join(beats, f"rank{rank}") for rank in range(size)]
    envs = [worker_env(base, rank, size, gpus, cores, port) for rank in range(size)]
    for env, path in zip(envs, files):
        env[HEARTBEAT_ENV] = path
        if stall_timeout > 0:
            # Gloo's own limit (30 s) would end waits our detector allows: a long save on one rank, a long first
            # step on one rank.
            env.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(int(max(stall_timeout, first_step_timeout) + 60)))
    if preload_modules:
        _preload_with_shared_env(preload_modules, envs, server)
    logger.info("starting %d worker(s): %s", size, " ".join(shlex.quote(c) for c in command))
    job = Job(command, envs, fork=bool(preload_modules))
    if preload_modules:
        serve()
    watch = (StallWatch(files, [p.pid for p in job.procs], stall_timeout, first_step_timeout)
             if stall_timeout > 0 else None)

    def _interrupt(signum, _frame):
        # SIGTERM is a preemption notice: workers that train with checkpoints save one (collective.runtime.preemption).
        grace = stop_grace_seconds() if signum == signal.SIGTERM else _GRACE_SECONDS
        logger.error("received signal %d: stopping all workers (%.0f s to exit before they are killed)", signum, grace)
        job.stop(grace)
        server.stop()
        sys.exit(128 + signum)

    previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return job.wait(watch)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        server.stop()
        shutil.rmtree(beats, ignore_errors=True)


def _preload_with_shared_env(modules: Sequence[str], envs: List[Dict[str, str]], server) -> None:
    """Imports ``modules`` here with the variables every worker shares (thread counts, log level) already set,
    as each worker's own import would see them; a failure closes the rendezvous and is a :class:`LaunchError`."""
    shared = {key: value for key, value in envs[0].items() if all(env.get(key) == value for env in envs[1:])}
    os.environ.update(shared)
    try:
        preload(modules)
    except PreloadError as err:
        server._httpd.server_close()  # pylint: disable=protected-access  (never served: stop() would wait forever)
        raise LaunchError(str(err)) from None


def horovodrun_command(command: List[str], size: int, hosts: str, nic: Optional[str] = None,
                       ssh_port: Optional[int] = None, ssh_identity_file: Optional[str] = None) -> List[str]:
    """The command line of a multi-host job: horovodrun's options, run by :mod:`collective.runtime.multihost`.

    ``nic`` is the interface the hosts reach this machine on (default: the local one on their network).
    """
    try:
        if nic is None:
            nic, _ = multihost.interface_for([name for name, _ in multihost.parse_hosts(hosts)])
        return multihost.command(command, size, hosts, nic, ssh_port, ssh_identity_file)
    except multihost.HostsError as err:
        raise LaunchError(str(err)) from None


def total_slots(hosts: str) -> int:
    """Sum of the slots in a ``HOST:SLOTS,...`` list."""
    try:
        return sum(slots for _, slots in multihost.parse_hosts(hosts))
    except multihost.HostsError as err:
        raise LaunchError(str(err)) from None


def hosts_env(base: Dict[str, str], stall_timeout: float, hosts: Optional[str] = None) -> Dict[str, str]:
    """The environment horovodrun forwards to every worker of a ``--hosts`` job.

    With a stall timeout Gloo's own limit is set to it (unless given): a host that vanishes without closing
    its connections (a failed link) then ends the job within the stall timeout. ``hosts`` (the ``--hosts``
    string) is exported for the hierarchical exchange (:mod:`collective.runtime.hostmap`), with Horovod's
    dynamic process sets, which it is made of.
    """
    env = dict(base)
    if hosts:
        env[hostmap.HOSTS_ENV] = hosts
        env["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    env["PYTHONUNBUFFERED"] = "1"
    if stall_timeout > 0:
        env.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(max(1, int(stall_timeout))))
    return env


_VALUED_OPTIONS = ("-n", "-np", "--num-workers", "--hosts", "-H", "--stall-timeout", "--preload", "-m",
                   "--network-interface", "--ssh-port", "--ssh-identity-file")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Splits the launcher's options from the worker command line.

    Everything after the script path (or after ``-m MODULE``) belongs to the
    script, even when it looks like an option.
    """
    parser = argparse.ArgumentParser(
        prog="python -m collective.launch",
        usage="python -m collective.launch [-n|-np N] [--hosts|-H HOST:SLOTS,...] (SCRIPT | -m MODULE) [ARGS...]",
        description="Start one collective worker per device (GPU, or CPU slot with -n).")
    parser.add_argument("-n", "-np", "--num-workers", dest="num_workers", type=int, default=None,
                        help="number of workers (default: one per GPU in CUDA_VISIBLE_DEVICES; if that is unset, one "
                             "per GPU nvidia-smi lists; else 1); -np as horovodrun spells it")
    parser.add_argument("--hosts", "-H", dest="hosts", default=None,
                        help="HOST:SLOTS,... for a multi-host job, handed to horovodrun; -H as horovodrun spells it")
    parser.add_argument("--stall-timeout", type=float, default=None, metavar="SECONDS",
                        help="stop the job when no worker makes progress for this long (default: "
                             "COLLECTIVE_STALL_TIMEOUT, else 300; 0: off); checkpoint saves, evaluation and "
                             "export never count as a stall, and until a worker finishes its first step "
                             "COLLECTIVE_FIRST_STEP_TIMEOUT (default 1800; 0: none) is the limit")
    parser.add_argument("--network-interface", default=None, metavar="NAME",
                        help="--hosts jobs: the interface the hosts reach this machine on (default: the local one "
                             "on the hosts' network); the rendezvous listens on its address only")
    parser.add_argument("--ssh-port", type=int, default=None, help="--hosts jobs: the hosts' ssh port")
    parser.add_argument("--ssh-identity-file", default=None, metavar="PATH",
                        help="--hosts jobs: the ssh key to log in to the hosts with")
    parser.add_argument("-m", dest="module", default=None, help="run a module as a script, like python -m")
    parser.add_argument("--preload", default="", metavar="MODULE[,MODULE...]",
                        help="import these modules once in the launcher and fork the workers from it instead of "
                             "starting a new interpreter each (e.g. tensorflow,horovod.tensorflow): seconds of CPU "
                             "less per worker; local jobs only; see collective.runtime.preload for what differs")
    own, rest = [], list(argv)
    while rest:
        token = rest[0]
        if token in _VALUED_OPTIONS and len(rest) > 1:
            own += rest[:2]
            rest = rest[2:]
            if token == "-m":
                break
        elif token.startswith("-") and token not in ("-", "--"):
            own.append(rest.pop(0))
        else:
            if token == "--":
                rest.pop(0)
            break
    args = parser.parse_args(own)
    args.script = None if args.module else (rest.pop(0) if rest else None)
    args.args = rest
    return args


def _stall_timeout(args: argparse.Namespace) -> float:
    try:
        stall_timeout = timeout_from_env() if args.stall_timeout is None else args.stall_timeout
    except ValueError as err:
        raise LaunchError(str(err)) from None
    if stall_timeout < 0:
        raise LaunchError(f"--stall-timeout {stall_timeout:g} must be >= 0 (0 turns stall detection off)")
    return stall_timeout


def main(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="[launch] %(message)s")
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        command = worker_command(args.script, args.module, args.args)
        if args.hosts:
            if args.preload:
                raise LaunchError("--preload forks workers on this host; a --hosts job is started by horovodrun, "
                                  "so leave --preload out")
            size = args.num_workers if args.num_workers is not None else total_slots(args.hosts)
            full = horovodrun_command(command, size, args.hosts, args.network_interface, args.ssh_port,
                                      args.ssh_identity_file)
            stall_timeout = _stall_timeout(args)
            logger.info("multi-host job: %s", " ".join(shlex.quote(c) for c in full))
            return subprocess.call(full, env=hosts_env(dict(os.environ), stall_timeout, args.hosts))
        stop_grace_seconds()  # a bad value fails now, not at preemption
        gpus = visible_gpus()
        size = worker_count(args.num_workers, gpus, devices.gpu_source())
        stall_timeout = _stall_timeout(args)
        try:
            first_step_timeout = timeout_from_env(name=FIRST_STEP_TIMEOUT_ENV)
        except ValueError as err:
            raise LaunchError(str(err)) from None
        return run_local(command, size, gpus, stall_timeout, first_step_timeout, parse_modules(args.preload))
    except LaunchError as err:
        logger.error("%s", err)
        return 2
