"""scripts/local_hosts.sh's link shaping, run in a private mount and network namespace: a set of simulated hosts
that tests/test_hosts.py (or anyone) has up on this machine is not touched."""

import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# /run (the namespaces' mounts, the sshds' state), the ssh client configuration and /etc/hosts are private copies.
SANDBOX = r"""
mount -t tmpfs none /run && mkdir -p /run/netns
mount -t tmpfs none /etc/ssh/ssh_config.d
cp /etc/hosts "$COLLECTIVE_HOSTS_DIR.hosts" && mount --bind "$COLLECTIVE_HOSTS_DIR.hosts" /etc/hosts
bash scripts/local_hosts.sh up 1 --rate 1gbit --delay 1ms
made=$?
if [ "$made" = 0 ]; then
  ip netns exec host0 tc qdisc show dev chosts
  bash scripts/local_hosts.sh down >/dev/null
fi
exit "$made"
"""


def test_delay_is_shaped_with_netem_or_refused_before_anything_is_touched(tmp_path):
    assert os.geteuid() == 0, "scripts/local_hosts.sh needs root (namespaces, tc)"
    netem = subprocess.run(["unshare", "--net", "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                           capture_output=True, check=False).returncode == 0
    state = tmp_path / "state"
    state.mkdir()
    (state / "kept").write_text("a running set's state")
    env = dict(os.environ, COLLECTIVE_HOSTS_DIR=str(state))
    run = subprocess.run(["unshare", "--mount", "--net", "--propagation", "private", "bash", "-c", SANDBOX], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=120, check=False)
    if netem:
        assert run.returncode == 0, run.stderr
        assert "netem" in run.stdout and "delay 1ms" in run.stdout and "rate 1Gbit" in run.stdout, run.stdout
    else:
        # refused before `up`'s own `down`, which would have taken a running set (and this state) down
        assert (state / "kept").exists(), run.stderr
        assert run.returncode == 1, run.stdout + run.stderr
        assert "--delay 1ms needs the kernel's netem qdisc (sch_netem)" in run.stderr, run.stderr
        assert "leave --delay out" in run.stderr
