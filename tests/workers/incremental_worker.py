"""Incremental checkpoints on N workers: write a chain, restore others' chains, and die inside a delta save.

argv: base_dir backend pid_dir action...
- ``write:<name>[:<placement>]``: trains incremental_cases' schedule into ``<base>/<name>``
  (a full save, then deltas), its tables placed ``<placement>`` when given;
- ``restore:<name>,<name>...[:<placement>]``: restores every chain end of those model_dirs
  under this world size (its tables placed ``<placement>`` when given) and saves each as a full
  checkpoint into ``<base>/restored/to<N>/<name>/``;
- ``mts:<name>:<last step>``: MonitoredTrainingSession with a delta every
  step into ``<base>/<name>`` (a rerun resumes from the chain);
- ``hold:<step>``: from now on rank 0 holds inside the save of the delta of
  that step, after its files are merged and before its manifest is
  written, until the test kills it (SIGKILL).
"""

import os
import sys
import time

import incremental_cases as ic
import restart_cases as rc
from collective import CollectiveStrategy
from collective.checkpoint import manifest

base, backend, pid_dir, actions = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
strategy = CollectiveStrategy(backend)
r, n = strategy.rank(), strategy.world_size()
rc.write_pid(pid_dir, r)


def placed(placement: str):
    """The strategy, or one placing every table of the model ``placement`` (when given)."""
    return CollectiveStrategy(backend, sharding={t: placement for t in ic.TABLES}) if placement else strategy


def hold_before_manifest(write, hold_step: int):
    def holding(prefix, step, *args, **kwargs):
        if step == hold_step:
            print(f"rank {r} holding before the manifest of step {step}", flush=True)
            time.sleep(rc.HOLD_SECONDS)
        return write(prefix, step, *args, **kwargs)

    return holding


for action in actions:
    began = time.monotonic()
    verb, _, arg = action.partition(":")
    if verb == "write":
        name, _, placement = arg.partition(":")
        ic.train_chain(placed(placement), os.path.join(base, name))
    elif verb == "restore":
        names, _, placement = arg.partition(":")
        ic.restore_chains(placed(placement), [os.path.join(base, name) for name in names.split(",")],
                          os.path.join(base, "restored", f"to{n}"))
    elif verb == "mts":
        name, last = arg.split(":")
        ic.train_mts(strategy, os.path.join(base, name), int(last))
    elif verb == "hold":
        manifest.write_manifest = hold_before_manifest(manifest.write_manifest, int(arg))
    else:
        raise SystemExit(f"unknown action {action!r}")
    print(f"rank {r} done {action} in {time.monotonic() - began:.1f} s", flush=True)
