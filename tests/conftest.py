"""Shared fixtures: the repository root and a runner for multi-process jobs."""

import os
import pathlib

import pytest

from launcher import run_workers, warm_server_pid  # noqa: F401  (run_workers re-exported for tests)
from timing import SuiteClock

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def repo_root() -> pathlib.Path:
    return REPO


@pytest.fixture(scope="session")
def movielens_small() -> pathlib.Path:
    """../shared/data/ml-latest-small, skipping the test where it is absent."""
    path = SHARED_DATA / "ml-latest-small"
    if not (path / "ratings.csv").exists():
        pytest.skip(f"real MovieLens data not found at {path}")
    return path


def pytest_configure(config):
    config.pluginmanager.register(SuiteClock(warm_server_pid), "collective-suite-clock")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Every Horovod job the tests start (workers, the benchmark harness, the demo) inherits this. Horovod's
    # background thread coordinates every cycle, busy or idle, over Gloo's TCP; at its default 1 ms each worker
    # spends about a tenth of a core on it, taken from the jobs' training on a 2-core machine that runs more
    # workers than cores. At 5 ms, test_estimator + test_api_sok + test_feature_column_hash used 10% less CPU
    # (489 -> 437 s) and 6% less time.
    os.environ.setdefault("HOROVOD_CYCLE_TIME", "5")
    # TensorFlow's oneDNN graph rewrites (on by default in the x86 CPU build) cost more than they gain on the
    # suite's small graphs: every session creation runs the layout pass, every small matmul pays oneDNN's
    # dispatch. Off, test_api_sok + test_sok_v2 took 122-132 CPU-s against 154-165 on. The workers, the warm
    # launch server and the plain-TensorFlow subprocesses inherit it; numbers are compared within one setting.
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


# Tests that may never be skipped: a skip there is reported as a failure (the multi-host tests must run in CI).
NEVER_SKIPPED = ("test_hosts.py",)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and item.path.name in NEVER_SKIPPED:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} was skipped ({report.longrepr}); the tests of {item.path.name} may not "
                           "be skipped: make them run (scripts/local_hosts.sh up needs root and sshd: "
                           "scripts/setup.sh installs it)")
