"""``python -m collective.demo`` at a tiny size, run once: it ends with its table and the paths of the PNGs
it wrote, shows no TensorFlow noise, and each run's metrics.json holds the training loss of every step, as
the progress lines print it (the mean over the global batch), the same for hb and sok."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

RUNS = ("plain", "hb", "sok")
STEPS, LOG_EVERY = 6, 2
PROGRESS = re.compile(r"train:.*\| (\d+)/(\d+) \[.*loss=([-+.\deE]+)")
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def demo(tmp_path_factory, repo_root):
    """(output directory, the demo's stdout and stderr together)."""
    root = tmp_path_factory.mktemp("demo")
    env = dict(os.environ, COLLECTIVE_MODELZOO_CACHE=str(root / "cache"), CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # conftest sets it; the demo must quiet TensorFlow itself
    cmd = [sys.executable, "-m", "collective.demo", "--workers", "2", "--steps", str(STEPS), "--batch_size", "64",
           "--rows", "1024", "--eval_rows", "512", "--log_every", str(LOG_EVERY), "--out", str(root / "out"),
           "--report_dir", str(root / "report")]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=800, env=env,
                          cwd=repo_root)
    assert proc.returncode == 0, proc.stdout[-12000:]
    return root, proc.stdout


def test_output_ends_with_the_table_and_the_paths_of_valid_pngs(demo):
    import matplotlib.image

    root, output = demo
    lines = output.rstrip().splitlines()
    paths = [line.strip() for line in lines[-3:]]
    assert lines[-4] == f"plots in {root / 'report'}:"
    assert [line.split()[0] for line in lines[-8:-5]] == list(RUNS) and lines[-9].startswith("run ")
    assert [os.path.basename(p) for p in paths] == ["loss.png", "samples_per_sec.png", "bytes_per_sample.png"]
    for path in paths:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n", path
        height, width, channels = matplotlib.image.imread(path).shape
        assert height >= 200 and width >= 400 and channels in (3, 4), path


def test_tensorflow_is_quiet(demo):
    _, output = demo
    warnings = [line for line in output.splitlines() if "warn" in line.lower()]
    assert len(warnings) <= 5, "\n".join(warnings)  # the limit for a whole `make demo`
    assert "Fingerprint not found" not in output
    assert not re.search(r"^(\[\d\] )?\S+ \S+: [IW] tensorflow/", output, flags=re.M), "TensorFlow's C++ INFO lines"


def _progress_by_run(output):
    """``{run: [(step, total, loss)]}`` from the progress lines, split at the demo's "running" lines."""
    runs, found = iter(RUNS), {}
    current = None
    for line in output.splitlines():
        if "collective.demo: running " in line:
            current = next(runs)
            found[current] = []
        elif (match := PROGRESS.search(line)) and current is not None:
            found[current].append((int(match[1]), int(match[2]), float(match[3])))
    return found


def test_metrics_json_has_the_loss_of_every_step_that_the_progress_lines_print(demo):
    root, output = demo
    progress = _progress_by_run(output)
    assert list(progress) == list(RUNS)
    for run in RUNS:
        with open(root / "out" / f"dlrm-{run}" / "metrics.json") as f:
            curve = json.load(f)["loss_curve"]
        assert curve["steps"] == list(range(1, STEPS + 1)), run
        printed = progress[run]
        assert [(s, total) for s, total, _ in printed] == [(s, STEPS) for s in range(LOG_EVERY, STEPS + 1, LOG_EVERY)]
        for step, _, loss in printed:
            assert loss == pytest.approx(curve["losses"][step - 1], rel=1e-5), (run, step)


def test_hb_sok_and_plain_tensorflow_train_the_same_loss_curve(demo):
    """Row groups of batch / N rows, read round-robin: step s of the 2 workers reads the rows one process reads
    at step s, so the mean loss of every step agrees with plain TensorFlow's."""
    root, _ = demo
    curves = {}
    for run in RUNS:
        with open(root / "out" / f"dlrm-{run}" / "metrics.json") as f:
            curves[run] = np.array(json.load(f)["loss_curve"]["losses"])
    assert np.std(curves["hb"]) > 1e-4, "the loss moved"
    np.testing.assert_allclose(curves["sok"], curves["hb"], rtol=1e-4)
    np.testing.assert_allclose(curves["plain"], curves["hb"], rtol=1e-4)



def test_each_backend_run_shows_its_sharding_plan_once_before_training(demo):
    """Issue 43: rank 0 of each backend's run logs the plan table (one block: DLRM's 26 tables) before step 0;
    the plain run has none."""
    _, output = demo
    runs = {}
    for line in output.splitlines():
        if "collective.demo: running " in line:
            runs[RUNS[len(runs)]] = []
        elif runs:
            runs[list(runs)[-1]].append(line)
    for run, lines in runs.items():
        plans = [i for i, line in enumerate(lines) if "collective.sharding: sharding plan:" in line]
        if run == "plain":
            assert not plans
            continue
        first_step = next(i for i, line in enumerate(lines) if PROGRESS.search(line))
        assert len(plans) == 1 and plans[0] < first_step, (run, plans, first_step)
        assert re.search(r"^\[0\] .*sharding plan: 26 table\(s\) on 2 worker\(s\)", lines[plans[0]]), lines[plans[0]]
        assert lines[plans[0] + 1].split()[1:3] == ["table", "rows"], lines[plans[0] + 1]
