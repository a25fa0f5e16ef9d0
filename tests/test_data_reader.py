"""collective.data: Parquet -> tf.data batches, errors, shuffling and sharding by worker."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

import collective.data as cd
from launcher import load_rank_results, run_workers


def write_files(directory, rows_per_file=(10, 7, 12), row_group_size=4):
    """Files whose column ``row`` numbers all rows 0..N-1; ``tags`` is a list of row % 3 copies of row."""
    paths, start = [], 0
    for i, n in enumerate(rows_per_file):
        row = np.arange(start, start + n, dtype=np.int64)
        table = pa.table({
            "row": row,
            "x": (row * 0.5).astype(np.float32),
            "label": (row % 2).astype(np.float32),
            "tags": pa.array([[int(r)] * int(r % 3) for r in row], pa.list_(pa.int64())),
        })
        path = directory / f"part-{i}.parquet"
        pq.write_table(table, path, row_group_size=row_group_size)
        paths.append(str(path))
        start += n
    return paths, start


def read_all(ds, key="row"):
    return np.concatenate([b[key].numpy() for b in ds])


def test_reads_every_row_in_order_with_values(tmp_path):
    paths, total = write_files(tmp_path)
    ds = cd.parquet_dataset(paths, batch_size=5, rank=0, world_size=1)
    batches = list(ds)
    assert [len(b["row"]) for b in batches] == [5] * 5 + [4]
    rows = read_all(batches)
    np.testing.assert_array_equal(rows, np.arange(total))
    np.testing.assert_allclose(np.concatenate([b["x"].numpy() for b in batches]), np.arange(total) * 0.5)
    assert batches[0]["row"].dtype == tf.int64 and batches[0]["x"].dtype == tf.float32
    tags = batches[0]["tags"]
    assert isinstance(tags, tf.RaggedTensor)
    assert tags.to_list() == [[0] * 0, [1], [2, 2], [], [4]]


def test_drop_remainder_label_fields_and_sparse(tmp_path):
    write_files(tmp_path)
    ds = cd.parquet_dataset(tmp_path, batch_size=5, fields=["row", "tags"], label="label", rank=0,
                            world_size=1, drop_remainder=True, list_format="sparse")
    assert ds.element_spec[1].shape.as_list() == [5]
    batches = list(ds)
    assert len(batches) == 5
    features, labels = batches[1]
    assert set(features) == {"row", "tags"}
    np.testing.assert_array_equal(labels.numpy(), features["row"].numpy() % 2)
    sparse = features["tags"]
    assert isinstance(sparse, tf.SparseTensor)
    np.testing.assert_array_equal(tf.sparse.to_dense(sparse).numpy()[:, :2],
                                  [[5, 5], [0, 0], [7, 0], [8, 8], [0, 0]])


def test_shuffle_is_seeded_and_keeps_every_row(tmp_path):
    paths, total = write_files(tmp_path)
    def order(seed):
        return read_all(cd.parquet_dataset(paths, 4, rank=0, world_size=1, shuffle_buffer=8, seed=seed))
    a, b, c = order(1), order(1), order(2)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c) and not np.array_equal(a, np.arange(total))
    np.testing.assert_array_equal(np.sort(a), np.arange(total))


def test_epochs_repeat(tmp_path):
    paths, total = write_files(tmp_path)
    rows = read_all(cd.parquet_dataset(paths, 6, rank=0, world_size=1, num_epochs=2))
    np.testing.assert_array_equal(rows, np.concatenate([np.arange(total)] * 2))


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("shard_by", ["auto", "file", "row_group", "rows"])
def test_shards_are_disjoint_and_cover_everything(tmp_path, world_size, shard_by):
    paths, total = write_files(tmp_path)
    shares = [read_all(cd.parquet_dataset(paths, 3, fields=["row"], rank=r, world_size=world_size,
                                          shard_by=shard_by))
              if cd.count_rows(paths, rank=r, world_size=world_size, shard_by=shard_by) else np.zeros(0, np.int64)
              for r in range(world_size)]
    joined = np.concatenate(shares)
    assert len(np.unique(joined)) == len(joined) == total
    np.testing.assert_array_equal(np.sort(joined), np.arange(total))
    assert sum(cd.count_rows(paths, rank=r, world_size=world_size, shard_by=shard_by)
               for r in range(world_size)) == total


def _pieces(paths, rank, world_size, shard_by="auto"):
    return [(p.path, p.row_group, p.first_row, p.num_rows)
            for p in cd.shard_of(paths, rank=rank, world_size=world_size, shard_by=shard_by)]


def test_sharding_modes_follow_files_then_balanced_row_ranges(tmp_path):
    paths, _ = write_files(tmp_path, rows_per_file=(8, 8), row_group_size=4)
    # Two files for two workers: whole files.
    assert _pieces(paths, 1, 2) == [(paths[1], 0, 0, 4), (paths[1], 1, 0, 4)]
    # Two files (16 rows) for three workers: rows 0-4, 5-9, 10-15, cut inside row groups.
    assert _pieces(paths, 0, 3) == [(paths[0], 0, 0, 4), (paths[0], 1, 0, 1)]
    assert _pieces(paths, 1, 3) == [(paths[0], 1, 1, 3), (paths[1], 0, 0, 2)]
    assert _pieces(paths, 2, 3) == [(paths[1], 0, 2, 2), (paths[1], 1, 0, 4)]
    # Whole row groups round-robin in file order, when asked for.
    assert _pieces(paths, 0, 3, "row_group") == [(paths[0], 0, 0, 4), (paths[1], 1, 0, 4)]


@pytest.mark.parametrize("world_size", [2, 3])
def test_auto_keeps_one_processs_batches_when_row_groups_are_plentiful(tmp_path, world_size):
    """Row groups of batch / N rows round-robin: N workers' step s holds the rows one process reads at step s."""
    per_worker = 4
    paths, total = write_files(tmp_path, rows_per_file=(per_worker * world_size * 5,), row_group_size=per_worker)
    assert _pieces(paths, 1, world_size) == _pieces(paths, 1, world_size, "row_group")
    shares = [list(cd.parquet_dataset(paths, per_worker, fields=["row"], rank=r, world_size=world_size))
              for r in range(world_size)]
    one_process = read_all(cd.parquet_dataset(paths, per_worker * world_size, fields=["row"], rank=0, world_size=1))
    steps = [np.concatenate([shares[r][s]["row"].numpy() for r in range(world_size)]) for s in range(5)]
    np.testing.assert_array_equal(np.concatenate(steps), one_process)


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("rows_per_file", [(50,), (50, 7, 1)], ids=["1file", "3files"])
def test_one_row_group_per_file_gives_every_worker_a_balanced_contiguous_share(tmp_path, world_size, rows_per_file):
    """Files written as pandas and Spark write them (one row group each) on more workers than row groups."""
    paths, total = write_files(tmp_path, rows_per_file=rows_per_file, row_group_size=64)
    shares = [read_all(cd.parquet_dataset(paths, 3, fields=["row"], rank=r, world_size=world_size))
              for r in range(world_size)]
    sizes = [len(share) for share in shares]
    assert max(sizes) - min(sizes) <= 1, sizes
    assert sizes == [cd.count_rows(paths, rank=r, world_size=world_size) for r in range(world_size)]
    np.testing.assert_array_equal(np.concatenate(shares), np.arange(total))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_sharding_through_launched_workers(tmp_path, n):
    data = tmp_path / "data"
    data.mkdir()
    _, total = write_files(data)  # three files of 10, 7 and 12 rows in row groups of 4: uneven shares for n = 2, 3
    out = tmp_path / "out"
    out.mkdir()
    run_workers("data_shard_worker.py", n, [data, out, "auto"], timeout=120)
    results = load_rank_results(out, n)
    assert [int(r["world_size"]) for r in results] == [n] * n
    shares = [r["rows"] for r in results]
    assert all(len(s) for s in shares)
    joined = np.concatenate(shares)
    assert len(joined) == total
    np.testing.assert_array_equal(np.sort(joined), np.arange(total))


def test_missing_file_is_named(tmp_path):
    paths, _ = write_files(tmp_path)
    with pytest.raises(cd.DataError, match="nope.parquet.*does not exist"):
        cd.parquet_dataset(paths + [str(tmp_path / "nope.parquet")], 4, rank=0, world_size=1)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(cd.DataError, match="no \\*.parquet files"):
        cd.parquet_dataset(empty, 4, rank=0, world_size=1)


def test_missing_column_is_named(tmp_path):
    paths, _ = write_files(tmp_path)
    with pytest.raises(cd.DataError, match="'clicks' not found in .*part-0.parquet.*it has: row, x, label, tags"):
        cd.parquet_dataset(paths, 4, fields=["row", "clicks"], rank=0, world_size=1)
    with pytest.raises(cd.DataError, match="label column 'y' not found"):
        cd.parquet_dataset(paths, 4, label="y", rank=0, world_size=1)


def test_schema_differing_between_files_is_named(tmp_path):
    paths, _ = write_files(tmp_path)
    pq.write_table(pa.table({"row": np.arange(3, dtype=np.float64), "x": np.zeros(3, np.float32),
                             "label": np.zeros(3, np.float32),
                             "tags": pa.array([[1]] * 3, pa.list_(pa.int64()))}), tmp_path / "part-9.parquet")
    with pytest.raises(cd.DataError, match="column 'row' is double in .*part-9.parquet.* but int64 in .*part-0"):
        cd.parquet_dataset(tmp_path, 4, rank=0, world_size=1)


def test_nulls_are_an_error_naming_file_and_column(tmp_path):
    pq.write_table(pa.table({"a": pa.array([1, None, 3], pa.int64())}), tmp_path / "n.parquet")
    with pytest.raises(cd.DataError, match="column 'a' in .*n.parquet.*1 null"):
        list(cd.iterate_batches(cd.plan(tmp_path, rank=0, world_size=1)[0], ["a"], 2))


def test_bad_rank_is_refused(tmp_path):
    paths, _ = write_files(tmp_path)
    with pytest.raises(cd.DataError, match="rank 3 does not fit world size 3"):
        cd.parquet_dataset(paths, 4, rank=3, world_size=3)


def test_hybridbackend_names_in_graph_mode(tmp_path):
    paths, total = write_files(tmp_path, rows_per_file=(6,))
    with tf.Graph().as_default():
        ds = cd.ParquetDataset(paths[0], batch_size=4, fields=["row", "label"],
                               partition_count=1, partition_index=0)
        batch = cd.make_iterator(ds.prefetch(2)).get_next()
        assert set(batch) == {"row", "label"}
        with tf.compat.v1.train.MonitoredTrainingSession() as sess:
            first = sess.run(batch)
            second = sess.run(batch)
            assert sess.should_stop() is False
            with pytest.raises(tf.errors.OutOfRangeError):
                sess.run(batch)
    np.testing.assert_array_equal(first["row"], [0, 1, 2, 3])
    np.testing.assert_array_equal(second["row"], [4, 5])


def test_each_worker_logs_its_own_share_only(tmp_path, caplog):
    """Regression: counting every rank's rows (the model zoo does) logged "worker 1/2 reads ..." on rank 0."""
    files, _ = write_files(tmp_path)
    with caplog.at_level("DEBUG", logger="collective.data"):
        for r in range(2):
            cd.plan(files, [], rank=r, world_size=2)
    shares = [rec for rec in caplog.records if "reads" in rec.getMessage()]
    assert [(rec.levelname, rec.getMessage().split()[1]) for rec in shares] == [("INFO", "0/2"), ("DEBUG", "1/2")]
