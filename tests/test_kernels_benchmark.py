"""benchmarks.kernels runs on GPU machines only; elsewhere it explains itself and exits."""

import importlib.util

import pytest

from benchmarks import kernels as bench


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed here")
def test_without_cupy_it_exits_with_a_clear_message(capsys, tmp_path):
    assert bench.main(["--sizes", "1e4", "--json", str(tmp_path / "out.json")]) == 2
    assert "install the gpu extra" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


def test_table_formats_rows():
    rows = [
        {"op": "unique", "impl": "collective", "keys": 10**7, "seconds": 0.002, "keys_per_s": 5e9,
         "min_bytes": 1, "bandwidth_fraction": 0.5},
        {"op": "unique", "impl": "cupy.unique", "keys": 10**7, "seconds": 0.01, "keys_per_s": 1e9,
         "min_bytes": 1, "bandwidth_fraction": None},
    ]
    text = bench.format_table(rows)
    assert "50.0%" in text and "n/a" in text and "cupy.unique" in text


def test_default_sizes_span_1e4_to_1e8():
    args = bench.parse_args([])
    assert bench.DEFAULT_SIZES[0] == 10**4 and bench.DEFAULT_SIZES[-1] == 10**8 and args.max_keys == 1e8
