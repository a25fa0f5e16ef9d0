"""collective.data batches against a reference built from the whole files with pyarrow.

Batches are views into each Arrow chunk and joined only where they span two
chunks (row groups, or a shuffle window's rest and the next row group); the
layouts below give batches of both kinds, list columns included.
"""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

import collective.data as cd

BATCH_SIZES = [1, 3, 4, 5, 8, 64]


def write_layout(directory):
    """Files of 10, 7, 12 and 13 rows in row groups of 4, 3, 5 and 13 rows; ``tags`` holds row % 3 ids, some null."""
    paths, start, tables = [], 0, []
    for i, (rows, group) in enumerate([(10, 4), (7, 3), (12, 5), (13, 13)]):
        row = np.arange(start, start + rows, dtype=np.int64)
        tags = [None if r % 5 == 4 else [int(r) * 10 + k for k in range(int(r % 3))] for r in row]
        table = pa.table({"row": row, "x": (row * 0.25).astype(np.float32),
                          "label": (row % 2).astype(np.float32), "tags": pa.array(tags, pa.list_(pa.int64()))})
        path = str(directory / f"part-{i}.parquet")
        pq.write_table(table, path, row_group_size=group)
        paths.append(path)
        tables.append(table)
        start += rows
    return paths, pa.concat_tables(tables)


def reference_batches(table, batch_size, drop_remainder):
    """Rows in file order cut into batches, list columns as Python lists (a null list is empty)."""
    cuts = range(0, table.num_rows - (table.num_rows % batch_size if drop_remainder else 0), batch_size)
    return [{"row": table["row"].to_numpy()[s:s + batch_size], "x": table["x"].to_numpy()[s:s + batch_size],
             "label": table["label"].to_numpy()[s:s + batch_size],
             "tags": [t or [] for t in table["tags"].to_pylist()[s:s + batch_size]]} for s in cuts]


def as_lists(values, splits):
    return [values[splits[i]:splits[i + 1]].tolist() for i in range(len(splits) - 1)]


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_numpy_batches_equal_the_files_cut_in_order(tmp_path, drop_remainder):
    paths, table = write_layout(tmp_path)
    pieces, _ = cd.plan(paths, rank=0, world_size=1)
    for batch_size in BATCH_SIZES:
        got = list(cd.iterate_batches(pieces, ["row", "x", "label", "tags"], batch_size,
                                      drop_remainder=drop_remainder))
        want = reference_batches(table, batch_size, drop_remainder)
        assert len(got) == len(want), batch_size
        for g, w in zip(got, want):
            for name in ("row", "x", "label"):
                np.testing.assert_array_equal(g[name], w[name], err_msg=f"{name} at batch_size {batch_size}")
            values, splits = g["tags"]
            assert splits[0] == 0 and splits[-1] == len(values), batch_size
            assert as_lists(values, splits) == w["tags"], batch_size


def test_tf_batches_equal_the_numpy_batches_with_labels_lists_and_shuffle(tmp_path):
    """The tf.data pipeline delivers iterate_batches' batches, in their order, in every output structure."""
    paths, table = write_layout(tmp_path)
    pieces, _ = cd.plan(paths, rank=0, world_size=1)
    columns = ["row", "x", "label", "tags"]
    for batch_size, shuffle_buffer in [(5, 0), (4, 0), (3, 11), (8, 16)]:
        kwargs = dict(shuffle_buffer=shuffle_buffer, seed=7, num_epochs=2)
        want = list(cd.iterate_batches(pieces, columns, batch_size, **kwargs))
        plain = list(cd.parquet_dataset(paths, batch_size, rank=0, world_size=1, **kwargs))
        labelled = list(cd.parquet_dataset(paths, batch_size, fields=["row", "x"], label=["label", "tags"],
                                           rank=0, world_size=1, list_format="sparse", **kwargs))
        assert len(plain) == len(labelled) == len(want), batch_size
        for w, p, (features, (label, tags)) in zip(want, plain, labelled):
            assert set(p) == set(columns) and set(features) == {"row", "x"}
            for name in ("row", "x", "label"):
                np.testing.assert_array_equal(p[name].numpy(), w[name])
            np.testing.assert_array_equal(features["row"].numpy(), w["row"])
            np.testing.assert_array_equal(label.numpy(), w["label"])
            assert isinstance(p["tags"], tf.RaggedTensor) and isinstance(tags, tf.SparseTensor)
            assert p["tags"].to_list() == as_lists(*w["tags"])
            assert tf.RaggedTensor.from_sparse(tags).to_list() == as_lists(*w["tags"])
        rows = np.concatenate([b["row"] for b in want])
        np.testing.assert_array_equal(np.sort(rows), np.sort(np.tile(table["row"].to_numpy(), 2)))
