"""The differential matrix: every public entry point, backend, worker count and optimizer against one process.

One launch per worker count runs every backend (``hb``, ``sok``,
``replicated`` and HybridBackend's API, ``hb-api``) with each optimizer on a
model that holds entry points of tests/workers/matrix_cases.py (a table made
outside ``embedding_scope()`` among them: a replicated variable whose sparse
gradient is averaged by allgather). Each
result is compared with plain single-process TensorFlow on the whole global
batch, started from the same logical tables: forward values and averaged
gradients of step 0, then tables, optimizer slots, dense weights and losses
after three steps. The inputs hold repeated ids, empty rows and negative ids
(dropped by the safe lookups), and hash keys of any int64 value.

Table-wise is an override on existing cells (``cases.TABLE_WISE_CELLS``: hb and
sok, N = 2 and 3, under both behaviours, and hb on 1 under TF1): there every table but SOK's own is
placed ``table_wise`` by ``sharding=`` (the planner spreads them over the
ranks; hash tables included) and is held to the same plain process.
Column-wise is one too (``cases.COLUMN_WISE_CELLS``: sok on 1 and hb on 2
workers under TF2 behaviour, hb on 3 and sok on 2 under TF1 behaviour): there every dense table but SOK's own is placed
``column_wise`` (each rank a slice of every row's dims) and is held to the
same plain process.

TF1 behaviour is an axis of the matrix: a second launch per worker count runs
the model with ``disable_v2_behavior()`` (ref variables, v1 control flow) on
every backend, trained with one of ``cases.TF1_OPTIMIZERS``. Each cell
(backend, N, behaviour) builds half the entry points (``cases.entries_for``),
the TF1 cell the other half than the TF2 cell of the same backend and N: so
each (backend, N) meets every entry point over the two behaviours, and within
a behaviour each backend meets every entry point over N and each N over the
backends. A cell is held to a plain process of the same entry points (the
same values whichever behaviour computes them).

Each cell (backend, N, behaviour) trains with the optimizers of
``cases.optimizers_for``, rotations: under TF2 one of GradientDescent,
Momentum and Ftrl and one of Adagrad and Adam (one update each on the
cell's model), under TF1 one of Adagrad and Adam, so that each backend and
each N meets all five under TF2 and the two adaptive ones under both. The
generated programs (tests/test_programs.py) draw optimizers (Ftrl aside),
backends, N and both behaviours beside them.
"""

import functools
import pathlib
import tempfile
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest

from collective.sharding.layouts.column_wise import column_bounds
from launcher import launch_once, load_rank_results, run_together, run_workers
from workers import matrix_cases as cases

BACKENDS, WORKERS = cases.BACKENDS, cases.WORKERS
BEHAVIOURS = ("tf2", "tf1")
RTOL, ATOL = 1e-4, 1e-5
pytestmark = pytest.mark.timeout(1200)


def _launch_one(n: int, behaviour: str) -> Dict[str, List[Dict[str, np.ndarray]]]:
    with tempfile.TemporaryDirectory(prefix=f"matrix-{n}-{behaviour}-") as out:
        args = [out, ",".join(BACKENDS)] + (["tf1"] if behaviour == "tf1" else [])
        run_workers("matrix_worker.py", n, args, timeout=1200)
        return {b: load_rank_results(pathlib.Path(out) / b, n) for b in BACKENDS}


LAUNCHES = [(n, behaviour) for behaviour in BEHAVIOURS for n in WORKERS]


@launch_once
def _every_launch() -> Dict[Tuple[int, str], Tuple[bool, Any]]:
    """Each (worker count, behaviour)'s outcome; the launches run at once (run_together)."""
    return dict(zip(LAUNCHES, run_together([functools.partial(_launch_one, *launch) for launch in LAUNCHES])))


def _launch(n: int, behaviour: str = "tf2") -> Dict[str, List[Dict[str, np.ndarray]]]:
    ok, value = _every_launch()[(n, behaviour)]
    if not ok:
        raise value
    return value


@functools.lru_cache(maxsize=None)
def _plain(optimizer: str, entries: Tuple[str, ...] = tuple(cases.ENTRY_POINTS)) -> cases.Plain:
    """The plain model of ``entries``; every optimizer's of one set of entry points shares one graph."""
    if entries == tuple(cases.ENTRY_POINTS):
        return cases.plain_model(optimizer)  # the logical tables' names and seeded initial values only
    return _plains(entries)[optimizer]


@functools.lru_cache(maxsize=None)
def _plains(entries: Tuple[str, ...]) -> Dict[str, cases.Plain]:
    return cases.plain_models(cases.OPTIMIZERS, entries)


def optimizers(backend: str, n: int, behaviour: str) -> Tuple[str, ...]:
    return cases.optimizers_for(backend, n, behaviour == "tf1")


def entries(backend: str, n: int, behaviour: str) -> Tuple[str, ...]:
    return cases.entries_for(backend, n, behaviour == "tf1")


def logical(ranks: List[Dict[str, np.ndarray]], key: str, table: str) -> np.ndarray:
    """The logical table (or gradient, or slot) ``key`` (``<optimizer>/...``) assembled from every rank's rows."""
    optimizer = key.split("/")[0]
    holder = int(ranks[0][f"{optimizer}/holder/{table}"])
    if holder >= 0:  # table_wise: the whole table on its holder, no rows elsewhere
        assert all(len(res[key]) == 0 for r, res in enumerate(ranks) if r != holder), f"{key}: rows off its holder"
        return ranks[holder][key]
    if bool(ranks[0][f"{optimizer}/columns/{table}"]):  # column_wise: every row on every rank, a slice of its dims
        bounds = column_bounds(int(ranks[0][f"{optimizer}/dim/{table}"]), len(ranks))
        for r, res in enumerate(ranks):
            assert res[key].shape[1:] == (bounds[r + 1] - bounds[r],), f"{key}: rank {r} holds {res[key].shape}"
        return np.concatenate([res[key] for res in ranks], axis=1)
    if bool(ranks[0][f"{optimizer}/replicated/{table}"]):
        for res in ranks[1:]:
            np.testing.assert_array_equal(res[key], ranks[0][key], err_msg=f"{key}: replicas differ")
        return ranks[0][key]
    n, shards = len(ranks), [res[key] for res in ranks]
    out = np.zeros((sum(len(s) for s in shards),) + shards[0].shape[1:], shards[0].dtype)
    for r, shard in enumerate(shards):
        out[r::n] = shard
    return out


def fixed_tables(backend: str, n: int, behaviour: str) -> List[str]:
    """The keys of the cell's tables that are not hash tables."""
    cell = entries(backend, n, behaviour)
    return [k for k in _plain(cases.OPTIMIZERS[0]).tables
            if k.split("#")[0] in cell and k.split("#")[0] not in cases.HASHED]


@functools.lru_cache(maxsize=None)
def expected(backend: str, n: int, optimizer: str, behaviour: str = "tf2") -> Dict[str, np.ndarray]:
    """Plain TensorFlow from this run's initial tables."""
    ranks = _launch(n, behaviour)[backend]
    initial = {t: logical(ranks, f"{optimizer}/init/{t}", t) for t in fixed_tables(backend, n, behaviour)}
    return cases.reference(_plain(optimizer, entries(backend, n, behaviour)), initial)


def _mismatches(pairs) -> List[str]:
    failures = []
    for what, got, want in pairs:
        try:
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
        except AssertionError as err:
            failures.append(f"{what}: {str(err).splitlines()[3] if len(str(err).splitlines()) > 3 else err}")
    return failures


RUNS = [(b, n, behaviour) for behaviour in BEHAVIOURS for b in BACKENDS for n in WORKERS]
IDS = [f"{b}-{n}workers" + ("-tf1" if behaviour == "tf1" else "") for b, n, behaviour in RUNS]
TRAINED = [(b, n, behaviour, opt) for b, n, behaviour in RUNS for opt in optimizers(b, n, behaviour)]
TRAINED_IDS = [f"{opt}-{b}-{n}workers" + ("-tf1" if behaviour == "tf1" else "") for b, n, behaviour, opt in TRAINED]


@pytest.mark.parametrize("backend, n, behaviour", RUNS, ids=IDS)
def test_forward_values_equal_one_process(backend, n, behaviour):
    first = optimizers(backend, n, behaviour)[0]
    ranks, want = _launch(n, behaviour)[backend], expected(backend, n, first, behaviour)
    per = cases.BATCH // n
    pairs = [(f"{entry} rank {r}", res[f"{first}/out/{entry}"],
              want[f"out/{entry}"][r * per:(r + 1) * per])
             for entry in entries(backend, n, behaviour) for r, res in enumerate(ranks)]
    failures = _mismatches(pairs)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("backend, n, behaviour", RUNS, ids=IDS)
def test_averaged_gradients_equal_one_process(backend, n, behaviour):
    opt = optimizers(backend, n, behaviour)[0]
    ranks, want = _launch(n, behaviour)[backend], expected(backend, n, opt, behaviour)
    pairs = []
    for table in fixed_tables(backend, n, behaviour):
        got = logical(ranks, f"{opt}/grad/{table}", table)
        pairs.append((table, got[:len(want[f"grad/{table}"])], want[f"grad/{table}"]))
        assert np.abs(want[f"grad/{table}"]).sum() > 0, f"{table} gets no gradient: the comparison proves nothing"
    for name in ("head_w", "head_b"):
        pairs += [(f"{name} rank {r}", res[f"{opt}/grad/{name}"], want[f"grad/{name}"]) for r, res in enumerate(ranks)]
    failures = _mismatches(pairs)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("backend, n, behaviour, optimizer", TRAINED, ids=TRAINED_IDS)
def test_weights_and_slots_after_three_steps_equal_one_process(backend, n, behaviour, optimizer):
    ranks, want = _launch(n, behaviour)[backend], expected(backend, n, optimizer, behaviour)
    np.testing.assert_allclose(np.mean([res[f"{optimizer}/losses"] for res in ranks], axis=0), want["losses"],
                               rtol=RTOL)
    pairs = []
    for table in fixed_tables(backend, n, behaviour):
        rows = len(want[f"final/{table}"])
        pairs.append((table, logical(ranks, f"{optimizer}/final/{table}", table)[:rows], want[f"final/{table}"]))
        slots = [k for k in want if k.startswith(f"slot/{table}/")]
        for slot in slots:
            pairs.append((slot, logical(ranks, f"{optimizer}/{slot}", table)[:rows], want[slot]))
        assert not np.allclose(want[f"final/{table}"], logical(ranks, f"{optimizer}/init/{table}", table)[:rows]), \
            f"{table} did not train: the comparison proves nothing"
    for name in ("head_w", "head_b"):
        pairs += [(f"{name} rank {r}", res[f"{optimizer}/final/{name}"], want[f"final/{name}"])
                  for r, res in enumerate(ranks)]
    failures = _mismatches(pairs)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("backend, n, behaviour, optimizer", TRAINED, ids=TRAINED_IDS)
def test_hash_tables_hold_each_key_once_with_one_process_vectors(backend, n, behaviour, optimizer):
    ranks, want = _launch(n, behaviour)[backend], expected(backend, n, optimizer, behaviour)
    pairs = []
    hashed = [entry for entry in cases.HASHED if entry in entries(backend, n, behaviour)]
    assert hashed, "the cell holds no hash table: the test proves nothing"
    for entry in hashed:
        table = cases.table_key(entry, 0)
        keys = np.concatenate([res[f"{optimizer}/hash_keys/{table}"] for res in ranks])
        values = np.concatenate([res[f"{optimizer}/hash_values/{table}"] for res in ranks])
        assert sorted(keys.tolist()) == cases.keys_used(entry).tolist(), entry
        holder = int(ranks[0][f"{optimizer}/holder/{table}"])
        for r, res in enumerate(ranks):
            held = res[f"{optimizer}/hash_keys/{table}"]
            owner = np.mod(held, n) if holder < 0 else np.full_like(held, holder)
            assert np.all(owner == r), f"{entry}: rank {r} holds keys of another rank"
        pairs.append((entry, values, want[f"final/{table}"][np.searchsorted(cases.KEY_POOL, keys)]))
    failures = _mismatches(pairs)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("backend, n, tf1", sorted(cases.TABLE_WISE_CELLS))
def test_table_wise_cells_hold_each_table_whole_on_one_rank(backend, n, tf1):
    """The override axis is real: in its cells every table but SOK's own (hash tables included) is held whole
    by one rank, the tables spread over every rank, while SOK's stay row-wise (and a table made outside
    embedding_scope() stays an ordinary replicated variable)."""
    behaviour = "tf1" if tf1 else "tf2"
    ranks, opt = _launch(n, behaviour)[backend], optimizers(backend, n, behaviour)[0]
    cell = entries(backend, n, behaviour)
    holders = {table: int(ranks[0][f"{opt}/holder/{table}"]) for table in _plain(cases.OPTIMIZERS[0]).tables
               if table.split("#")[0] in cell}
    kept = {t for t in holders if t.split("#")[0] in cases.SOK_TABLES + cases.NOT_PLANNED}
    assert all(holders[t] == -1 for t in kept) and sorted(set(holders[t] for t in holders if t not in kept)) == \
        list(range(n)), holders
    if "ev_column" in cell:  # DeepRec's hash-table column
        assert holders[cases.table_key("ev_column", 0)] >= 0, holders


@pytest.mark.parametrize("backend, n, tf1", sorted(cases.COLUMN_WISE_CELLS))
def test_column_wise_cells_slice_each_dense_table_by_columns(backend, n, tf1):
    """The column-wise axis is real: in its cells every dense table but SOK's own is held column-wise (each
    rank its slice of every row: ``logical`` checks the widths), while hash and SOK's tables keep their
    placement and a table made outside embedding_scope() stays an ordinary variable."""
    behaviour = "tf1" if tf1 else "tf2"
    ranks, opt = _launch(n, behaviour)[backend], optimizers(backend, n, behaviour)[0]
    cell = entries(backend, n, behaviour)
    sliced = {table: bool(ranks[0][f"{opt}/columns/{table}"]) for table in _plain(cases.OPTIMIZERS[0]).tables
              if table.split("#")[0] in cell}
    kept = {t for t in sliced if t.split("#")[0] in cases.SOK_TABLES + cases.NOT_PLANNED + cases.HASHED}
    assert len(sliced) > len(kept) and all(sliced[t] != (t in kept) for t in sliced), sliced
    for table in sliced:
        if sliced[table]:
            assert logical(ranks, f"{opt}/init/{table}", table).shape[1] == cases.DIM, table


@pytest.mark.parametrize("backend, n, behaviour", RUNS, ids=IDS)
def test_seeded_and_constant_tables_start_as_in_one_process(backend, n, behaviour):
    """A seeded initializer gives the same logical table on any N; the unseeded ones need only agree with it."""
    ranks, plain = _launch(n, behaviour)[backend], _plain(cases.OPTIMIZERS[0])
    first = optimizers(backend, n, behaviour)[0]
    pairs = []
    for table in fixed_tables(backend, n, behaviour):
        if table.split("#")[0] in cases.SEEDED:
            pairs.append((table, logical(ranks, f"{first}/init/{table}", table), plain.initial[table]))
    assert len(pairs) >= 9
    failures = _mismatches(pairs)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
@pytest.mark.parametrize("n", WORKERS)
@pytest.mark.parametrize("backend", BACKENDS[:3])
def test_negative_and_out_of_range_ids_are_refused_naming_the_table(backend, n, behaviour):
    res = _launch(n, behaviour)[backend][0]
    for entry in ("embedding_lookup", "embedding_lookup_sparse", "group_embedding_lookup_sparse", "sok_layer"):
        table = "sok_table" if entry == "sok_layer" else "user_table"
        for kind in ("negative", "too_large"):
            message = str(res[f"err/{entry}/{kind}"])
            assert f"embedding table {table}" in message and "ids outside [0," in message, (entry, kind, message)
