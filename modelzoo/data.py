"""The data sets the models train on, and their ``input_fn``.

- Synthetic Criteo-shaped data (:mod:`datasets.synthetic`), generated once
  into a cache directory (rank 0 writes, the other workers wait for it).
- MovieLens (:mod:`datasets.movielens`): a converted directory
  (``train.parquet``, ``test.parquet``, ``meta.json``) is used as it is; a
  raw GroupLens release is converted once into the cache, with row groups
  small enough to share between workers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import tensorflow as tf

import collective.data
from modelzoo.repository import import_datasets
from modelzoo.spec import FeatureSpec, criteo_spec, movielens_spec

logger = logging.getLogger("modelzoo")

DEFAULT_CACHE = os.path.join(tempfile.gettempdir(), "collective-modelzoo")
MOVIELENS_SMALL = Path(__file__).resolve().parents[2] / "shared" / "data" / "ml-latest-small"
WAIT_SECONDS = 900


@dataclasses.dataclass(frozen=True)
class DataSet:
    """Train and test files and the feature spec that reads them."""

    train: List[str]
    test: List[str]
    spec: FeatureSpec
    description: str
    info: Dict[str, object] = dataclasses.field(default_factory=dict)


def cache_root() -> str:
    """Where generated and converted data sets live: ``$COLLECTIVE_MODELZOO_CACHE`` or a temp directory."""
    return os.environ.get("COLLECTIVE_MODELZOO_CACHE", DEFAULT_CACHE)


def build_once(path: str, build: Callable[[str], None], rank: int) -> str:
    """``path`` after rank 0 has built it with ``build(tmp_dir)``; other ranks wait for it."""
    done = os.path.join(path, "DONE")
    if os.path.exists(done):
        return path
    if rank == 0:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=os.path.basename(path) + ".tmp-", dir=os.path.dirname(path) or ".")
        build(tmp)
        open(os.path.join(tmp, "DONE"), "w").close()
        try:
            os.rename(tmp, path)
        except OSError:  # another job built it first: theirs is the same data
            shutil.rmtree(tmp, ignore_errors=True)
        return path
    deadline = time.monotonic() + WAIT_SECONDS
    while not os.path.exists(done):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank} waited {WAIT_SECONDS} s for rank 0 to write {path!r}; "
                               "check rank 0's log, or write the data first and pass --data")
        time.sleep(0.5)
    return path


def synthetic(data: Optional[str], rows: int, eval_rows: int, scale: float, seed: int, row_group_size: int,
              rank: int) -> DataSet:
    """Criteo-shaped synthetic data: ``data`` (a directory with ``train/`` and ``test/``) or generated ones.

    Train and test rows come from different seeds and one teacher
    (``teacher_seed`` 0), so test AUC measures what a model learned.
    """
    synth, schema = import_datasets().synthetic, import_datasets().schema
    if data is None:
        name = f"synthetic-rows{rows}-eval{eval_rows}-scale{scale:g}-seed{seed}-rg{row_group_size}"

        def build(tmp: str) -> None:
            synth.generate(os.path.join(tmp, "train"), rows, scale=scale, seed=seed, row_group_size=row_group_size)
            synth.generate(os.path.join(tmp, "test"), eval_rows, scale=scale, seed=seed + 100_003,
                           row_group_size=row_group_size)
            schema.write_meta(tmp, synth.cardinalities(scale), format="synthetic", scale=scale,
                              train_rows=rows, test_rows=eval_rows)

        data = build_once(os.path.join(cache_root(), name), build, rank)
    if os.path.isfile(os.path.join(data, schema.META_FILE)):
        meta = schema.read_meta(data)
        scale = float(meta.get("scale", scale))
        cards = meta["cardinalities"]
        what = "synthetic Criteo-shaped data" if meta.get("format") == "synthetic" else "Criteo data"
    else:
        cards = list(synth.cardinalities(scale))
        what = f"Criteo-shaped data with scale {scale:g} table sizes (no meta.json)"
        logger.warning("--data %s has no meta.json: sizing the tables as --scale %g of Criteo Kaggle's; ids beyond "
                       "them will be refused. Convert Criteo files with python -m datasets.criteo, which writes it",
                       data, scale)
    for part in ("train", "test"):
        if not os.path.isdir(os.path.join(data, part)):
            raise FileNotFoundError(f"--data {data!r} has no {part}/ directory of Parquet files; write it with "
                                    f"python -m datasets.synthetic --out {os.path.join(data, part)}, or leave "
                                    "--data out to generate synthetic data")
    return DataSet(collective.data.expand_filenames(os.path.join(data, "train")),
                   collective.data.expand_filenames(os.path.join(data, "test")), criteo_spec(cards),
                   f"{what} in {data}", {"scale": scale})


def teacher_auc(dataset: DataSet, max_rows: int = 1_000_000) -> float:
    """AUC of the teacher that labelled synthetic ``dataset`` on its test rows: the best a model can reach."""
    import numpy as np
    import pyarrow.parquet as pq

    from modelzoo.heads import exact_auc

    ds = import_datasets()
    table = pq.read_table(dataset.test).slice(0, max_rows)
    scale = float(dataset.info.get("scale", 0.01))
    dense = np.stack([table.column(n).to_numpy() for n in ds.schema.DENSE], axis=1)
    ids = [table.column(n).to_numpy() for n in ds.schema.CATEGORICAL]
    logits = ds.synthetic.default_teacher(scale).logits(dense, ids, ds.synthetic.cardinalities(scale))
    return exact_auc(table.column(ds.schema.LABEL).to_numpy(), logits)


def movielens(data: Optional[str], rank: int, row_group_size: int = 4096) -> DataSet:
    """MovieLens: ``data`` converted (``train.parquet`` ...) or raw, default ``../shared/data/ml-latest-small``."""
    if data is None:
        if not (MOVIELENS_SMALL / "ratings.csv").is_file():
            raise FileNotFoundError(f"no --data given and {MOVIELENS_SMALL} does not exist; download "
                                    "ml-latest-small from https://grouplens.org/datasets/movielens/ and pass "
                                    "--data DIR")
        data = str(MOVIELENS_SMALL)
    if not os.path.isfile(os.path.join(data, "train.parquet")):
        src = os.path.abspath(data)
        key = hashlib.sha1(src.encode()).hexdigest()[:10]

        def build(tmp: str) -> None:  # small row groups: each worker reads its share of them
            import_datasets().movielens.convert(src, tmp, split="random", test_fraction=0.2, seed=0,
                                                row_group_size=row_group_size)

        data = build_once(os.path.join(cache_root(), f"movielens-{os.path.basename(src)}-{key}"), build, rank)
    with open(os.path.join(data, "meta.json")) as f:
        meta = json.load(f)
    genres = len(meta.get("vocabularies", {}).get("genres", []))
    spec = movielens_spec(int(meta["users"]), int(meta["items"]), genres)
    return DataSet([os.path.join(data, "train.parquet")], [os.path.join(data, "test.parquet")], spec,
                   f"MovieLens ({meta.get('format')}) in {data}: {meta['users']} users, {meta['items']} movies, "
                   f"{meta['train_rows']} train / {meta['test_rows']} test ratings", meta)


def input_fn(files: List[str], spec: FeatureSpec, batch_size: int, *, num_epochs: Optional[int] = None,
             shuffle_buffer: int = 0, seed: int = 0, rank: Optional[int] = None,
             world_size: Optional[int] = None) -> Callable[[], tf.data.Dataset]:
    """An ``input_fn`` of ``(features, labels)`` batches of ``batch_size`` rows of this worker's share.

    ``labels`` is a dict of the spec's label columns; multi-hot list columns
    become ``[batch, vocab]`` float32 indicators.
    """
    multi_hot = dict(spec.multi_hot)

    def make() -> tf.data.Dataset:
        ds = collective.data.parquet_dataset(files, batch_size, spec.columns, rank=rank, world_size=world_size,
                                             shuffle_buffer=shuffle_buffer, seed=seed, num_epochs=num_epochs,
                                             list_format="sparse", prefetch=None)

        def split(row):
            features = {k: v for k, v in row.items() if k not in spec.labels}
            for name, size in multi_hot.items():
                features[name] = tf.cast(tf.sparse.to_indicator(features[name], size), tf.float32)
            return features, {name: row[name] for name in spec.labels}

        return ds.map(split).prefetch(2)

    return make


def load_synthetic(args, rank: int) -> DataSet:
    """:func:`synthetic` from the flags of :func:`modelzoo.flags.add_synthetic`."""
    return synthetic(args.data, args.rows, args.eval_rows, args.scale, args.seed, args.row_group_size, rank)


SYNTHETIC_HELP = ("directory with train/ and test/ Parquet files in the Criteo layout (default: generate "
                  "synthetic data into $COLLECTIVE_MODELZOO_CACHE, else " + DEFAULT_CACHE + ")")
