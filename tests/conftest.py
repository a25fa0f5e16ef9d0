"""Shared fixtures: the repository root and a runner for multi-process jobs."""

import os
import pathlib

import pytest

from launcher import run_workers  # noqa: F401  (re-exported for tests)

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
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
