#!/usr/bin/env bash
# Creates .venv in the checkout and installs everything collective needs:
# TensorFlow (CPU or GPU build), Horovod 0.28.1 built against it with Gloo
# (and NCCL where CUDA is present), then this project with its dev extra.
# Idempotent: a second run with nothing changed returns in seconds and never
# rebuilds Horovod.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
venv="$root/.venv"
constraints="$root/constraints.txt"
stamp="$venv/.collective-setup"

say() { echo "[setup] $*"; }
die() { echo "[setup] ERROR: $*" >&2; exit 1; }

# The stamp records what was installed; when setup.cfg, the constraints and
# this script are unchanged there is nothing to do.
fingerprint() {
  cat setup.cfg pyproject.toml "$constraints" "$0" | sha256sum | cut -d' ' -f1
}

find_python() {
  for candidate in "${PYTHON:-}" python3.11 python3.10 python3.9 python3; do
    [ -n "$candidate" ] || continue
    command -v "$candidate" >/dev/null 2>&1 || continue
    if "$candidate" -c 'import sys; sys.exit(0 if (3, 9) <= sys.version_info[:2] <= (3, 11) else 1)' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  return 1
}

gpu_present() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

# sshd: the simulated hosts of scripts/local_hosts.sh (and tests/test_hosts.py) run one per network namespace.
# Checked on every run, even when the venv is up to date; this is the only place it is installed.
ensure_sshd() {
  [ -x /usr/sbin/sshd ] && return 0
  command -v apt-get >/dev/null 2>&1 || die "sshd (/usr/sbin/sshd) is missing and apt-get is not available; install an OpenSSH server (the multi-host tests run one per simulated host)."
  [ "$(id -u)" = 0 ] || die "sshd (/usr/sbin/sshd) is missing; install it as root with 'apt-get update && apt-get install -y openssh-server' (the multi-host tests run one per simulated host)."
  say "installing openssh-server (sshd for the simulated hosts of scripts/local_hosts.sh)"
  DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null || die "apt-get update failed (see above)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssh-server >/dev/null || die "apt-get install openssh-server failed (see above)"
  [ -x /usr/sbin/sshd ] || die "openssh-server installed but /usr/sbin/sshd is missing"
}
ensure_sshd

if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(fingerprint)" ]; then
  say "up to date ($venv)"
  exit 0
fi

python=$(find_python) || die "TensorFlow 2.15 needs Python 3.9, 3.10 or 3.11 and none was found. Install one (e.g. 'apt-get install python3.11 python3.11-venv' or pyenv) or point PYTHON=/path/to/python3.11 at it."
command -v cmake >/dev/null 2>&1 || die "cmake is missing; Horovod's build needs it. Install it with 'apt-get install cmake' (or 'pip install cmake')."
if ! command -v "${CXX:-c++}" >/dev/null 2>&1 && ! command -v g++ >/dev/null 2>&1; then
  die "no C++ compiler found; Horovod's build needs one. Install it with 'apt-get install g++'."
fi
"$python" -c 'import venv, ensurepip' 2>/dev/null || die "$python cannot create virtual environments; install its venv module (e.g. 'apt-get install python3-venv')."

if [ ! -x "$venv/bin/python" ]; then
  say "creating $venv with $($python --version)"
  "$python" -m venv "$venv"
fi
# pip here warns about every configured index folder a package is not in;
# that noise hides real errors, so it is filtered out.
pip_install() {
  local status
  set +e
  "$venv/bin/python" -m pip install -q "$@" 2>&1 | grep -v "is ignored: it is neither a file nor a directory"
  status=${PIPESTATUS[0]}
  set -e
  return "$status"
}
pip_install -c "$constraints" pip setuptools wheel

if gpu_present; then
  tf_package=tensorflow
  say "GPU found by nvidia-smi: installing the GPU build of TensorFlow"
else
  tf_package=tensorflow-cpu
  say "no GPU visible: installing tensorflow-cpu"
fi
pip_install -c "$constraints" "$tf_package==2.15.1" "tensorflow-estimator==2.15.0"

horovod_ok() {
  "$venv/bin/python" - <<'PY' 2>/dev/null
import sys
import horovod
import horovod.tensorflow as hvd
sys.exit(0 if horovod.__version__ == "0.28.1" and hvd.gloo_built() else 1)
PY
}

if horovod_ok; then
  say "Horovod 0.28.1 with TensorFlow and Gloo already built"
else
  say "building Horovod 0.28.1 against TensorFlow (a few minutes on 2 cores; pip caches the wheel)"
  export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1
  if gpu_present && command -v nvcc >/dev/null 2>&1; then
    export HOROVOD_GPU_OPERATIONS=NCCL
    say "CUDA found: building with NCCL"
  fi
  pip_install -c "$constraints" --no-build-isolation "horovod==0.28.1" \
    || die "Horovod's build failed (see above). It needs cmake, a C++17 compiler and the TensorFlow installed in $venv."
  horovod_ok || die "Horovod installed but horovod.tensorflow does not load with Gloo; rebuild with 'rm -rf $venv' and run this script again."
fi

extras="dev,tf-cpu,tfds"
[ "$tf_package" = tensorflow ] && extras="dev,tf-gpu,gpu,tfds"
pip_install -c "$constraints" -e ".[$extras]"

check=$("$venv/bin/horovodrun" --check-build 2>&1) || die "horovodrun --check-build failed: $check"
echo "$check" | grep -q '\[X\] TensorFlow' || die "Horovod was built without TensorFlow: $check"
echo "$check" | grep -q '\[X\] Gloo' || die "Horovod was built without Gloo: $check"

fingerprint > "$stamp"
say "done: $("$venv/bin/python" -c 'import tensorflow as tf, horovod; print("tensorflow", tf.__version__, "horovod", horovod.__version__)' 2>/dev/null)"
