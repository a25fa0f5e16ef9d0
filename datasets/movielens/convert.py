"""A MovieLens release -> Parquet with contiguous ids, labels and a reproducible split.

Writes ``train.parquet`` and ``test.parquet`` (``user_id``, ``item_id``,
``rating``, ``label`` = rating >= 4, ``timestamp``, plus ``genres`` as a list
of genre ids and ``gender``/``age``/``occupation`` ids where the release has
them), ``items.parquet`` / ``users.parquet`` (new id -> original id, title)
and ``meta.json``.

Splits: ``random`` (the default: a seeded ``test_fraction`` of the ratings,
80/20 with seed 0; this is the split used for 1M, which ships none, and for
"the 80/20 split of 100K"), ``time`` (each user's latest ratings), or for
ml-100k one of the shipped splits u1..u5 (the five 80/20 cross-validation
folds) and ua/ub (10 ratings per user in test), read from the release's
``NAME.base`` / ``NAME.test`` files.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Dict, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from collective.cli import progress as progress_bar
from datasets.movielens.readers import SPLITS_100K, MovieLensError, Release, read, read_100k_split

logger = logging.getLogger("datasets.movielens")

SPLITS = ("random", "time") + SPLITS_100K


@dataclasses.dataclass
class MovieLensSummary:
    """Counts of a conversion; ``users`` and ``items`` are the sizes of the id spaces."""

    ratings: int
    users: int
    items: int
    train_rows: int
    test_rows: int
    format: str

    def __str__(self) -> str:
        return (f"{self.ratings} ratings ({self.format}), {self.users} users, {self.items} items; "
                f"train {self.train_rows}, test {self.test_rows}")


def _ids(original: pd.Series, universe: Optional[pd.Series], what: str, file_hint: str) -> tuple:
    """Contiguous ids ``0..n-1`` over the sorted ``universe`` (or the values seen)."""
    keys = np.sort(pd.unique(universe if universe is not None else original))
    index = np.searchsorted(keys, original.to_numpy())
    index = np.minimum(index, len(keys) - 1)
    unknown = keys[index] != original.to_numpy()
    if unknown.any():
        raise MovieLensError(f"{what} {original.to_numpy()[unknown][0]!r} is rated but missing from {file_hint}")
    return index.astype(np.int64), keys


def split_mask(ratings: pd.DataFrame, user_id: np.ndarray, how: str = "random", test_fraction: float = 0.2,
               seed: int = 0) -> np.ndarray:
    """True for test rows: a seeded random fraction, or each user's latest ``test_fraction`` by time.

    With ``time``, a user with one rating keeps it in train; others give at
    least one (ties in time keep file order).
    """
    if not 0 <= test_fraction < 1:
        raise ValueError(f"test_fraction={test_fraction} must be in [0, 1)")
    n = len(ratings)
    if how == "random":
        test = np.zeros(n, dtype=bool)
        test[np.random.default_rng(seed).permutation(n)[:int(round(test_fraction * n))]] = True
        return test
    if how != "time":
        raise ValueError(f"split={how!r} is not one of {', '.join(SPLITS)}")
    order = np.lexsort((np.arange(n), ratings["timestamp"].to_numpy(), user_id))
    counts = np.bincount(user_id)
    sorted_users = user_id[order]
    starts = np.r_[0, np.cumsum(counts)[:-1]]
    from_end = starts[sorted_users] + counts[sorted_users] - 1 - np.arange(n)
    n_test = np.where(counts >= 2, np.maximum(1, np.round(test_fraction * counts)), 0) if test_fraction else \
        np.zeros_like(counts)
    test = np.zeros(n, dtype=bool)
    test[order] = from_end < n_test[sorted_users]
    return test


def _side(release: Release, user_id: np.ndarray, item_id: np.ndarray, user_keys, item_keys) -> Dict[str, pa.Array]:
    """Side features of each rating as ids: genres (list), gender, age, occupation."""
    out: Dict[str, pa.Array] = {}
    meta: Dict[str, list] = {}
    if release.items is not None:
        items = release.items.set_index("item").reindex(item_keys)
        names = sorted({g for gs in items["genres"] if isinstance(gs, list) for g in gs})
        lookup = {g: i for i, g in enumerate(names)}
        per_item = [[lookup[g] for g in gs] if isinstance(gs, list) else [] for gs in items["genres"]]
        lengths = np.array([len(g) for g in per_item], dtype=np.int64)
        offsets = np.r_[0, np.cumsum(lengths)]
        flat = np.array([g for gs in per_item for g in gs], dtype=np.int64)
        starts, lens = offsets[item_id], lengths[item_id]
        gather = np.repeat(starts - np.r_[0, np.cumsum(lens)[:-1]], lens) + np.arange(lens.sum())
        out["genres"] = pa.ListArray.from_arrays(pa.array(np.r_[0, np.cumsum(lens)].astype(np.int32)),
                                                 pa.array(flat[gather]))
        meta["genres"] = names
    if release.users is not None:
        users = release.users.set_index("user").reindex(user_keys)
        for column in ("gender", "age", "occupation"):
            if column in users:
                codes, uniques = pd.factorize(users[column], sort=True)
                out[column] = pa.array(codes[user_id].astype(np.int64))
                meta[column] = [str(u) for u in uniques]
    return out, meta


def convert(src: str, out_dir: str, *, fmt: Optional[str] = None, split: str = "random",
            test_fraction: float = 0.2, seed: int = 0, data_dir: Optional[str] = None,
            row_group_size: Optional[int] = None, progress: bool = True) -> MovieLensSummary:
    """Converts the MovieLens release in ``src`` (see :func:`datasets.movielens.readers.read`) into ``out_dir``.

    Ids: users and items numbered ``0..n-1`` in order of their original ids,
    over the users/items files where the release has them (so unrated movies
    keep an id), else over those rated. ``row_group_size``: rows per row group of
    ``train.parquet`` and ``test.parquet`` (None: pyarrow's default; small groups
    let each worker read whole groups of its own). ``progress``: a bar of the
    conversion's stages on stderr (:func:`collective.cli.progress.bar`).
    """
    with progress_bar.bar(4, "converting MovieLens", unit="stage", disable=not progress) as bar:
        def done(next_stage: str = "") -> None:
            bar.update()
            bar.set_postfix_str(next_stage, refresh=False)

        bar.set_postfix_str("reading", refresh=False)
        release = read(src, fmt, data_dir)
        done("numbering ids, splitting")
        ratings = release.ratings
        shipped_test = None
        if split in SPLITS_100K:
            if release.format != "100k":
                raise MovieLensError(f"split {split!r} is shipped with ml-100k only, not with {release.format}")
            base, shipped = read_100k_split(src, split)
            ratings = pd.concat([base, shipped], ignore_index=True)
            shipped_test = np.r_[np.zeros(len(base), bool), np.ones(len(shipped), bool)]
            release = dataclasses.replace(release, ratings=ratings)
        user_id, user_keys = _ids(ratings["user"], release.users["user"] if release.users is not None else None,
                                  "user", "the users file")
        item_id, item_keys = _ids(ratings["item"], release.items["item"] if release.items is not None else None,
                                  "movie", "the movies file")
        test = shipped_test if shipped_test is not None else split_mask(ratings, user_id, split, test_fraction,
                                                                         seed)
        rating = ratings["rating"].to_numpy().astype(np.float32)
        columns = {"user_id": pa.array(user_id), "item_id": pa.array(item_id), "rating": pa.array(rating),
                   "label": pa.array((rating >= 4).astype(np.float32)),
                   "timestamp": pa.array(ratings["timestamp"].to_numpy().astype(np.int64))}
        done("side features")
        side, side_meta = _side(release, user_id, item_id, user_keys, item_keys)
        table = pa.table({**columns, **side})
        done("writing")
        os.makedirs(out_dir, exist_ok=True)
        mask = pa.array(test)
        pq.write_table(table.filter(pa.compute.invert(mask)), os.path.join(out_dir, "train.parquet"),
                       row_group_size=row_group_size)
        pq.write_table(table.filter(mask), os.path.join(out_dir, "test.parquet"), row_group_size=row_group_size)
        items = {"item_id": np.arange(len(item_keys)), "original_id": item_keys}
        if release.items is not None:
            items["title"] = release.items.set_index("item").reindex(item_keys)["title"].astype(str).to_numpy()
        pq.write_table(pa.table(items), os.path.join(out_dir, "items.parquet"))
        pq.write_table(pa.table({"user_id": np.arange(len(user_keys)), "original_id": user_keys}),
                       os.path.join(out_dir, "users.parquet"))
        summary = MovieLensSummary(len(ratings), len(user_keys), len(item_keys), int((~test).sum()), int(test.sum()),
                                   release.format)
        with open(os.path.join(out_dir, "meta.json"), "w") as f:
            json.dump({**dataclasses.asdict(summary), "split": split, "test_fraction": test_fraction, "seed": seed,
                       "vocabularies": side_meta}, f, indent=1)
        done()
    logger.info("%s", summary)
    return summary
