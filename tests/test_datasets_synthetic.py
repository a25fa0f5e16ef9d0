"""datasets.synthetic: deterministic, Criteo-shaped, skewed, and its labels are learnable."""

import numpy as np
import pyarrow.parquet as pq

from datasets import schema
from datasets.synthetic import Teacher, cardinalities, generate, generate_table


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC as the Mann-Whitney statistic, with ties counted half (numpy reference)."""
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(len(scores), dtype=np.float64)
    # Average ranks over runs of tied scores.
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_scores)) + 1]
    ends = np.r_[starts[1:], len(scores)]
    for s, e in zip(starts, ends):
        ranks[order[s:e]] = (s + e + 1) / 2.0
    pos = labels == 1
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def test_auc_reference():
    assert auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8])) == 0.75
    assert auc(np.array([0, 1]), np.array([0.5, 0.5])) == 0.5


def test_schema_and_ranges():
    table = generate_table(5000, scale=0.001, seed=3)
    assert table.schema.equals(schema.arrow_schema())
    assert table.column_names == list(schema.COLUMNS)
    sizes = cardinalities(0.001)
    assert sizes[2] == 10131 and sizes[8] == 3  # C3 scaled, C9 kept at its real size 3
    for name, size in zip(schema.CATEGORICAL, sizes):
        ids = table.column(name).to_numpy()
        assert ids.min() >= 0 and ids.max() < size
    labels = table.column("label").to_numpy()
    assert set(np.unique(labels)) == {0.0, 1.0}
    assert 0.18 < labels.mean() < 0.32
    dense = np.stack([table.column(n).to_numpy() for n in schema.DENSE])
    assert dense.min() == 0.0 and np.all(np.isfinite(dense))
    # log(count + 1) of whole counts
    np.testing.assert_allclose(np.expm1(dense), np.round(np.expm1(dense)), atol=2e-3 * np.expm1(dense).max())


def test_ids_are_zipf_skewed():
    ids = generate_table(50000, scale=0.01, seed=0).column("C3").to_numpy()
    _, counts = np.unique(ids, return_counts=True)
    counts = np.sort(counts)[::-1]
    # The hottest id is far above uniform, and the top 1% of ids hold a large share of rows.
    assert counts[0] > 100 * len(ids) / cardinalities(0.01)[2]
    assert counts[: max(1, len(counts) // 100)].sum() > 0.3 * len(ids)


def test_deterministic_and_seeded(tmp_path):
    a = generate_table(3000, seed=7)
    assert a.equals(generate_table(3000, seed=7))
    assert not a.equals(generate_table(3000, seed=8))
    paths1 = generate(str(tmp_path / "a"), 10000, files=3, seed=1, row_group_size=1024)
    paths2 = generate(str(tmp_path / "b"), 10000, files=3, seed=1, row_group_size=1024)
    assert [pq.ParquetFile(p).metadata.num_rows for p in paths1] == [3334, 3333, 3333]
    assert pq.ParquetFile(paths1[0]).metadata.num_row_groups == 4
    for p, q in zip(paths1, paths2):
        assert pq.read_table(p).equals(pq.read_table(q))


def _design(table):
    """Dense features plus one-hot of every table with at most 64 ids."""
    parts = [np.stack([table.column(n).to_numpy() for n in schema.DENSE], axis=1)]
    for name, size in zip(schema.CATEGORICAL, cardinalities(0.01)):
        if size > 64:
            continue
        one_hot = np.zeros((table.num_rows, size), np.float32)
        one_hot[np.arange(table.num_rows), table.column(name).to_numpy()] = 1.0
        parts.append(one_hot)
    return np.concatenate(parts, axis=1).astype(np.float64)


def test_logistic_regression_learns_the_teacher():
    train, test = generate_table(20000, seed=1), generate_table(10000, seed=2)
    x, y = _design(train), train.column("label").to_numpy()
    xt, yt = _design(test), test.column("label").to_numpy()
    mean, std = x.mean(0), x.std(0) + 1e-6
    x, xt = (x - mean) / std, (xt - mean) / std
    w, b = np.zeros(x.shape[1]), 0.0
    for _ in range(150):  # full-batch gradient descent with a little L2
        p = 1 / (1 + np.exp(-(x @ w + b)))
        w -= 0.5 * (x.T @ (p - y) / len(y) + 1e-4 * w)
        b -= 0.5 * np.mean(p - y)
    learned = auc(yt, xt @ w + b)
    teacher = Teacher.create(0)
    assert 0.6 < learned
    # Training shows: a constant model is at 0.5, and nothing beats the teacher's own AUC by much.
    dense = np.stack([test.column(n).to_numpy() for n in schema.DENSE], axis=1)
    ids = [test.column(n).to_numpy() for n in schema.CATEGORICAL]
    best = auc(yt, teacher.logits(dense, ids, cardinalities(0.01)))
    assert learned < best + 0.01, (learned, best)
    print(f"logistic regression AUC {learned:.3f}, teacher AUC {best:.3f}")


def test_command_lines_have_help(tmp_path, repo_root):
    import subprocess
    import sys
    for module in ("datasets.synthetic", "datasets.movielens", "datasets.criteo"):
        proc = subprocess.run([sys.executable, "-m", module, "--help"], cwd=repo_root, capture_output=True, text=True)
        assert proc.returncode == 0 and "--out" in proc.stdout, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "datasets.synthetic", "--out", str(tmp_path), "--rows", "1000",
                           "--files", "2"], cwd=repo_root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert sum(pq.ParquetFile(p).metadata.num_rows for p in sorted(tmp_path.glob("*.parquet"))) == 1000
