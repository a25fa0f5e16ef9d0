"""datasets.criteo: TSV -> Parquet with missing values, malformed rows, vocabularies and hashing."""

import gzip
import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from datasets import schema
from datasets.criteo import Vocabulary, convert, hex_values

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
    assert meta["rows_rejected"] == 6 and meta["table_sizes"]["C1"] == 3
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


def test_command_line(tmp_path, repo_root):
    src = write_tsv(tmp_path / "day_0", GOOD)
    proc = subprocess.run([sys.executable, "-m", "datasets.criteo", src, "--out", str(tmp_path / "out"),
                           "--hash-buckets", "100", "--quiet"], cwd=repo_root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "4 rows written to 1 file(s), 6 rejected" in proc.stdout
    assert f"{src}:5: I1='x' is not an integer" in proc.stdout
    help_text = subprocess.run([sys.executable, "-m", "datasets.criteo", "--help"], cwd=repo_root,
                               capture_output=True, text=True).stdout
    assert "--hash-buckets" in help_text and "--min-count" in help_text
