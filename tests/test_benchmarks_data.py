"""benchmarks.data's reader measurement, as the benchmark report calls it: a child process pinned to one core."""

import os
import statistics

from benchmarks import data


def test_measure_pinned_reads_every_row_on_the_one_core_it_was_given():
    cpu = max(os.sched_getaffinity(0))
    result = data.measure_pinned(rows=20_000, worker_batch=4096, repeats=2, cpu=cpu)
    assert result["cpus"] == [cpu]
    # Every path read the same rows (measure_reader checks) and all of them: 4 files of 5,000.
    assert (result["rows"], result["batch"], result["columns"]) == (20_000, 4096, 40)
    assert len(result["repeats"]) == 2
    for path in ("tf_data", "tf_data_eager", "numpy"):
        assert result[f"{path}_rows_per_s"] == statistics.median(r[path] for r in result["repeats"]) > 0
        assert result["cpu_rows_per_s"][path] > 0
