#!/usr/bin/env bash
# Simulated hosts on one machine, for multi-host jobs and their tests (docs/hosts.md).
#
#   scripts/local_hosts.sh up K [--rate RATE] [--delay DELAY]   # hosts host0..hostK-1
#   scripts/local_hosts.sh down                                  # removes everything `up` made
#
# Each host is a network namespace (and a UTS namespace: its own hostname) with one interface, named like the bridge ($BRIDGE), on a bridge in the
# machine's own namespace: the bridge has $SUBNET.1, host i has $SUBNET.(10+i). Traffic stays between these
# namespaces (no route or NAT to any other interface). Each host runs an sshd listening on its own address only;
# a key pair made here logs in as root. `up` writes names into /etc/hosts and an ssh client configuration
# (key, known host keys) into /etc/ssh/ssh_config.d, both marked as this script's and removed by `down`, so
# `python -m collective.launch --hosts host0:2,host1:1 train.py` works as typed. --rate and --delay shape every
# host's link in both directions (tc netem, or tbf for a rate where the kernel has no netem: there --delay is
# refused before anything is touched). The hosts share the machine's file system. Needs root, iproute2, tc
# and /usr/sbin/sshd (scripts/setup.sh installs it). `up` starts with a `down`: a leftover never gets in the way.
set -euo pipefail

STATE=${COLLECTIVE_HOSTS_DIR:-/run/collective-hosts}
BRIDGE=chosts
SUBNET=10.213.47
MARK="# collective-local-hosts"
SSH_CONFIG=/etc/ssh/ssh_config.d/collective-local-hosts.conf
MAX_HOSTS=32

say() { echo "[local_hosts] $*"; }
die() { echo "[local_hosts] ERROR: $*" >&2; exit 1; }

usage() {
  echo "usage: $0 up K [--rate RATE] [--delay DELAY] | down" >&2
  exit 2
}

# Namespaces this script made: those it recorded, and any host<N> holding an interface named like our bridge.
our_namespaces() {
  { [ -f "$STATE/namespaces" ] && cat "$STATE/namespaces"
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^host[0-9]+$' || true); do
      ip netns exec "$ns" ip link show "$BRIDGE" >/dev/null 2>&1 && echo "$ns"
    done; } | sort -u
}

# Rewrites a file in place (a container's /etc/hosts is often a mount point that cannot be replaced).
drop_marked_lines() {
  local file=$1
  [ -f "$file" ] || return 0
  if grep -q "$MARK" "$file"; then
    local kept
    kept=$(grep -v "$MARK" "$file" || true)
    printf '%s\n' "$kept" > "$file"
  fi
}

down() {
  local ns pid
  for ns in $(our_namespaces); do
    # Every process of the host (its sshd, the workers it started) goes with it.
    for pid in $(ip netns pids "$ns" 2>/dev/null || true); do
      kill -KILL "$pid" 2>/dev/null || true
    done
    ip netns delete "$ns" 2>/dev/null || true
  done
  ip link delete "$BRIDGE" 2>/dev/null || true
  drop_marked_lines /etc/hosts
  rm -f "$SSH_CONFIG"
  rm -rf "$STATE"
}

# Whether the kernel has netem (sch_netem): a netem qdisc on the loopback of a throwaway network namespace.
have_netem() {
  unshare --net tc qdisc add dev lo root netem delay 1ms
}

# tc netem where the kernel has it (sch_netem); without it a rate alone is shaped with tbf (a delay was refused
# before anything was made).
shape() {
  local dev=$1 netns=$2
  [ -n "$RATE$DELAY" ] || return 0
  local run=()
  [ -n "$netns" ] && run=(ip netns exec "$netns")
  local args=()
  [ -n "$DELAY" ] && args+=(delay "$DELAY")
  [ -n "$RATE" ] && args+=(rate "$RATE")
  "${run[@]}" tc qdisc replace dev "$dev" root netem "${args[@]}" 2>"$STATE/tc.log" && return 0
  if [ -z "$DELAY" ]; then
    "${run[@]}" tc qdisc replace dev "$dev" root tbf rate "$RATE" burst 256kbit latency 50ms \
      || die "tc cannot shape $dev to --rate $RATE (tbf): is '$RATE' a tc rate such as 1gbit?"
    return 0
  fi
  die "tc netem cannot shape $dev to${RATE:+ --rate $RATE} --delay $DELAY ($(cat "$STATE/tc.log")): are they tc values such as 1gbit and 100us?"
}

start_sshd() {
  local ns=$1 addr=$2
  local config="$STATE/sshd_config.$ns"
  cat > "$config" <<EOF
ListenAddress $addr
Port 22
HostKey $STATE/ssh_host_ed25519_key
PidFile $STATE/sshd.$ns.pid
AuthorizedKeysFile $STATE/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
LogLevel ERROR
MaxStartups 200
MaxSessions 200
EOF
  # Its own hostname too (a UTS namespace), which resolves to its address: Gloo advertises the address of
  # the host's name, and the machine's own name resolves to loopback.
  ip netns exec "$ns" unshare --uts sh -c "hostname $ns && exec /usr/sbin/sshd -f $config -E $STATE/sshd.$ns.log" \
    || die "sshd did not start in $ns (see $STATE/sshd.$ns.log)"
}

up() {
  local count=$1
  [ "$(id -u)" = 0 ] || die "run as root: namespaces, the bridge, /etc/hosts and sshd need it"
  [ -x /usr/sbin/sshd ] || die "/usr/sbin/sshd is missing: run scripts/setup.sh (it installs openssh-server)"
  for tool in ip tc ssh ssh-keygen unshare; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is missing (iproute2, openssh-client)"
  done
  down
  mkdir -p "$STATE" /run/sshd
  chmod 700 "$STATE"
  ssh-keygen -q -t ed25519 -N '' -C collective-local-hosts -f "$STATE/id_ed25519"
  ssh-keygen -q -t ed25519 -N '' -C collective-local-hosts -f "$STATE/ssh_host_ed25519_key"
  cp "$STATE/id_ed25519.pub" "$STATE/authorized_keys"
  : > "$STATE/known_hosts"
  : > "$STATE/namespaces"

  ip link add "$BRIDGE" type bridge
  ip addr add "$SUBNET.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  local i ns addr names="" entries=""
  for ((i = 0; i < count; i++)); do
    ns="host$i"
    addr="$SUBNET.$((10 + i))"
    ip netns add "$ns"
    echo "$ns" >> "$STATE/namespaces"
    ip link add "$BRIDGE-h$i" type veth peer name "$BRIDGE-n$i"
    ip link set "$BRIDGE-h$i" master "$BRIDGE" up
    ip link set "$BRIDGE-n$i" netns "$ns"
    # Inside the host the interface carries the bridge's name: horovodrun gives every worker the driver's
    # interface name (HOROVOD_GLOO_IFACE) and Gloo binds to it.
    ip netns exec "$ns" ip link set "$BRIDGE-n$i" name "$BRIDGE"
    ip netns exec "$ns" ip addr add "$addr/24" dev "$BRIDGE"
    ip netns exec "$ns" ip link set "$BRIDGE" up
    ip netns exec "$ns" ip link set lo up
    shape "$BRIDGE-h$i" ""
    shape "$BRIDGE" "$ns"
    echo "$ns,$addr $(cut -d' ' -f1,2 "$STATE/ssh_host_ed25519_key.pub")" >> "$STATE/known_hosts"
    entries+="$addr $ns $MARK"$'\n'
    names+=" $ns"
  done
  printf '%s' "$entries" >> /etc/hosts
  cat > "$SSH_CONFIG" <<EOF
$MARK: the simulated hosts of scripts/local_hosts.sh; removed by \`scripts/local_hosts.sh down\`.
Host$names $SUBNET.*
  User root
  IdentityFile $STATE/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $STATE/known_hosts
  GlobalKnownHostsFile /dev/null
  LogLevel ERROR
EOF
  for ((i = 0; i < count; i++)); do
    start_sshd "host$i" "$SUBNET.$((10 + i))"
  done
  for ((i = 0; i < count; i++)); do
    local tries=0
    until ssh -o BatchMode=yes -o ConnectTimeout=5 "host$i" true 2>"$STATE/ssh-check.log"; do
      tries=$((tries + 1))
      [ "$tries" -lt 20 ] || die "ssh to host$i fails: $(cat "$STATE/ssh-check.log")"
      sleep 0.25
    done
  done
  say "up: $count host(s):$names on $BRIDGE ($SUBNET.0/24; this machine is $SUBNET.1)${RATE:+, rate $RATE}${DELAY:+, delay $DELAY}; key $STATE/id_ed25519"
}

RATE=""
DELAY=""
[ $# -ge 1 ] || usage
command=$1
shift
case "$command" in
  up)
    [ $# -ge 1 ] || usage
    count=$1
    shift
    [[ "$count" =~ ^[0-9]+$ ]] && [ "$count" -ge 1 ] && [ "$count" -le "$MAX_HOSTS" ] \
      || die "up K: K must be a number of hosts from 1 to $MAX_HOSTS, got '$count'"
    while [ $# -gt 0 ]; do
      case "$1" in
        --rate) [ $# -ge 2 ] || usage; RATE=$2; shift 2 ;;
        --delay) [ $# -ge 2 ] || usage; DELAY=$2; shift 2 ;;
        *) usage ;;
      esac
    done
    # Refused before `up` takes down a running set. Without netem nothing here delays a packet: tbf and htb
    # shape a rate only (the CI machine's kernel has neither netem nor fq nor prio, and no modules to load).
    if [ -n "$DELAY" ] && [ "$(id -u)" = 0 ] && ! why=$(have_netem 2>&1); then
      die "--delay $DELAY needs the kernel's netem qdisc (sch_netem), which this kernel lacks (tc: ${why//$'\n'/ }): leave --delay out; --rate alone is shaped with tbf"
    fi
    # A failed `up` leaves nothing behind.
    trap 'status=$?; [ "$status" = 0 ] || down; exit "$status"' EXIT
    up "$count"
    ;;
  down)
    [ $# -eq 0 ] || usage
    down
    say "down: removed the simulated hosts"
    ;;
  *) usage ;;
esac
