"""The numpy references of collective.kernels against straightforward computations."""

import collections

import numpy as np
import pytest

from collective.kernels import (
    EMPTY_KEY,
    HashTable,
    HashTableFullError,
    hash_slots,
    partition,
    segment_combine,
    segment_combine_grad,
    unique,
)

I64 = np.iinfo(np.int64)
EDGE_IDS = np.array([0, -1, 1, I64.max, I64.min, I64.min + 1, I64.max - 1, -7, 7, 0, I64.min], dtype=np.int64)


def _random_ids(seed, n=2000, low=-50, high=50):
    return np.random.default_rng(seed).integers(low, high, size=n, dtype=np.int64)


# ---------------------------------------------------------------- partition


@pytest.mark.parametrize("num_buckets", [1, 2, 3, 7, 64])
@pytest.mark.parametrize("ids", [_random_ids(0), EDGE_IDS, np.arange(-20, 20)], ids=["random", "edge", "range"])
def test_partition_matches_per_bucket_lists(ids, num_buckets):
    buckets = collections.defaultdict(list)
    for position, value in enumerate(ids.tolist()):
        buckets[value % num_buckets].append((value, position))  # Python's floor modulo
    expected_ids = [v for b in range(num_buckets) for v, _ in buckets[b]]
    expected_from = [p for b in range(num_buckets) for _, p in buckets[b]]

    bucketed, counts, restore = partition(ids, num_buckets)

    assert bucketed.dtype == np.int64 and counts.dtype == np.int64 and restore.dtype == np.int64
    assert bucketed.tolist() == expected_ids
    assert counts.tolist() == [len(buckets[b]) for b in range(num_buckets)]
    assert np.array_equal(bucketed[restore], ids)
    assert sorted(restore.tolist()) == list(range(len(ids)))
    assert [expected_from[p] for p in restore.tolist()] == list(range(len(ids)))


def test_partition_agrees_with_stable_argsort_of_floormod():
    ids = _random_ids(1, n=5000, low=-(10**12), high=10**12)
    order = np.argsort(np.floor_divide(ids, 1) - 5 * np.floor_divide(ids, 5), kind="stable")
    bucketed, counts, _ = partition(ids, 5)
    assert np.array_equal(bucketed, ids[order])
    assert counts.sum() == len(ids)


def test_partition_empty_input():
    bucketed, counts, restore = partition(np.array([], dtype=np.int64), 4)
    assert bucketed.shape == (0,) and restore.shape == (0,)
    assert counts.tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("bad", [0, -2])
def test_partition_refuses_bucket_counts_below_one(bad):
    with pytest.raises(ValueError, match="num_buckets must be >= 1"):
        partition([1, 2], bad)


def test_partition_refuses_floats_and_2d():
    with pytest.raises(TypeError, match="integers"):
        partition(np.array([1.0]), 2)
    with pytest.raises(ValueError, match="1-D"):
        partition(np.zeros((2, 2), dtype=np.int64), 2)


# ------------------------------------------------------------------- unique


@pytest.mark.parametrize("ids", [_random_ids(2), EDGE_IDS, np.array([3, 3, 3]), np.array([9])], ids=["random", "edge", "same", "one"])
def test_unique_matches_dict(ids):
    index, counts = {}, collections.Counter()
    for value in ids.tolist():
        index.setdefault(value, len(index))
        counts[value] += 1

    uniques, inverse, got_counts = unique(ids)

    assert uniques.tolist() == list(index)
    assert inverse.tolist() == [index[v] for v in ids.tolist()]
    assert got_counts.tolist() == [counts[v] for v in index]
    assert uniques.dtype == inverse.dtype == got_counts.dtype == np.int64


def test_unique_agrees_with_np_unique_as_sets():
    ids = _random_ids(3, n=10000, low=0, high=3000)
    uniques, inverse, counts = unique(ids)
    sorted_uniques, sorted_counts = np.unique(ids, return_counts=True)
    order = np.argsort(uniques)
    assert np.array_equal(uniques[order], sorted_uniques)
    assert np.array_equal(counts[order], sorted_counts)
    assert np.array_equal(uniques[inverse], ids)


def test_unique_empty_input():
    uniques, inverse, counts = unique(np.array([], dtype=np.int64))
    assert uniques.shape == inverse.shape == counts.shape == (0,)


# --------------------------------------------------------------- hash table


def _colliding_keys(num_slots, count, home=0):
    """``count`` keys whose home slot is ``home`` in a table of ``num_slots`` slots."""
    candidates = np.arange(0, 200000, dtype=np.int64)
    found = candidates[hash_slots(candidates, num_slots) == home]
    assert len(found) >= count
    return found[:count]


def test_hash_slots_is_murmur3_fmix64():
    def fmix64(k):
        k &= 2**64 - 1
        k ^= k >> 33
        k = (k * 0xFF51AFD7ED558CCD) & (2**64 - 1)
        k ^= k >> 33
        k = (k * 0xC4CEB9FE1A85EC53) & (2**64 - 1)
        k ^= k >> 33
        return k

    keys = EDGE_IDS
    assert hash_slots(keys, 1024).tolist() == [fmix64(int(k)) % 1024 for k in keys.tolist()]


def test_hash_table_matches_dict_over_batches():
    table = HashTable(capacity=800, load_factor=0.5)
    rows_of = {}
    rng = np.random.default_rng(4)
    for _ in range(5):
        batch = rng.integers(-400, 400, size=300, dtype=np.int64)
        for key in batch.tolist():
            rows_of.setdefault(key, len(rows_of))
        assert table.insert_or_find(batch).tolist() == [rows_of[k] for k in batch.tolist()]
        assert table.size == len(rows_of)
    probe = np.arange(-500, 500, dtype=np.int64)
    assert table.find(probe).tolist() == [rows_of.get(k, -1) for k in probe.tolist()]
    keys, rows = table.export()
    assert keys.tolist() == list(rows_of) and rows.tolist() == list(range(len(rows_of)))


def test_hash_table_collisions_probe_linearly_and_wrap_around():
    table = HashTable(capacity=16, load_factor=1.0)
    assert table.num_slots == 16
    keys = _colliding_keys(16, 6, home=14)  # fills slots 14, 15, 0, 1, 2, 3
    assert table.insert_or_find(keys).tolist() == list(range(6))
    assert table.find(keys[::-1]).tolist() == list(range(5, -1, -1))
    others = _colliding_keys(16, 10, home=14)[6:]
    assert table.find(others).tolist() == [-1] * 4
    assert table.insert_or_find(np.concatenate([others, keys])).tolist() == [6, 7, 8, 9] + list(range(6))


def test_hash_table_extreme_and_negative_keys():
    table = HashTable(capacity=len(EDGE_IDS))
    expected = {}
    for key in EDGE_IDS.tolist():
        expected.setdefault(key, len(expected))
    assert table.insert_or_find(EDGE_IDS).tolist() == [expected[k] for k in EDGE_IDS.tolist()]
    assert table.find([EMPTY_KEY, I64.max, -1, 12345]).tolist() == [expected[I64.min], expected[I64.max], expected[-1], -1]


def test_hash_table_full_raises_and_leaves_table_unchanged():
    table = HashTable(capacity=4, load_factor=1.0)
    table.insert_or_find([1, 2, 3])
    with pytest.raises(HashTableFullError, match=r"capacity 4 rows, 3 in use.*2 new keys.*raise the table's capacity") as info:
        table.insert_or_find([1, 4, 5, 4])
    assert (info.value.capacity, info.value.size, info.value.new_keys) == (4, 3, 2)
    assert table.size == 3 and table.find([4, 5]).tolist() == [-1, -1]
    assert table.insert_or_find([3, 4]).tolist() == [2, 3]  # exactly full is fine
    with pytest.raises(HashTableFullError):
        table.insert_or_find([EMPTY_KEY])


def test_hash_table_empty_batches():
    table = HashTable(capacity=2)
    assert table.insert_or_find(np.array([], dtype=np.int64)).shape == (0,)
    assert table.find(np.array([], dtype=np.int64)).shape == (0,)
    assert table.size == 0 and table.export()[0].shape == (0,)


@pytest.mark.parametrize("capacity, load_factor, slots", [(1, 0.5, 2), (5, 0.5, 16), (8, 1.0, 8), (100, 0.75, 256)])
def test_hash_table_slot_count(capacity, load_factor, slots):
    assert HashTable(capacity, load_factor).num_slots == slots


@pytest.mark.parametrize("capacity, load_factor", [(0, 0.5), (4, 0.0), (4, 1.5)])
def test_hash_table_refuses_bad_shapes(capacity, load_factor):
    with pytest.raises(ValueError):
        HashTable(capacity, load_factor)


# ---------------------------------------------------------------- combiners


def _explicit_combine(values, seg, num_segments, weights, combiner):
    out = np.zeros((num_segments, values.shape[1]))
    w = np.ones(len(seg)) if weights is None else weights
    for s in range(num_segments):
        members = [i for i in range(len(seg)) if seg[i] == s]
        total = sum((w[i] * values[i] for i in members), np.zeros(values.shape[1]))
        divisor = {"sum": 1.0, "mean": sum(w[i] for i in members), "sqrtn": np.sqrt(sum(w[i] ** 2 for i in members))}[combiner]
        out[s] = total / divisor if members and divisor != 0 else 0.0
    return out


def _segment_case(seed, rows=40, dim=5, num_segments=9):
    rng = np.random.default_rng(seed)
    values = rng.normal(size=(rows, dim))
    seg = rng.integers(0, num_segments - 2, size=rows)  # the last two segments stay empty
    weights = rng.uniform(0.1, 2.0, size=rows)
    return values, seg, num_segments, weights


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
def test_segment_combine_matches_explicit_formula(combiner, weighted):
    values, seg, num_segments, weights = _segment_case(5)
    w = weights if weighted else None
    got = segment_combine(values, seg, num_segments, w, combiner)
    np.testing.assert_allclose(got, _explicit_combine(values, seg, num_segments, w, combiner), rtol=1e-12, atol=1e-12)
    assert np.all(got[-2:] == 0)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_segment_combine_float32_keeps_dtype(combiner):
    values, seg, num_segments, weights = _segment_case(6)
    got = segment_combine(values.astype(np.float32), seg, num_segments, weights, combiner)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, _explicit_combine(values, seg, num_segments, weights, combiner), rtol=1e-5, atol=1e-5)


def test_segment_combine_zero_weight_segment_gives_zeros():
    values = np.ones((2, 3))
    got = segment_combine(values, [0, 0], 1, weights=np.zeros(2), combiner="mean")
    assert np.all(got == 0)


def test_segment_combine_empty_input():
    got = segment_combine(np.zeros((0, 4), np.float32), np.zeros(0, np.int64), 3, combiner="mean")
    assert got.shape == (3, 4) and not got.any()
    assert segment_combine_grad(np.ones((3, 4)), np.zeros(0, np.int64)).shape == (0, 4)


def test_segment_combine_rejects_bad_input():
    with pytest.raises(ValueError, match=r"segment id 3 is outside \[0, 3\)"):
        segment_combine(np.ones((2, 1)), [0, 3], 3)
    with pytest.raises(ValueError, match="segment id -1"):
        segment_combine_grad(np.ones((3, 1)), [-1, 0])
    with pytest.raises(ValueError, match="not one of sum, mean, sqrtn"):
        segment_combine(np.ones((2, 1)), [0, 1], 3, combiner="max")
    with pytest.raises(ValueError, match="one per row"):
        segment_combine(np.ones((2, 1)), [0], 3)
    with pytest.raises(TypeError, match="float32 or float64"):
        segment_combine(np.ones((2, 1), dtype=np.int32), [0, 1], 3)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
def test_segment_combine_grad_matches_finite_differences(combiner, weighted):
    values, seg, num_segments, weights = _segment_case(7, rows=12, dim=3, num_segments=5)
    w = weights if weighted else None
    upstream = np.random.default_rng(8).normal(size=(num_segments, values.shape[1]))

    def loss(v):
        return float(np.sum(segment_combine(v, seg, num_segments, w, combiner) * upstream))

    eps = 1e-6
    numeric = np.zeros_like(values)
    for index in np.ndindex(values.shape):
        bumped = values.copy()
        bumped[index] += eps
        dropped = values.copy()
        dropped[index] -= eps
        numeric[index] = (loss(bumped) - loss(dropped)) / (2 * eps)
    analytic = segment_combine_grad(upstream, seg, w, combiner)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-8)


def test_segment_combine_grad_explicit_mean_formula():
    grad = np.array([[1.0, 2.0], [3.0, 4.0]])
    got = segment_combine_grad(grad, [1, 0, 1], weights=[1.0, 2.0, 3.0], combiner="mean")
    np.testing.assert_allclose(got, [[0.75, 1.0], [1.0, 2.0], [2.25, 3.0]])
