"""datasets.criteo: TSV -> Parquet with missing values, malformed rows, vocabularies and hashing."""

import gzip
import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from datasets import schema
from datasets.criteo import Vocabulary, convert, convert_dataset, hex_values

import pyarrow as pa


def line(label, ints, cats):
    """One Criteo line: label, 13 integers and 26 hex values ('' for missing)."""
    ints = list(ints) + [""] * (13 - len(ints))
    cats = list(cats) + [""] * (26 - len(cats))
    return "\t".join([str(label)] + [str(i) for i in ints] + cats)


GOOD = [
    line(1, [5, "", -3, 0], ["68fd1e64", "80e26c9b"]),            # line 1
    line(0, [2], ["68fd1e64", ""]),                              # line 2: missing values
    "0\t1\t2",                                                   # line 3: 3 fields
    "",                                                          # line 4: empty line
    line(1, ["x"], []),                                          # line 5: not an integer
    line(2, [1], []),                                            # line 6: label 2
    line(0, [], ["zz12"]),                                       # line 7: not hex
    line(0, [7, 8], ["05db9164", "80e26c9b", "", "a"]),          # line 8
    line(1, [], ["68fd1e64"]) + "\textra",                       # line 9: 41 fields
    line(0, [0] * 13, ["68fd1e64"] * 26),                        # line 10
]
KEPT_LINES = [1, 2, 8, 10]
REJECTED = {3: "fields", 4: "label", 5: "I1", 6: "label", 7: "C1", 9: "fields"}


def write_tsv(path, lines, gz=False):
    text = "\n".join(lines) + "\n"
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return str(path)


def test_hex_values():
    values, present = hex_values(pa.array(["68fd1e64", "", "a", "FFFFFFFFFFFFFFFF", "0"]))
    assert values.tolist() == [0x68FD1E64, 0, 10, 2 ** 64 - 1, 0]
    assert present.tolist() == [True, False, True, True, True]


def test_converts_values_and_rejects_malformed_rows(tmp_path):
    src = write_tsv(tmp_path / "day_0", GOOD)
    summary = convert(src, str(tmp_path / "out"), progress=False)
    assert summary.rows_written == 4 and summary.rows_rejected == 6
    assert [r.line for r in summary.rejected] == sorted(REJECTED)
    for r in summary.rejected:
        assert r.path == src and REJECTED[r.line] in r.reason
    assert "I1='x' is not an integer" in summary.rejected[2].reason
    table = pq.read_table(summary.files[0])
    assert table.schema.equals(schema.arrow_schema())
    assert table.column("label").to_pylist() == [1, 0, 0, 0]
    np.testing.assert_allclose(table.column("I1").to_numpy(), np.log1p([5, 2, 7, 0]), rtol=1e-6)
    np.testing.assert_allclose(table.column("I2").to_numpy(), np.log1p([0, 0, 8, 0]), rtol=1e-6)
    np.testing.assert_allclose(table.column("I3").to_numpy(), [0, 0, 0, 0])  # -3 clipped, missing 0
    # Frequency order: 68fd1e64 appears 3 times in C1 -> id 1, 05db9164 once -> id 2; missing -> 0.
    assert table.column("C1").to_pylist() == [1, 1, 2, 1]
    assert table.column("C2").to_pylist() == [1, 0, 1, 2]   # 80e26c9b twice, 68fd1e64 once
    assert table.column("C4").to_pylist() == [0, 0, 1, 2]   # a tie (once each): smaller value first
    assert table.column("C26").to_pylist() == [0, 0, 0, 1]
    assert summary.table_sizes[:4] == [3, 3, 2, 3]
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["rows_rejected"] == 6 and meta["cardinalities"] == summary.table_sizes and meta["rows"] == 4
    assert schema.read_meta(str(tmp_path / "out"))["cardinalities"][0] == 3
    vocab = Vocabulary.load(summary.vocabulary_path)
    keys, ids, counts = vocab.tables["C1"]
    assert dict(zip(keys.tolist(), ids.tolist())) == {0x68FD1E64: 1, 0x05DB9164: 2}
    assert counts.tolist() == [1, 3]


def test_many_gzip_files_thresholds_and_small_output_files(tmp_path):
    a = write_tsv(tmp_path / "a.gz", GOOD[:2], gz=True)
    b = write_tsv(tmp_path / "b.gz", GOOD[7:], gz=True)
    summary = convert([a, b], str(tmp_path / "out"), min_count=2, rows_per_file=3, row_group_size=2,
                      progress=False)
    assert summary.rows_written == 4 and summary.rows_rejected == 1  # line 2 of b has 41 fields
    assert (summary.rejected[0].path, summary.rejected[0].line) == (b, 2)
    assert [pq.ParquetFile(f).metadata.num_rows for f in summary.files] == [3, 1]
    table = pq.read_table(summary.files)
    assert table.column("C1").to_pylist() == [1, 1, 0, 1]   # 05db9164 is below min_count 2
    assert table.column("C4").to_pylist() == [0, 0, 0, 0]
    assert summary.table_sizes[:3] == [2, 2, 1]   # C2: 80e26c9b twice; C3: nothing twice


def test_hashing_and_reusing_a_vocabulary(tmp_path):
    src = write_tsv(tmp_path / "train.txt", GOOD)
    hashed = convert(src, str(tmp_path / "h"), hash_buckets=11, progress=False)
    table = pq.read_table(hashed.files[0])
    assert table.column("C1").to_pylist() == [1 + 0x68FD1E64 % 10, 1 + 0x68FD1E64 % 10, 1 + 0x05DB9164 % 10,
                                              1 + 0x68FD1E64 % 10]
    assert hashed.table_sizes == [11] * 26 and hashed.vocabulary_path is None
    first = convert(src, str(tmp_path / "v1"), progress=False)
    test_day = write_tsv(tmp_path / "test.txt", [line(0, [], ["05db9164", "deadbeef"])])
    again = convert(test_day, str(tmp_path / "v2"), vocabulary=first.vocabulary_path, progress=False)
    assert pq.read_table(again.files[0]).select(["C1", "C2"]).to_pylist() == [{"C1": 2, "C2": 0}]


def test_missing_input_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothere.tsv"):
        convert(str(tmp_path / "nothere.tsv"), str(tmp_path / "out"), progress=False)


def _ids(tsv_lines):
    """Rows with C1 = the row number as hex, so a Parquet row says which input row it came from."""
    return [line(i % 2, [i], [format(0x1000 + i, "x")]) for i in tsv_lines]


def test_dataset_layout_with_the_last_fraction_as_test_split(tmp_path):
    src = write_tsv(tmp_path / "train.txt", _ids(range(20)) + ["broken"])
    summary = convert_dataset(src, str(tmp_path / "out"), test_fraction=0.25, rows_per_file=4, row_group_size=2,
                              progress=False)
    out = tmp_path / "out"
    train, test = (pq.read_table(sorted(str(p) for p in (out / split).glob("*.parquet"))) for split in ("train", "test"))
    # Ids are by frequency, ties by value: row i's C1 value is the (i + 1)-th smallest, id i + 1.
    assert train.column("C1").to_pylist() == list(range(1, 16))
    assert test.column("C1").to_pylist() == list(range(16, 21))
    meta = schema.read_meta(str(out))
    assert meta["cardinalities"] == summary.table_sizes and meta["cardinalities"][0] == 21
    assert (meta["train_rows"], meta["test_rows"], meta["rows_rejected"]) == (15, 5, 1)
    assert meta["vocabulary"] == "vocabulary.arrow" and (out / "vocabulary.arrow").is_file()
    assert [pq.ParquetFile(out / f).metadata.num_rows for f in meta["files"]] == [4, 4, 4, 3, 4, 1]


def test_terabyte_day_files_make_the_last_day_the_test_split(tmp_path, repo_root):
    days = [write_tsv(tmp_path / f"day_{d}.gz", _ids(range(d * 5, d * 5 + 5)), gz=True) for d in (0, 1, 2)]
    proc = subprocess.run([sys.executable, "-m", "datasets.criteo", days[2], days[0], days[1], "--out",
                           str(tmp_path / "out"), "--hash_buckets", "1000"], cwd=repo_root, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"test split: {days[2]}" in proc.stdout and "converting" in proc.stderr  # the progress bar
    meta = schema.read_meta(str(tmp_path / "out"))
    assert (meta["train_rows"], meta["test_rows"], meta["cardinalities"][0]) == (10, 5, 1000)
    test = pq.read_table(str(tmp_path / "out" / "test"))
    np.testing.assert_allclose(test.column("I1").to_numpy(), np.log1p(np.arange(10, 15)), rtol=1e-6)


def test_missing_or_wrong_meta_is_named(tmp_path):
    with pytest.raises(schema.MetaError, match="meta.json does not exist.*python -m datasets.criteo"):
        schema.read_meta(str(tmp_path))
    (tmp_path / "meta.json").write_text(json.dumps({"table_sizes": {"C1": 3}}))
    with pytest.raises(schema.MetaError, match="'cardinalities' must list the 26 table sizes"):
        schema.read_meta(str(tmp_path))


def test_command_line(tmp_path, repo_root):
    src = write_tsv(tmp_path / "train.txt", GOOD)
    proc = subprocess.run([sys.executable, "-m", "datasets.criteo", src, "--out", str(tmp_path / "out"),
                           "--hash-buckets", "100", "--quiet", "--test-fraction", "0.5"], cwd=repo_root,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "4 rows written to 2 file(s), 6 rejected" in proc.stdout
    assert "test split: the last 0.5 of the rows; train with --data" in proc.stdout
    assert f"{src}:5: I1='x' is not an integer" in proc.stdout
    help_text = subprocess.run([sys.executable, "-m", "datasets.criteo", "--help"], cwd=repo_root,
                               capture_output=True, text=True).stdout
    assert "--hash_buckets" in help_text and "--min_count" in help_text and "--test_fraction" in help_text
    assert "--hash-buckets" not in help_text  # the old spellings (used above) parse, unlisted
