"""``--serving_input criteo_raw``: a SavedModel that takes Criteo's values as they are in the TSV.

The signature has 39 string inputs ``[batch]``, the fields of a TSV line
after the label: ``I1..I13`` decimal counts and ``C1..C26`` hex values, the
empty string for a missing value, exactly as ``line.split("\\t")[1:]`` gives
them. Inside the graph the converter's transform (:mod:`datasets.criteo`)
turns them into the model's features: counts through ``log(x + 1)`` with
negatives and missing values 0 (untransformed if the data was converted with
``--no_log``), hex values through the conversion's vocabulary (one
``tf.lookup.StaticHashTable`` per column, read from a SavedModel asset, so
the export is self-contained; id 0 for missing or unknown values) or its
``--hash_buckets`` formula. A value the converter would reject (not an
integer of at most 18 digits, not 1 to 16 hex digits) fails the request with
``InvalidArgumentError`` naming the column.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from typing import Dict, Mapping, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import tensorflow as tf

from modelzoo.repository import import_datasets
from modelzoo.spec import FeatureSpec

schema = import_datasets("schema")
parse, vocab = import_datasets("criteo.parse"), import_datasets("criteo.vocab")
VOCABULARY_FILE = import_datasets("criteo.convert").VOCABULARY_FILE

HEX_DIGITS = 16


def _check_values(strings: tf.Tensor, pattern: str, name: str, what: str) -> tf.Tensor:
    """``strings`` once every non-empty value matches ``pattern``; else the request fails naming ``name``."""
    ok = tf.logical_or(tf.equal(strings, ""), tf.strings.regex_full_match(strings, pattern))
    check = tf.debugging.Assert(tf.reduce_all(ok), [f"criteo_raw: {name} must be {what} or empty; got",
                                                    tf.boolean_mask(strings, tf.logical_not(ok))], summarize=5)
    with tf.control_dependencies([check]):
        return tf.identity(strings)


def numeric(strings: tf.Tensor, log_transform: bool = True, name: str = "I") -> tf.Tensor:
    """Decimal counts (``""`` missing) -> float32, as :func:`datasets.criteo.parse.numeric`:
    missing and negatives 0, then ``log(x + 1)`` in float64 unless not ``log_transform``."""
    strings = _check_values(strings, parse.INTEGER_PATTERN, name, "an integer")
    filled = tf.where(tf.equal(strings, ""), tf.fill(tf.shape(strings), "0"), strings)
    values = tf.cast(tf.maximum(tf.strings.to_number(filled, tf.int64), 0), tf.float64)
    return tf.cast(tf.math.log1p(values) if log_transform else values, tf.float32)


def hex_values(strings: tf.Tensor, name: str = "C") -> Tuple[tf.Tensor, tf.Tensor]:
    """Hex strings (``""`` missing) -> ``(values, present)``, as :func:`datasets.criteo.parse.hex_values`;
    the uint64 values as int64 with the same bits."""
    strings = _check_values(strings, parse.HEX_PATTERN, name, "1 to 16 hex digits")
    padded = tf.strings.substr(tf.strings.join([tf.fill(tf.shape(strings), "0" * HEX_DIGITS), strings]),
                               -HEX_DIGITS, HEX_DIGITS)
    chars = tf.io.decode_raw(padded, tf.uint8)  # [batch, 16]
    nibbles = tf.gather(tf.constant(parse.NIBBLE.astype(np.int64)), tf.cast(chars, tf.int32))
    shifts = tf.constant(np.arange(HEX_DIGITS - 1, -1, -1, dtype=np.int64) * 4)
    values = tf.reduce_sum(tf.bitwise.left_shift(nibbles, shifts), axis=1)  # disjoint bits: the sum is the OR
    return values, tf.not_equal(strings, "")


def hashed_ids(values: tf.Tensor, present: tf.Tensor, buckets: int) -> tf.Tensor:
    """:func:`datasets.criteo.vocab.hashed_ids` in TensorFlow: ``1 + value % (buckets - 1)``, the value
    unsigned; 0 where missing."""
    unsigned = tf.bitcast(values, tf.uint64)
    ids = tf.cast(tf.math.floormod(unsigned, tf.constant(buckets - 1, tf.uint64)), tf.int64) + 1
    return tf.where(present, ids, tf.zeros_like(ids))


def write_vocabulary_assets(vocabulary: vocab.Vocabulary, directory: str) -> Dict[str, Optional[str]]:
    """One ``value<TAB>id`` text file per column of ``vocabulary`` (values as int64 with the uint64's bits),
    what ``tf.lookup.TextFileInitializer`` reads; None for a column without known values."""
    files: Dict[str, Optional[str]] = {}
    for name in schema.CATEGORICAL:
        keys, ids, _ = vocabulary.tables[name]
        if not len(keys):
            files[name] = None
            continue
        files[name] = os.path.join(directory, f"criteo_vocabulary_{name}.tsv")
        pacsv.write_csv(pa.table({"value": keys.astype(np.uint64).view(np.int64), "id": ids.astype(np.int64)}),
                        files[name], pacsv.WriteOptions(include_header=False, delimiter="\t"))
    return files


def vocabulary_ids(values: tf.Tensor, present: tf.Tensor, asset: Optional[str], name: str) -> tf.Tensor:
    """Ids of ``values`` in the vocabulary file ``asset`` (a SavedModel asset); 0 where missing or unknown."""
    if asset is None:
        return tf.zeros_like(values)
    table = tf.lookup.StaticHashTable(
        tf.lookup.TextFileInitializer(asset, tf.int64, 0, tf.int64, 1, delimiter="\t"), default_value=0,
        name=f"criteo_vocabulary_{name}")
    ids = table.lookup(values)
    return tf.where(present, ids, tf.zeros_like(ids))


def id_mapping(data_dir: str) -> Dict[str, object]:
    """How the conversion in ``data_dir`` made its ids and numbers, from its meta.json, in the converter's
    order of precedence: ``{"vocabulary": path or None, "hash_buckets": N or None, "log_transform": bool}``.

    Raises ValueError when ``data_dir`` was not written by ``python -m datasets.criteo``.
    """
    meta = schema.read_meta(data_dir)
    if meta.get("format") != "criteo":
        raise ValueError(f"--serving_input criteo_raw needs Criteo data converted by python -m datasets.criteo; "
                         f"{os.path.join(data_dir, schema.META_FILE)} says format {meta.get('format')!r}")
    options = meta.get("options") or {}
    vocabulary, buckets = None, None
    if options.get("vocabulary"):  # ids from an earlier conversion's vocabulary, as the converter gave them
        vocabulary = options["vocabulary"]
        if not os.path.isabs(vocabulary) and not os.path.isfile(vocabulary):
            vocabulary = os.path.join(data_dir, vocabulary)
    elif options.get("hash_buckets"):
        buckets = int(options["hash_buckets"])
    elif meta.get("vocabulary"):
        vocabulary = os.path.join(data_dir, meta["vocabulary"])
    else:
        raise ValueError(f"{data_dir}/meta.json names neither a vocabulary nor hash buckets; convert again with "
                         f"python -m datasets.criteo (it writes {VOCABULARY_FILE})")
    if vocabulary is not None and not os.path.isfile(vocabulary):
        raise ValueError(f"the vocabulary {vocabulary!r} of {data_dir} does not exist; --serving_input criteo_raw "
                         "builds it into the SavedModel")
    return {"vocabulary": vocabulary, "hash_buckets": buckets, "log_transform": bool(options.get("log_transform",
                                                                                                 True))}


class RawCriteoReceiver:
    """The ``serving_input_receiver_fn`` of ``--serving_input criteo_raw`` for Criteo data in ``data_dir``.

    Made on every worker, it checks ``data_dir`` before training. Called on
    the exporting rank, it reads the vocabulary and writes the asset files
    the SavedModel copies; they live in a temporary directory removed with
    this object.
    """

    def __init__(self, spec: FeatureSpec, data_dir: Optional[str]):
        if spec.numeric != schema.DENSE or [n for n, _ in spec.categorical] != list(schema.CATEGORICAL):
            raise ValueError("--serving_input criteo_raw is for the Criteo models (DLRM, DeepFM); use raw or example")
        if not data_dir:
            raise ValueError("--serving_input criteo_raw needs --data DIR converted by python -m datasets.criteo "
                             "(its vocabulary goes into the SavedModel)")
        self.spec, self.data_dir = spec, data_dir
        self.mapping = id_mapping(data_dir)
        buckets = self.mapping["hash_buckets"]
        if buckets and any(size != buckets for _, size in spec.categorical):
            raise ValueError(f"{data_dir} was hashed into {buckets} buckets but the model's tables have "
                             f"{[size for _, size in spec.categorical]} rows; export with the --data it trained on")
        self._assets = tempfile.mkdtemp(prefix="criteo-raw-serving-")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._assets, True)

    def close(self) -> None:
        """Removes the asset files now (an export has copied them into its ``assets/``)."""
        self._cleanup()

    def _asset_files(self) -> Dict[str, Optional[str]]:
        vocabulary = vocab.Vocabulary.load(self.mapping["vocabulary"])
        sizes = [vocabulary.size(name) for name in schema.CATEGORICAL]
        if sizes != [self.spec.vocab(name) for name in schema.CATEGORICAL]:
            raise ValueError(f"the vocabulary {self.mapping['vocabulary']} gives table sizes {sizes}, not the "
                             "model's; export with the --data the model was trained on")
        return write_vocabulary_assets(vocabulary, self._assets)

    def features(self, raw: Mapping[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
        """The model's features (``I*`` float32, ``C*`` int64 ids) from the raw string tensors."""
        features = {name: numeric(raw[name], self.mapping["log_transform"], name) for name in schema.DENSE}
        assets = self._asset_files() if self.mapping["vocabulary"] else {}
        for name in schema.CATEGORICAL:
            values, present = hex_values(raw[name], name)
            if self.mapping["hash_buckets"]:
                features[name] = hashed_ids(values, present, self.mapping["hash_buckets"])
            else:
                features[name] = vocabulary_ids(values, present, assets[name], name)
        return features

    def __call__(self) -> tf.estimator.export.ServingInputReceiver:
        raw = {name: tf.compat.v1.placeholder(tf.string, [None], name=name)
               for name in schema.DENSE + schema.CATEGORICAL}
        return tf.estimator.export.ServingInputReceiver(self.features(raw), raw)
