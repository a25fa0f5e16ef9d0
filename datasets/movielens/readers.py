"""Reads the GroupLens MovieLens releases into pandas frames with the original ids.

Formats: ``100k`` (``u.data`` tab-separated, ``u.user``, ``u.item``), ``1m``
(``ratings.dat``, ``users.dat``, ``movies.dat`` separated by ``::``) and
``csv`` (20M, 25M, latest, latest-small: ``ratings.csv``, ``movies.csv``).
``tfds`` reads ``movielens/*-ratings`` from tensorflow_datasets when it is
installed and the data is already prepared locally; it never downloads.
"""

from __future__ import annotations

import dataclasses
import os
from typing import List, Optional

import numpy as np
import pandas as pd

FORMATS = ("100k", "1m", "csv", "tfds")
# The splits shipped in ml-100k as ``NAME.base`` / ``NAME.test``: u1..u5 are the five disjoint 80/20 folds of
# u.data (5-fold cross-validation); ua and ub hold exactly 10 ratings per user in test.
SPLITS_100K = ("u1", "u2", "u3", "u4", "u5", "ua", "ub")
GENRES_100K = ("unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary",
               "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller",
               "War", "Western")


class MovieLensError(ValueError):
    """A MovieLens directory or file that cannot be read; the message names it."""


@dataclasses.dataclass
class Release:
    """Ratings (``user``, ``item``, ``rating``, ``timestamp``) and side tables where the release has them.

    ``items`` has ``item``, ``title`` and ``genres`` (a list of names); ``users``
    has ``user`` and, for 100k and 1m, ``gender``, ``age``, ``occupation``.
    """

    ratings: pd.DataFrame
    users: Optional[pd.DataFrame] = None
    items: Optional[pd.DataFrame] = None
    format: str = ""


def detect_format(path: str) -> str:
    """``100k``, ``1m`` or ``csv`` from the files in directory ``path``."""
    for name, fmt in (("u.data", "100k"), ("ratings.dat", "1m"), ("ratings.csv", "csv")):
        if os.path.isfile(os.path.join(path, name)):
            return fmt
    raise MovieLensError(f"{path!r} holds none of u.data (100k), ratings.dat (1m) or ratings.csv (20m/25m/latest); "
                         "point at the unpacked MovieLens directory")


def _need(path: str, name: str) -> str:
    full = os.path.join(path, name)
    if not os.path.isfile(full):
        raise MovieLensError(f"{full!r} does not exist; the MovieLens directory looks incomplete")
    return full


def _optional(path: str, name: str) -> Optional[str]:
    full = os.path.join(path, name)
    return full if os.path.isfile(full) else None


def _check_columns(frame: pd.DataFrame, file: str, expected: int) -> pd.DataFrame:
    if frame.shape[1] != expected or frame.isna().any().any():
        bad = int(np.flatnonzero(frame.isna().any(axis=1).to_numpy())[0]) + 1 if frame.isna().any().any() else 1
        raise MovieLensError(f"{file!r} line {bad}: expected {expected} fields per line; is this the right release?")
    return frame


def _bad_line(file: str, sep: str, fields: int) -> Optional[str]:
    """The first line of ``file`` without ``fields`` integer fields separated by ``sep``, as an error message."""
    with open(file, encoding="latin-1") as f:
        for number, line in enumerate(f, 1):
            parts = line.rstrip("\r\n").split(sep)
            if len(parts) != fields or not all(p.strip().lstrip("-").isdigit() for p in parts):
                return (f"{file!r} line {number}: expected {fields} integer fields separated by {sep!r}, "
                        f"got {line.rstrip()!r}")
    return None


def _read_ratings_tsv(file: str) -> pd.DataFrame:
    """A 100k ratings file (``u.data``, ``u1.base``, ...): user, item, rating, timestamp, tab-separated integers."""
    try:
        frame = pd.read_csv(file, sep="\t", header=None, engine="c")
    except (pd.errors.ParserError, ValueError):
        frame = None
    if frame is None or frame.shape[1] != 4 or frame.isna().any().any() or \
            not all(pd.api.types.is_integer_dtype(t) for t in frame.dtypes):
        raise MovieLensError(_bad_line(file, "\t", 4) or f"{file!r}: expected 4 tab-separated integer fields")
    frame.columns = ["user", "item", "rating", "timestamp"]
    return frame


def read_100k_split(path: str, name: str) -> tuple:
    """The shipped split ``name`` (one of :data:`SPLITS_100K`) of ml-100k: ``(base, test)`` ratings frames."""
    if name not in SPLITS_100K:
        raise MovieLensError(f"split {name!r} is not one of the ml-100k splits {', '.join(SPLITS_100K)}")
    return tuple(_read_ratings_tsv(_need(path, f"{name}.{part}")) for part in ("base", "test"))


def read_100k(path: str) -> Release:
    """MovieLens 100k: ``u.data`` (user, item, rating, timestamp) plus ``u.user`` and ``u.item``."""
    ratings = _read_ratings_tsv(_need(path, "u.data"))
    users = items = None
    if (f := _optional(path, "u.user")) is not None:
        users = pd.read_csv(f, sep="|", header=None, names=["user", "age", "gender", "occupation", "zip"],
                            encoding="latin-1")
    if (f := _optional(path, "u.item")) is not None:
        raw = pd.read_csv(f, sep="|", header=None, encoding="latin-1")
        flags = raw.iloc[:, 5:5 + len(GENRES_100K)].to_numpy().astype(bool)
        genres = [[GENRES_100K[j] for j in np.flatnonzero(row)] for row in flags]
        items = pd.DataFrame({"item": raw[0], "title": raw[1], "genres": genres})
    return Release(ratings, users, items, "100k")


def _read_colons(file: str, names: List[str]) -> pd.DataFrame:
    """A ``::``-separated file whose fields hold no ``:`` (ratings.dat, users.dat), with the fast C parser."""
    try:
        raw = pd.read_csv(file, sep=":", header=None, engine="c", encoding="latin-1")
    except (pd.errors.ParserError, ValueError):
        raw = None
    if raw is None or raw.shape[1] != 2 * len(names) - 1 or raw.iloc[:, 1::2].notna().any().any():
        located = _bad_line(file, "::", len(names)) if "rating" in names else None
        raise MovieLensError(located or f"{file!r}: expected {len(names)} fields separated by '::'")
    frame = raw.iloc[:, ::2]
    frame.columns = names
    return _check_columns(frame.reset_index(drop=True), file, len(names))


def read_1m(path: str) -> Release:
    """MovieLens 1M: ``ratings.dat`` plus ``users.dat`` and ``movies.dat``."""
    ratings = _read_colons(_need(path, "ratings.dat"), ["user", "item", "rating", "timestamp"])
    users = items = None
    if (f := _optional(path, "users.dat")) is not None:
        users = _read_colons(f, ["user", "gender", "age", "occupation", "zip"])
    if (f := _optional(path, "movies.dat")) is not None:
        raw = pd.read_csv(f, sep="::", header=None, engine="python", encoding="latin-1",
                          names=["item", "title", "genres"])
        items = raw.assign(genres=raw["genres"].str.split("|"))
    return Release(ratings, users, items, "1m")


def read_csv(path: str) -> Release:
    """MovieLens 20M/25M/latest: ``ratings.csv`` plus ``movies.csv``."""
    file = _need(path, "ratings.csv")
    ratings = pd.read_csv(file, engine="c")
    expected = ["userId", "movieId", "rating", "timestamp"]
    if list(ratings.columns) != expected:
        raise MovieLensError(f"{file!r} has columns {list(ratings.columns)}, expected {expected}")
    ratings.columns = ["user", "item", "rating", "timestamp"]
    items = None
    if (f := _optional(path, "movies.csv")) is not None:
        raw = pd.read_csv(f, engine="c")
        items = pd.DataFrame({"item": raw["movieId"], "title": raw["title"],
                              "genres": raw["genres"].str.split("|")})
    return Release(ratings, None, items, "csv")


TFDS_DEFAULT = "movielens/100k-ratings"
_TFDS_RATING = ("user_id", "movie_id", "user_rating", "timestamp")
_TFDS_BATCH = 65536


def _tfds_ids(values: np.ndarray, what: str, name: str) -> np.ndarray:
    """tfds' string ids as the integer ids of the GroupLens files."""
    try:
        return values.astype(np.int64)
    except ValueError:
        raise MovieLensError(f"{name}: {what} ids are not integers, e.g. {values[0]!r}") from None


def read_tfds(name: str = TFDS_DEFAULT, data_dir: Optional[str] = None) -> Release:
    """``tensorflow_datasets``' ratings dataset ``name`` (``movielens/<release>-ratings``), prepared under
    ``data_dir`` (tfds' default without one); never downloads.

    The ratings come with the integer ids of the GroupLens files, sorted by
    user, movie and timestamp (the order of ``ratings.csv``; tfds stores them
    shuffled), so :func:`datasets.movielens.convert` gives what it gives for the
    same release's files. ``items`` (title, genres) comes from the movie
    features of the ratings, so it holds the rated movies only; ``users`` is
    not read (the demographic features of ``100k``/``1m`` are left out).
    """
    try:
        import tensorflow as tf
        import tensorflow_datasets as tfds
    except ImportError:
        raise MovieLensError("tensorflow_datasets is not installed; install the 'tfds' extra "
                             "or read the GroupLens files directly") from None
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except (tfds.core.DatasetNotFoundError, ValueError) as err:
        raise MovieLensError(f"{name!r} is not a tensorflow_datasets dataset ({type(err).__name__}); MovieLens "
                             f"ratings are movielens/<release>-ratings, e.g. {TFDS_DEFAULT}") from None
    features = builder.info.features
    missing = [k for k in _TFDS_RATING if k not in features]
    if missing:
        raise MovieLensError(f"{name} has no {', '.join(missing)}: read a ratings dataset "
                             f"(movielens/<release>-ratings, e.g. {TFDS_DEFAULT})")
    if not os.path.isdir(builder.data_dir) or not os.listdir(builder.data_dir):
        raise MovieLensError(f"{name} is not prepared in {builder.data_dir!r}; this reader never downloads")
    with_movies = "movie_title" in features and "movie_genres" in features

    def select(example):
        row = {k: example[k] for k in _TFDS_RATING}
        if with_movies:  # one string per rating, so that ratings batch into dense arrays
            row["movie_title"] = example["movie_title"]
            row["movie_genres"] = tf.strings.reduce_join(tf.strings.as_string(example["movie_genres"]),
                                                         separator=" ")
        return row

    dataset = builder.as_dataset(split="train", shuffle_files=False).map(select).batch(_TFDS_BATCH)
    parts: dict = {}
    for batch in tfds.as_numpy(dataset):
        for key, value in batch.items():
            parts.setdefault(key, []).append(value)
    if not parts:
        raise MovieLensError(f"{name} in {builder.data_dir!r} holds no ratings")
    columns = {key: np.concatenate(value) for key, value in parts.items()}
    ratings = pd.DataFrame({"user": _tfds_ids(columns["user_id"], "user", name),
                            "item": _tfds_ids(columns["movie_id"], "movie", name),
                            "rating": columns["user_rating"].astype(np.float32),
                            "timestamp": columns["timestamp"].astype(np.int64)})
    order = np.lexsort((ratings["timestamp"].to_numpy(), ratings["item"].to_numpy(), ratings["user"].to_numpy()))
    items = None
    if with_movies:
        keys, first = np.unique(ratings["item"].to_numpy(), return_index=True)
        names = features["movie_genres"].feature.names
        items = pd.DataFrame({"item": keys, "title": [t.decode() for t in columns["movie_title"][first]],
                              "genres": [[names[int(g)] for g in s.split()] for s in columns["movie_genres"][first]]})
    return Release(ratings.iloc[order].reset_index(drop=True), None, items, "tfds")


def read(path: str, fmt: Optional[str] = None, data_dir: Optional[str] = None) -> Release:
    """The release in directory ``path`` (or the tfds name ``path`` with ``fmt='tfds'``)."""
    fmt = fmt or detect_format(path)
    readers = {"100k": read_100k, "1m": read_1m, "csv": read_csv}
    if fmt == "tfds":
        return read_tfds(path, data_dir)
    if fmt not in readers:
        raise MovieLensError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    return readers[fmt](path)
