"""The online-training benchmark (benchmarks.online) on a tiny configuration, one worker, in this process:
each delta holds exactly the rows the interval touched (a numpy count), the served version's rows equal the
trained model's, and the report states both goals."""

import json

import numpy as np
import pytest

from benchmarks import online, online_report
from datasets.synthetic import cardinalities

pytestmark = pytest.mark.timeout(600)
# Three tables (C1..C3: 16, 16 and 10131 rows): the graph of 26 takes a minute to build on 2 loaded cores.
CONFIG = {"name": "tiny", "description": "a test", "scale": 0.001, "tables": 3, "dim": 4, "touched": 0.01,
          "deltas": 2, "repeats": 1, "workers": [1], "seed": 3}


def test_tiny_run_counts_the_touched_rows_and_serves_the_trained_rows(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    online.worker(str(work), CONFIG)
    rank = json.loads((work / "rank0.json").read_text())
    touched = sum(max(1, int(round(size * CONFIG["touched"]))) for size in cardinalities(CONFIG["scale"])[:3])
    assert [interval["delta_rows"] for interval in rank["intervals"]] == [touched] * CONFIG["deltas"]
    assert rank["chain_deltas"] == CONFIG["deltas"] and rank["served_max_abs_diff"] == 0.0
    run = online.summarize([rank])
    assert 0 < run["median"]["delta_bytes"] < run["full_save_bytes"] / 10
    assert 0 < run["median"]["update_bytes"] < run["median"]["delta_bytes"]  # values and keys only, no slots
    assert run["median"]["ready_s"] == pytest.approx(np.median([i["ready_s"] for i in rank["intervals"]]))
    out = tmp_path / "report"
    out.mkdir()
    (out / online.FILE).write_text(json.dumps({"config": CONFIG, "machine": _machine(), "runs": [run]}))
    report = open(online_report.write(str(out))).read()
    for text in ("goal: new version in < 10 s", "goal: delta save <= 2 x touched bytes / bandwidth",
                 "restore: base + 2 deltas (s)", "![online.png](online.png)"):
        assert text in report, report
    assert (out / "online.png").stat().st_size > 0 and (out / "intervals.png").stat().st_size > 0


def _machine():
    from benchmarks import machine  # pylint: disable=import-outside-toplevel

    return machine.describe()
