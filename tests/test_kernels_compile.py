"""The CUDA sources of collective.kernels compile, ship with the package, and define what cupy_ops launches."""

import configparser
import fnmatch
import importlib.util
import re
import shutil
import subprocess

import pytest

from collective import kernels
from collective.kernels import cupy_ops

NVCC = shutil.which("nvcc")
SOURCES = kernels.kernel_sources()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")


def _launched_kernels():
    """(file, kernel name) pairs that cupy_ops launches, with {suffix} expanded."""
    text = (kernels.KERNEL_DIR / "cupy_ops.py").read_text()
    pairs = set()
    for filename, name in re.findall(r'_kernel\(\s*"([\w.]+)",\s*f?"(\w+(?:\{suffix\})?)"\s*\)', text):
        for suffix in ("f32", "f64"):
            pairs.add((filename, name.replace("{suffix}", suffix)))
    return sorted(pairs)


def test_sources_exist():
    assert {path.name for path in SOURCES} == {"partition.cu", "hash_table.cu", "segment_combine.cu"}


@needs_nvcc
@pytest.mark.parametrize("source", SOURCES, ids=[path.name for path in SOURCES])
def test_source_compiles_with_nvcc(source, tmp_path):
    ptx = tmp_path / (source.stem + ".ptx")
    result = subprocess.run(
        [NVCC, "--ptx", "-arch=sm_80", "--std=c++17", "-Werror", "all-warnings", "-o", str(ptx), str(source)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    entries = set(re.findall(r"\.entry\s+(\w+)", ptx.read_text()))
    wanted = {name for filename, name in _launched_kernels() if filename == source.name}
    assert wanted, f"cupy_ops launches nothing from {source.name}"
    assert wanted <= entries, f"kernels missing from {source.name}: {sorted(wanted - entries)}"


def test_cupy_ops_only_loads_shipped_sources():
    launched = {filename for filename, _ in _launched_kernels()}
    assert launched == {path.name for path in SOURCES}


def test_sources_are_package_data(repo_root):
    config = configparser.ConfigParser()
    config.read(repo_root / "setup.cfg")
    patterns = config["options.package_data"]["collective.kernels"].split()
    for source in SOURCES:
        assert any(fnmatch.fnmatch(source.name, pattern) for pattern in patterns), source.name
    includes = config["options.packages.find"]["include"].split()
    assert any(fnmatch.fnmatch("collective.kernels", pattern) for pattern in includes)
    assert (kernels.KERNEL_DIR / "__init__.py").exists()


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed here")
def test_without_cupy_the_wrappers_say_to_install_the_gpu_extra():
    assert kernels.kernels_available() is False
    with pytest.raises(ImportError, match=r"install the gpu extra"):
        cupy_ops.unique([1, 2])
    with pytest.raises(ImportError, match=r"collective\[gpu\]"):
        cupy_ops.HashTable(4)


@pytest.fixture
def numpy_as_cupy(monkeypatch):
    """cupy_ops with numpy standing in for CuPy: runs the host-side logic that launches no kernel."""
    import numpy

    monkeypatch.setattr(cupy_ops, "_cupy", lambda: numpy)
    return numpy


@pytest.mark.parametrize("num_buckets", [1, 3, 8])
def test_sort_partition_baseline_matches_reference(numpy_as_cupy, num_buckets):
    ids = numpy_as_cupy.array([5, -3, 2, 7, 4, -(2**63), 2**63 - 1, 0, 5, -8], dtype=numpy_as_cupy.int64)
    expected = kernels.partition(ids, num_buckets)
    for got, want in zip(cupy_ops.partition_by_sort(ids, num_buckets), expected):
        assert got.tolist() == want.tolist()


def test_wrappers_handle_empty_input_without_launching(numpy_as_cupy):
    empty = numpy_as_cupy.zeros(0, dtype=numpy_as_cupy.int64)
    bucketed, counts, restore = cupy_ops.partition(empty, 3)
    assert bucketed.shape == restore.shape == (0,) and counts.tolist() == [0, 0, 0]
    assert all(part.shape == (0,) for part in cupy_ops.unique(empty))
    table = cupy_ops.HashTable(5, 0.5)
    assert table.num_slots == 16 and table.capacity == 5
    assert table.find(empty).shape == (0,) and table.insert_or_find(empty).shape == (0,)
    assert table.export()[0].shape == (0,)
    out = cupy_ops.segment_combine(numpy_as_cupy.zeros((0, 4), "float32"), empty, 3, combiner="mean")
    assert out.shape == (3, 4) and out.dtype == numpy_as_cupy.float32 and not out.any()
    assert cupy_ops.segment_combine_grad(numpy_as_cupy.ones((3, 4)), empty).shape == (0, 4)
