"""datasets.movielens' tfds path on a TFDS dataset built here from small ml-latest-small-shaped files: the
rows a user with a prepared tfds data_dir reads are the source rows, and converting them gives what
converting the source files gives."""

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from datasets.movielens import MovieLensError, convert, read
from datasets.movielens.__main__ import main as movielens_main

NAME = "movielens/latest-small-ratings"
# ml-latest-small's layout: ratings sorted by user then movie, half stars, a quoted title with a comma,
# ids that sort differently as strings (2 < 10 < 610; 176601 < 193609), a movie without genres.
MOVIES = """movieId,title,genres
1,Toy Story (1995),Adventure|Animation|Children|Comedy|Fantasy
2,"American President, The (1995)",Comedy|Drama|Romance
10,GoldenEye (1995),Action|Adventure|Thriller
176601,Black Mirror,(no genres listed)
193609,Andrew Dice Clay: Dice Rules (1991),Comedy
"""
RATINGS = """userId,movieId,rating,timestamp
1,1,4.0,964982703
1,10,0.5,964981247
1,176601,3.0,964983000
2,2,3.5,1445714835
2,10,4.0,1445714900
2,193609,5.0,1445714994
10,1,2.5,1537799250
10,2,3.0,1537799100
10,176601,4.5,1537799500
610,2,1.0,1493846000
610,10,3.0,1493845360
610,193609,2.0,1493845000
"""


@pytest.fixture(scope="module")
def tfds_data(tmp_path_factory):
    """``(source dir, tfds data_dir)``: the files, and the TFDS dataset ``movielens/latest-small-ratings``
    that tensorflow_datasets' own builder and parser prepare from them (read from a manual_dir: no download)."""
    tfds = pytest.importorskip("tensorflow_datasets")
    from tensorflow_datasets.structured import movielens

    class LocalMovielens(movielens.Movielens, skip_registration=True):
        """The registered ``movielens`` builder, reading the release from ``manual_dir``."""

        name = "movielens"
        MANUAL_DOWNLOAD_INSTRUCTIONS = "the unpacked release"

        def _split_generators(self, dl_manager):
            return [tfds.core.SplitGenerator(name=tfds.Split.TRAIN,
                                             gen_kwargs={"dir_path": str(dl_manager.manual_dir)})]

    root = tmp_path_factory.mktemp("tfds")
    src, data_dir = root / "ml-latest-small", root / "tensorflow_datasets"
    src.mkdir()
    (src / "movies.csv").write_text(MOVIES)
    (src / "ratings.csv").write_text(RATINGS)
    LocalMovielens(config="latest-small-ratings", data_dir=str(data_dir)).download_and_prepare(
        download_dir=str(root / "downloads"), download_config=tfds.download.DownloadConfig(manual_dir=str(src)))
    assert list((data_dir / "movielens" / "latest-small-ratings").glob("*/dataset_info.json"))
    return src, data_dir


def test_read_gives_the_source_rows(tfds_data):
    src, data_dir = tfds_data
    release = read(NAME, fmt="tfds", data_dir=str(data_dir))
    source = pd.read_csv(src / "ratings.csv")
    assert release.format == "tfds"
    got = release.ratings
    assert list(got.columns) == ["user", "item", "rating", "timestamp"]
    for column, name in (("user", "userId"), ("item", "movieId"), ("rating", "rating"), ("timestamp", "timestamp")):
        np.testing.assert_array_equal(got[column].to_numpy(), source[name].to_numpy(), err_msg=column)
    assert got["user"].dtype == got["item"].dtype == got["timestamp"].dtype == np.int64
    movies = pd.read_csv(src / "movies.csv").sort_values("movieId")
    items = release.items.sort_values("item")
    np.testing.assert_array_equal(items["item"].to_numpy(), movies["movieId"].to_numpy())
    assert items["title"].tolist() == movies["title"].tolist()
    assert items["genres"].tolist() == movies["genres"].str.split("|").tolist()


def test_conversion_equals_the_conversion_of_the_source_files(tfds_data, tmp_path):
    """``python -m datasets.movielens NAME --format tfds --data_dir DIR``: the Parquet files, ids, genres
    and split of the same release's csv files."""
    src, data_dir = tfds_data
    assert movielens_main([NAME, "--format", "tfds", "--data_dir", str(data_dir), "--out",
                           str(tmp_path / "tfds"), "--quiet"]) == 0
    convert(str(src), str(tmp_path / "csv"), progress=False)
    for part in ("train", "test", "items", "users"):
        got, want = (pq.read_table(tmp_path / d / f"{part}.parquet") for d in ("tfds", "csv"))
        assert got.equals(want), (part, got.to_pandas(), want.to_pandas())
    got, want = (json.loads((tmp_path / d / "meta.json").read_text()) for d in ("tfds", "csv"))
    assert (got.pop("format"), want.pop("format")) == ("tfds", "csv")
    assert got == want and got["ratings"] == 12 and got["test_rows"] > 0
    assert got["vocabularies"]["genres"][0] == "(no genres listed)"


def test_errors_name_the_dataset(tfds_data):
    _, data_dir = tfds_data
    for name, message in (("movielens/latest-small-movies", "read a ratings dataset"),
                          ("movielens/100k-ratings", "not prepared"),
                          ("no_such_lens/100k-ratings", "is not a tensorflow_datasets dataset")):
        with pytest.raises(MovieLensError, match=message):
            read(name, fmt="tfds", data_dir=str(data_dir))
