"""``--serving_input criteo_raw``'s TensorFlow transform against the converter's numpy one
(:mod:`datasets.criteo.parse`, :mod:`datasets.criteo.vocab`) on edge cases, in one plain TF graph."""

import numpy as np
import pyarrow as pa
import pytest

from datasets.criteo import parse, vocab

INTEGERS = ["", "0", "1", "-1", "7", "007", "-0", "2147483648", "4294967296", "-999999999999999999",
            "999999999999999999", "123456789012", "65535"]
HEXES = ["", "0", "00000000", "a", "A", "68fd1e64", "68FD1E64", "7fffffff", "80000000", "fffffffe", "ffffffff",
         "FFFFFFFF", "100000000", "0123456789abcdef", "7fffffffffffffff", "8000000000000000", "ffffffffffffffff"]


def _session():
    import tensorflow as tf

    graph = tf.Graph()
    return graph, tf.compat.v1.Session(graph=graph)


def _random_hexes(rng, n):
    return [format(int(v), "x") for v in rng.integers(0, 2 ** 32, n, dtype=np.uint64)] + \
           [format(int(v), "016x") for v in rng.integers(0, 2 ** 63, n, dtype=np.uint64) * 2 + 1]


def test_numeric_and_hex_match_the_converter_on_edge_cases():
    import tensorflow as tf

    from modelzoo import criteo_serving as cs

    rng = np.random.default_rng(0)
    integers = INTEGERS + [str(v) for v in rng.integers(-10, 10 ** 9, 200)]
    hexes = HEXES + _random_hexes(rng, 100)
    graph, sess = _session()
    with graph.as_default(), sess:
        ints = tf.compat.v1.placeholder(tf.string, [None])
        hex_strings = tf.compat.v1.placeholder(tf.string, [None])
        logged, plain = cs.numeric(ints, True), cs.numeric(ints, False)
        values, present = cs.hex_values(hex_strings)
        buckets = {b: cs.hashed_ids(values, present, b) for b in (2, 1000, 2 ** 31 - 1)}
        got = sess.run([logged, plain, values, present, buckets], {ints: integers, hex_strings: hexes})
    column, hex_column = pa.array(integers), pa.array(hexes)
    np.testing.assert_array_equal(got[0], parse.numeric(column, True))
    np.testing.assert_array_equal(got[1], parse.numeric(column, False))
    expected_values, expected_present = parse.hex_values(hex_column)
    np.testing.assert_array_equal(got[2].view(np.uint64), expected_values)
    np.testing.assert_array_equal(got[3], expected_present)
    assert got[2].view(np.uint64)[HEXES.index("ffffffffffffffff")] == 2 ** 64 - 1
    for b, ids in got[4].items():
        np.testing.assert_array_equal(ids, vocab.hashed_ids(expected_values, expected_present, b))
    assert got[0][INTEGERS.index("")] == got[0][INTEGERS.index("-1")] == 0.0


def test_vocabulary_tables_match_the_converters_lookup(tmp_path):
    import tensorflow as tf

    from datasets import schema
    from modelzoo import criteo_serving as cs

    rng = np.random.default_rng(1)
    known = pa.array(HEXES[1:] + _random_hexes(rng, 50))
    values, _ = parse.hex_values(known)
    counter = vocab.FrequencyCounter()
    for i, name in enumerate(schema.CATEGORICAL):
        if name != "C26":  # C26 has no known value: every id is 0
            counter.update(name, np.concatenate([values, values[: 3 + i]]))
    vocabulary = counter.vocabulary(min_count=1)
    queries = HEXES + _random_hexes(rng, 20) + [h.upper() for h in known.to_pylist()[:10]]
    query_values, query_present = parse.hex_values(pa.array(queries))
    assets = cs.write_vocabulary_assets(vocabulary, str(tmp_path))
    assert assets["C26"] is None
    graph, sess = _session()
    with graph.as_default(), sess:
        strings = tf.compat.v1.placeholder(tf.string, [None])
        v, p = cs.hex_values(strings)
        ids = {name: cs.vocabulary_ids(v, p, assets[name], name) for name in ("C1", "C7", "C26")}
        sess.run(tf.compat.v1.tables_initializer())
        got = sess.run(ids, {strings: queries})
    for name, served in got.items():
        expected = vocabulary.lookup(name, query_values, query_present)
        np.testing.assert_array_equal(served, expected)
    expected = vocabulary.lookup("C1", query_values, query_present)
    assert expected[queries.index("")] == 0 and expected[queries.index("0")] > 0, "0 is a known value, '' missing"
    assert (expected == 0).sum() > 20 and (expected > 0).sum() > 20, "unseen values map to 0, known ones do not"


@pytest.mark.parametrize("column,value", [("I3", "+3"), ("I3", "1.5"), ("I3", "1234567890123456789"),
                                          ("C5", "xyz"), ("C5", "12345678901234567"), ("C5", " ab")])
def test_values_the_converter_rejects_fail_the_request_naming_the_column(column, value):
    import tensorflow as tf

    from modelzoo import criteo_serving as cs

    graph, sess = _session()
    with graph.as_default(), sess:
        strings = tf.compat.v1.placeholder(tf.string, [None])
        out = cs.numeric(strings, name=column) if column.startswith("I") else cs.hex_values(strings, column)[0]
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"{column} must be"):
            sess.run(out, {strings: ["1", value]})
    batch = pa.RecordBatch.from_pydict({name: ["1" if name == "label" else ""] for name in parse.schema.COLUMNS})
    batch = batch.set_column(parse.schema.COLUMNS.index(column), column, pa.array([value]))
    assert not parse.validate(batch)[0][0], "the converter rejects it too"


@pytest.mark.parametrize("options", [{"min_count": 2}, {"hash_buckets": 97}, {"min_count": 1, "log_transform": False}],
                         ids=["vocabulary", "hashed", "no-log"])
def test_the_receiver_gives_the_model_the_converted_rows(tmp_path, options):
    """The whole ``criteo_raw`` receiver on a converted directory: fed the TSV lines, its features equal the
    converter's Parquet rows exactly."""
    import pyarrow.parquet as pq
    import tensorflow as tf

    from datasets import schema
    from datasets.criteo.convert import convert_dataset
    from modelzoo.features import serving_input_receiver_fn
    from modelzoo.spec import criteo_spec
    from test_criteo_end_to_end import write_kaggle_tsv

    src = write_kaggle_tsv(tmp_path / "train.txt", 400, seed=3)
    lines = (tmp_path / "train.txt").read_text().splitlines()
    c1 = [line.split("\t")[14] for line in lines]
    frequent = max((v for v in set(c1) if v), key=c1.count)
    lines[0] = "\t".join(["1", "-7"] + [""] * 12 + [frequent.upper()] + [""] * 25)
    (tmp_path / "train.txt").write_text("\n".join(lines) + "\n")
    convert_dataset(src, str(tmp_path / "data"), test_fraction=0.25, progress=False, **options)
    meta = schema.read_meta(str(tmp_path / "data"))
    rows = pq.read_table([str(p) for p in sorted((tmp_path / "data").glob("*/part-*.parquet"), reverse=True)])
    receiver = serving_input_receiver_fn(criteo_spec(meta["cardinalities"]), "criteo_raw", str(tmp_path / "data"))
    graph, sess = _session()
    with graph.as_default(), sess:
        served = receiver()
        assert set(served.receiver_tensors) == set(schema.DENSE + schema.CATEGORICAL)
        sess.run(tf.compat.v1.tables_initializer())
        fields = [line.split("\t")[1:] for line in lines]
        got = sess.run(served.features, {served.receiver_tensors[name]: [f[i] for f in fields]
                                         for i, name in enumerate(schema.DENSE + schema.CATEGORICAL)})
    receiver.close()
    for name in schema.DENSE + schema.CATEGORICAL:
        np.testing.assert_array_equal(got[name], rows.column(name).to_numpy(), err_msg=name)
    assert got["I1"][0] == 0.0 and got["C1"][0] > 0, "a negative count is 0; upper-case hex is a value"


def test_criteo_raw_is_refused_where_it_cannot_map_values(tmp_path):
    from datasets import schema
    from modelzoo.features import serving_input_receiver_fn
    from modelzoo.spec import criteo_spec, movielens_spec

    spec = criteo_spec([10] * 26)
    with pytest.raises(ValueError, match="Criteo models"):
        serving_input_receiver_fn(movielens_spec(5, 5), "criteo_raw", str(tmp_path))
    with pytest.raises(ValueError, match="needs --data"):
        serving_input_receiver_fn(spec, "criteo_raw", None)
    schema.write_meta(str(tmp_path), [10] * 26, format="synthetic")
    with pytest.raises(ValueError, match="format 'synthetic'"):
        serving_input_receiver_fn(spec, "criteo_raw", str(tmp_path))
    schema.write_meta(str(tmp_path), [10] * 26, format="criteo", vocabulary=None, options={"hash_buckets": 11})
    with pytest.raises(ValueError, match="hashed into 11 buckets"):
        serving_input_receiver_fn(spec, "criteo_raw", str(tmp_path))
