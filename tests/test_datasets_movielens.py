"""datasets.movielens: each GroupLens format, contiguous ids, labels, splits, and ml-latest-small."""

import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from datasets.movielens import MovieLensError, convert, detect_format

# (user, item, rating, timestamp) in file order; items 10 and 30, users 7 and 9.
RATINGS = [(7, 30, 5, 300), (7, 10, 3, 100), (9, 10, 4, 200), (7, 20, 2, 200), (9, 30, 1, 50)]


def write_100k(d):
    (d / "u.data").write_text("".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in RATINGS))
    (d / "u.user").write_text("7|24|M|technician|85711\n9|53|F|other|94043\n")
    flags = lambda on: "|".join("1" if j in on else "0" for j in range(19))  # noqa: E731
    (d / "u.item").write_text(f"10|A (1995)|01-Jan-1995||http://a|{flags({1, 5})}\n"
                              f"20|B (1995)|01-Jan-1995||http://b|{flags({5})}\n"
                              f"30|C (1995)|01-Jan-1995||http://c|{flags({8})}\n", encoding="latin-1")


def write_1m(d):
    (d / "ratings.dat").write_text("".join(f"{u}::{i}::{r}::{t}\n" for u, i, r, t in RATINGS))
    (d / "users.dat").write_text("7::M::25::17::85711\n9::F::50::1::94043\n")
    (d / "movies.dat").write_text("10::A: The Film (1995)::Action|Comedy\n20::B (1995)::Comedy\n"
                                  "30::C (1995)::Drama\n", encoding="latin-1")


def write_csv(d):
    (d / "ratings.csv").write_text("userId,movieId,rating,timestamp\n"
                                   + "".join(f"{u},{i},{r}.0,{t}\n" for u, i, r, t in RATINGS))
    (d / "movies.csv").write_text('movieId,title,genres\n10,"A, The (1995)",Action|Comedy\n'
                                  "20,B (1995),Comedy\n30,C (1995),Drama\n40,Unrated (1999)," 
                                  "(no genres listed)\n")


@pytest.mark.parametrize("fmt,writer,items", [("100k", write_100k, 3), ("1m", write_1m, 3), ("csv", write_csv, 4)])
def test_each_format(tmp_path, fmt, writer, items):
    src = tmp_path / "src"
    src.mkdir()
    writer(src)
    assert detect_format(str(src)) == fmt
    summary = convert(str(src), str(tmp_path / "out"), test_fraction=0.0)
    assert (summary.ratings, summary.users, summary.items, summary.test_rows) == (5, 2, items, 0)
    table = pq.read_table(tmp_path / "out" / "train.parquet")
    assert table.column("user_id").to_pylist() == [0, 0, 1, 0, 1]
    assert table.column("item_id").to_pylist() == [2, 0, 0, 1, 2]
    assert table.column("rating").to_pylist() == [5, 3, 4, 2, 1]
    assert table.column("label").to_pylist() == [1, 0, 1, 0, 0]
    assert table.column("timestamp").to_pylist() == [300, 100, 200, 200, 50]
    genres = table.column("genres").to_pylist()
    # Genre ids number the sorted genre names: Action 0, Comedy 1, Drama 2 (100k adds its own names).
    assert genres[1] == genres[2] and len(genres[1]) == 2 and genres[3] == [genres[1][1]]
    if fmt != "csv":
        assert table.column("gender").to_pylist() == [1, 1, 0, 1, 0]  # F=0, M=1
    items_table = pq.read_table(tmp_path / "out" / "items.parquet")
    assert items_table.column("original_id").to_pylist()[:3] == [10, 20, 30]
    if fmt == "1m":
        assert items_table.column("title").to_pylist()[0] == "A: The Film (1995)"


def test_random_split_is_seeded(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    write_csv(src)
    def test_rows(seed, out):
        convert(str(src), str(tmp_path / out), test_fraction=0.4, seed=seed)
        return pq.read_table(tmp_path / out / "test.parquet").column("timestamp").to_pylist()
    a, b = test_rows(1, "a"), test_rows(1, "b")
    assert a == b and len(a) == 2
    assert len(pq.read_table(tmp_path / "a" / "train.parquet")) == 3


def test_time_split_takes_each_users_latest(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    write_100k(src)
    summary = convert(str(src), str(tmp_path / "out"), split="time", test_fraction=0.3)
    test = pq.read_table(tmp_path / "out" / "test.parquet").to_pydict()
    # user 7 (3 ratings): round(0.9) = 1 latest (t=300); user 9 (2 ratings): at least 1 (t=200).
    assert sorted(zip(test["user_id"], test["timestamp"])) == [(0, 300), (1, 200)]
    assert summary.train_rows == 3


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(MovieLensError, match="holds none of u.data"):
        convert(str(tmp_path), str(tmp_path / "out"))
    (tmp_path / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,99,4.0,5\n")
    (tmp_path / "movies.csv").write_text("movieId,title,genres\n1,A,Drama\n")
    with pytest.raises(MovieLensError, match="movie 99 is rated but missing from the movies file"):
        convert(str(tmp_path), str(tmp_path / "out"))


def test_ml_latest_small(movielens_small, tmp_path, repo_root):
    proc = subprocess.run([sys.executable, "-m", "datasets.movielens", str(movielens_small), "--out",
                           str(tmp_path / "out"), "--split", "time"], cwd=repo_root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "100836 ratings (csv), 610 users, 9742 items" in proc.stdout
    train = pq.read_table(tmp_path / "out" / "train.parquet")
    test = pq.read_table(tmp_path / "out" / "test.parquet")
    assert len(train) + len(test) == 100836
    users = np.concatenate([train.column("user_id").to_numpy(), test.column("user_id").to_numpy()])
    items = np.concatenate([train.column("item_id").to_numpy(), test.column("item_id").to_numpy()])
    assert users.min() == 0 and users.max() == 609 and len(np.unique(users)) == 610
    assert items.min() >= 0 and items.max() < 9742
    assert set(np.unique(test.column("user_id").to_numpy())) == set(range(610))  # every user has a test rating


def write_shipped_split(d, name, test_rows):
    """``NAME.base`` / ``NAME.test`` as in ml-100k: the u.data rows at ``test_rows`` go to test."""
    lines = [f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in RATINGS]
    (d / f"{name}.base").write_text("".join(l for j, l in enumerate(lines) if j not in test_rows))
    (d / f"{name}.test").write_text("".join(lines[j] for j in test_rows))


@pytest.mark.parametrize("name,test_rows", [("u1", {0, 4}), ("u5", {2}), ("ua", {1, 2}), ("ub", {3})])
def test_shipped_100k_splits_are_read_from_base_and_test(tmp_path, name, test_rows):
    src = tmp_path / "src"
    src.mkdir()
    write_100k(src)
    write_shipped_split(src, name, test_rows)
    summary = convert(str(src), str(tmp_path / "out"), split=name, progress=False)
    assert (summary.ratings, summary.train_rows, summary.test_rows) == (5, 5 - len(test_rows), len(test_rows))
    test = pq.read_table(tmp_path / "out" / "test.parquet").column("timestamp").to_pylist()
    train = pq.read_table(tmp_path / "out" / "train.parquet").column("timestamp").to_pylist()
    assert sorted(test) == sorted(RATINGS[j][3] for j in test_rows)
    assert sorted(train) == sorted(RATINGS[j][3] for j in range(5) if j not in test_rows)
    assert pq.read_table(tmp_path / "out" / "test.parquet").column("gender").to_pylist()  # side features kept


def test_shipped_split_errors_name_file_and_line(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    write_100k(src)
    with pytest.raises(MovieLensError, match=r"u2.base' does not exist"):
        convert(str(src), str(tmp_path / "out"), split="u2", progress=False)
    write_shipped_split(src, "u2", {1})
    (src / "u2.test").write_text("7\t10\t3\t100\n9\t10\tfour\t200\n")
    with pytest.raises(MovieLensError, match=r"u2.test' line 2: expected 4 integer fields"):
        convert(str(src), str(tmp_path / "out"), split="u2", progress=False)
    (src / "u.data").write_text("7\t30\t5\t300\n7\t10\t3\n")
    with pytest.raises(MovieLensError, match=r"u.data' line 2: expected 4 integer fields"):
        convert(str(src), str(tmp_path / "out"), progress=False)
    (src / "u.data").write_text("7\t30\t5\t300\n7\t10\t3\t1\t9\n")
    with pytest.raises(MovieLensError, match=r"u.data' line 2"):
        convert(str(src), str(tmp_path / "out"), progress=False)
    one_m = tmp_path / "one_m"
    one_m.mkdir()
    write_1m(one_m)
    with pytest.raises(MovieLensError, match="shipped with ml-100k only"):
        convert(str(one_m), str(tmp_path / "out"), split="ua", progress=False)
    (one_m / "ratings.dat").write_text("7::30::5::300\n7::10::3::100\n9::10::4\n")
    with pytest.raises(MovieLensError, match=r"ratings.dat' line 3: expected 4"):
        convert(str(one_m), str(tmp_path / "out"), progress=False)
    (one_m / "ratings.dat").write_text("7::30::5::300\n7::10::3::100::1\n")
    with pytest.raises(MovieLensError, match=r"ratings.dat' line 2: expected 4"):
        convert(str(one_m), str(tmp_path / "out"), progress=False)
