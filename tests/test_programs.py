"""Generated user programs live a whole life on N, then M workers, against one plain TensorFlow process.

Hypothesis draws programs from a grammar of what users write around our API
(:func:`programs`):

- 1-2 tables with vocabularies smaller than N and not divisible by N, each
  reached through ``tf.nn.embedding_lookup``, ``tf.nn.embedding_lookup_sparse``
  (sum, mean), a Keras ``Embedding`` layer, or a feature column of
  ``input_layer``: ``embedding_column``, a weighted column,
  ``shared_embedding_columns`` over two features, or a hash column
  (``collective.hash_embedding_column.categorical_column_with_embedding``)
  with or without a ``fixed_size_partitioner`` variable scope; a variable
  table with or without a regularizer, made inside ``embedding_scope()`` or
  outside it;
- a dense head named ``head`` or after a table, with or without a regularizer;
- an optimizer of ``tf.compat.v1.train``, ``hb.train`` or legacy Keras (not
  Keras' new optimizers: they train nothing in a session), built inside or
  outside the scope, called through ``minimize``,
  ``compute_gradients`` + ``apply_gradients`` or ``tf.gradients`` +
  ``apply_gradients``, with ``clip_by_global_norm``, ``clip_by_value``, a
  scaling or Keras' ``global_clipnorm`` or ``clipnorm`` between; a mean or summed loss;
- each table's placement: ``row_wise`` (the default), ``table_wise`` or ``column_wise``, applied where the
  table can take it on the launch's workers (``program_cases.placement``), so a program resumed on M
  workers restores into the plan M gives it;
- TF1 behaviour (``disable_v2_behavior``: ref variables) or TF2's; the backend;
- the engine: a raw session with ``collective.checkpoint.Saver``,
  ``MonitoredTrainingSession`` (``hb.train``'s for the ``hb.train``
  optimizers, HybridBackend's recipe) or ``strategy.estimator``;
- N from 1 to 3 workers, and M: 0 (the program's life ends with its first
  checkpoint) or the 1 to 3 workers it resumes on.

The life (tests/workers/program_life.py): ``STEPS`` steps on N workers and a
full checkpoint, then for a program that lives on one more step saved as a
delta; its newest complete chain restored on M workers, 2 more steps, a full
checkpoint, an export (``strategy.export_saved_model`` or the Estimator's
``export_saved_model``), one more step saved as a delta and a serving update
(``update_saved_model``). One plain process lives the same life on the global
batches; a program fails where a table (hash tables aside) or dense weight of
the plain process did not move in its first life: it could not fail on training.
Compared: every step's loss (the workers' mean); after the first life
the tables, slots and dense weights (not an Estimator's); each full checkpoint
restored by TensorFlow's own ``Saver`` in the plain process at the checkpoint's
step against its own values (a hash column's keys, rows and slot rows, read with
``tf.train.load_variable``, against its stand-in's rows of those keys); and the
predictions plain TensorFlow serves from versions 1 and 2
(``tf.compat.v1.saved_model.load`` in this process) against the plain
process's after the same steps.

Launches: one per N runs every program's first life (and the plain process of
those that end there); one per M runs the second lives of the programs resumed
on M (and their plain process): at most 6 launches. Each example costs a share
of a launch, so the programs are drawn up front (no shrinking): a failure
prints the whole program. CI runs the defects' programs (``REGRESSIONS``; issue 44's with ``packing``: packed
tables whatever ``COLLECTIVE_PACKING`` says),
three whole lives (``LIVES_ALWAYS``: each engine, each TF behaviour, every model
kind) and ``COLLECTIVE_PROGRAMS`` (default 10) programs drawn with seed
``COLLECTIVE_PROGRAMS_SEED`` (default 2028), of which the first
``COLLECTIVE_PROGRAM_LIVES`` (default 2) keep their drawn second life (the CPU
budget: a whole life costs about ten first lives). With 6 or more, three more
whole lives run (``LIVES_MORE``: each engine under both behaviours). A longer
search by hand, every drawn program living its whole life::

    COLLECTIVE_PROGRAMS=300 COLLECTIVE_PROGRAM_LIVES=300 COLLECTIVE_PROGRAMS_SEED=$RANDOM \
        nice .venv/bin/python -m pytest -q tests/test_programs.py

The grammar refuses what fails today for a reason outside this file, each named
where it is refused (issue 42's note reports them).
"""

import atexit
import json
import os
import pathlib
import shutil
import tempfile
from typing import Dict, List

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from collective.sharding.layouts.column_wise import column_bounds
from launcher import launch_once, load_rank_results, run_workers
from workers import program_cases, program_life

COUNT = int(os.environ.get("COLLECTIVE_PROGRAMS", "10"))
SEED = int(os.environ.get("COLLECTIVE_PROGRAMS_SEED", "2028"))
# How many of the drawn programs live on after their first checkpoint (resume on M workers, export, update).
LIVES = int(os.environ.get("COLLECTIVE_PROGRAM_LIVES", "2"))
RTOL, ATOL = 1e-4, 1e-5
NAMES = ("item", "user", "category")
# Where a table lives (program_cases.placement: drawn, applied where legal on the launch's workers).
PLACEMENTS = ("row_wise", "table_wise", "column_wise")
ENTRIES = ("lookup", "sparse_sum", "sparse_mean", "keras_embedding", "column", "weighted_column", "shared_column",
           "hash_column")
# Keras' new optimizers (tf.keras.optimizers.*, not .legacy) train nothing in a graph run by a session (their
# apply_gradients returns only `iterations`' update; docs/support.md), and every engine here is one: not drawn.
CALLS = {"v1": ("minimize", "compute_apply", "tf_gradients"), "hb": ("minimize", "compute_apply", "tf_gradients"),
         "keras_legacy": ("tf_gradients",)}
# Transforms between computing and applying: after compute_gradients any; gradients of tf.gradients are not
# averaged until apply_gradients (docs/support.md), so only transforms that commute with averaging go there.
TRANSFORMS = {"compute_apply": ("none", "clip_global", "clip_value", "scale"), "minimize": ("none",),
              "tf_gradients": ("none", "scale")}
# The first test waits for up to four launches; a longer search's launches run longer.
pytestmark = pytest.mark.timeout(900 + 120 * COUNT)
# Each program's model_dir and exports, from its first launch (N workers) to its second (M workers).
WORK = pathlib.Path(tempfile.mkdtemp(prefix="programs-"))
atexit.register(shutil.rmtree, WORK, ignore_errors=True)


@st.composite
def _table_spec(draw, name: str) -> dict:
    entry = draw(st.sampled_from(ENTRIES))
    plain_variable = entry in ("lookup", "sparse_sum", "sparse_mean")
    spec = {"name": name, "vocab": draw(st.sampled_from((1, 2, 5, 7, 13))), "dim": draw(st.sampled_from((2, 3))),
            "entry": entry, "regularizer": draw(st.sampled_from((0.0, 0.05))) if plain_variable else 0.0,
            "outside": plain_variable and draw(st.sampled_from((False, False, True))),
            "placement": draw(st.sampled_from(PLACEMENTS))}
    if entry == "hash_column":
        spec["vocab"] = len(program_cases.KEY_POOL)
        spec["partitioner"] = draw(st.booleans())
    return spec


@st.composite
def programs(draw) -> dict:
    """One user program (see program_cases and program_life)."""
    names = draw(st.permutations(NAMES))[:draw(st.integers(1, 2))]
    tables = [draw(_table_spec(name)) for name in names]
    family = draw(st.sampled_from(tuple(CALLS)))
    # Keras optimizers (legacy too) make slots of reference variables wrongly, and those of TF 2.11+ refuse
    # them: TF1 behaviour (no resource variables) fails with them in one process too.
    tf1 = False if family.startswith("keras") else draw(st.booleans())
    call = draw(st.sampled_from(CALLS[family]))
    keras_clips = ("keras_clipnorm", "keras_clipnorm_each")  # global_clipnorm, clipnorm
    transforms = TRANSFORMS[call] + (keras_clips if family.startswith("keras") else ())
    # HybridBackend's optimizers run in its own MonitoredTrainingSession (its recipe); an Estimator's model_fn
    # builds the optimizer where it builds the model.
    engines = ("session", "mts", "estimator")
    engine = "mts" if family == "hb" else draw(st.sampled_from(engines))
    program = {
        "seed": draw(st.integers(0, 10_000)),
        "workers": 1,
        "resume": draw(st.sampled_from((0, 1, 2, 3))),
        "backend": draw(st.sampled_from(("hb", "sok", "replicated"))),
        "engine": engine,
        "tables": tables,
        "dense_name": draw(st.sampled_from(("head",) + tuple(names))),
        "dense_regularizer": draw(st.sampled_from((0.0, 0.05))),
        "optimizer": {"family": family, "kind": draw(st.sampled_from(("sgd", "adagrad", "adam", "momentum"))),
                      "where": "inside" if engine == "estimator" else draw(st.sampled_from(("inside", "outside"))),
                      "call": call},
        "transform": draw(st.sampled_from(transforms)),
        "clip": draw(st.sampled_from((0.05, 0.5))),
        # A summed loss can diverge within a whole life; the Estimator's NanTensorHook then stops training.
        "reduction": "mean" if engine == "estimator" else draw(st.sampled_from(("mean", "sum"))),
        "tf1": tf1,
    }
    # Refused by the library (issue 42): clip_by_global_norm outside the scope (HybridBackend's recipe builds the
    # update outside hb.scope()) is TensorFlow's own norm of this worker's slices (test_api_hb tests the refusal).
    if family == "hb" and program["optimizer"]["where"] == "outside" and program["transform"] == "clip_global":
        program["transform"] = "clip_value"
    return program


def draw_programs(count: int, seed_value: int) -> List[dict]:
    """``count`` distinct programs drawn with a fixed seed (none for 0: the named programs alone)."""
    found: Dict[str, dict] = {}
    if count == 0:
        return []

    @settings(max_examples=count, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @seed(seed_value)
    @given(programs())
    def collect(program):
        found.setdefault(json.dumps(program, sort_keys=True), program)

    collect()
    drawn = list(found.values())
    for i, program in enumerate(drawn):  # as many programs on 2 and 3 workers as on 1, whatever was drawn
        program["workers"] = (2, 3, 1)[i % 3]
        if i >= LIVES:  # the CPU budget: the others' life ends with their first checkpoint
            program["resume"] = 0
    return drawn


def _program(workers: int = 2, backend: str = "hb", tables=None, family: str = "v1", kind: str = "sgd",
             where: str = "inside", call: str = "minimize", **rest) -> dict:
    program = {"seed": 11, "workers": workers, "backend": backend, "dense_name": "head", "dense_regularizer": 0.0,
               "tables": tables or [_table()], "transform": "none", "clip": 0.05, "reduction": "mean", "tf1": False,
               "optimizer": {"family": family, "kind": kind, "where": where, "call": call}}
    program.update(rest)
    return program


def _table(name: str = "item", vocab: int = 7, entry: str = "lookup", regularizer: float = 0.0,
           outside: bool = False, **extra) -> dict:
    return {"name": name, "vocab": vocab, "dim": 3, "entry": entry, "regularizer": regularizer, "outside": outside,
            **extra}


def _hash(name: str, partitioner: bool) -> dict:
    return _table(name, len(program_cases.KEY_POOL), "hash_column", partitioner=partitioner)


def _column_wise_beside(backend: str, n: int) -> List[dict]:
    """A column-wise table beside the row-wise ones of two clip_by_global_norm programs (issue 43): one process's
    norm counts each worker's slice of every row once."""
    return [_table("category", 13, "sparse_mean", placement="column_wise")] if (backend, n) in (("hb", 3), ("sok", 2)) \
        else []


# The defects of issue 28 and its acceptance lines, as programs: each failed before its fix.
REGRESSIONS = {
    "tf1-sparse-gradient-outside-embedding-scope": _program(tf1=True, tables=[_table(outside=True), _table("user")],
                                                            call="compute_apply"),
    "dense-layer-named-after-table": _program(dense_name="item", kind="adam"),
    "hb-adagrad-built-outside-hb-scope-vocab-7": _program(family="hb", kind="adagrad", where="outside", tf1=True),
    "table-regularizer": _program(tables=[_table(regularizer=0.05), _table("user", 13, "sparse_mean", 0.05)]),
    "summed-loss": _program(reduction="sum", kind="momentum"),
    "keras-legacy-sgd-apply": _program(family="keras_legacy", call="tf_gradients", kind="momentum"),
    "keras-legacy-adam-apply": _program(family="keras_legacy", call="tf_gradients", kind="adam"),
    "keras-legacy-sgd-global-clipnorm-apply": _program(family="keras_legacy", call="tf_gradients", kind="momentum",
                                                       transform="keras_clipnorm"),
    "keras-legacy-adagrad-apply-3-workers": _program(workers=3, family="keras_legacy", call="tf_gradients",
                                                     kind="adagrad"),
    # Issue 42's: tf.gradients' ungated updates raced its backward pass's reads of reference variables (TF1
    # behaviour); a weighted lookup's norm counted one slice per id; tf.gradients' table gradients had no norm.
    "tf1-tf-gradients-apply-1-worker": _program(workers=1, tf1=True, call="tf_gradients",
                                                tables=[_table(entry="column"), _table("user", 7, "sparse_sum")]),
    "tf1-weighted-column-beside-hash-clip-global-2-workers": _program(
        tf1=True, call="compute_apply", transform="clip_global", kind="adagrad",
        tables=[_table(vocab=5, entry="weighted_column"), _hash("user", True)]),
    "keras-legacy-global-clipnorm-column-2-workers": _program(
        family="keras_legacy", call="tf_gradients", kind="adam", transform="keras_clipnorm",
        tables=[_table(), _table("user", 5, "column"), _table("category", 13, "sparse_mean", placement="column_wise")]),
    # A table with fewer rows than workers is an ordinary variable: apply_gradients' averaging of its tf.gradients
    # gradient made a new tensor without the norm tf.gradients attached, so Keras' global_clipnorm took the averaged
    # rows' norm, not one process's slices' (0.6% at step 2; seed 4074's p31 drawn with seed 2028).
    "keras-legacy-global-clipnorm-tables-of-1-row-2-workers": _program(
        family="keras_legacy", call="tf_gradients", kind="adagrad", transform="keras_clipnorm", clip=0.5,
        tables=[_table(vocab=1, entry="keras_embedding"), _table("user", 1, "shared_column")]),
    # A regularizer makes a sharded table's tf.gradients gradient dense; with no sparse gradient beside it, legacy
    # Keras' apply_gradients passes every gradient through one IdentityN (its replica sum), and global_clipnorm took
    # this worker's rows' norm, not the norm attached before (seed 8030's p84/p85: 0.2% at step 2).
    "keras-legacy-global-clipnorm-regularized-table-2-workers": _program(
        family="keras_legacy", call="tf_gradients", kind="adagrad", transform="keras_clipnorm",
        tables=[_table(entry="sparse_mean", regularizer=0.05)]),
    # Keras' clipnorm clips each gradient by its own norm (tf.clip_by_norm): a sharded table's holds this worker's
    # rows, whose norm is not one process's whole table's.
    "keras-legacy-clipnorm-sharded-table-2-workers": _program(
        family="keras_legacy", call="tf_gradients", transform="keras_clipnorm_each",
        tables=[_table(entry="sparse_mean")]),
    "keras-legacy-clipnorm-column-wise-and-whole-tables-3-workers": _program(
        workers=3, backend="sok", family="keras_legacy", call="tf_gradients", kind="momentum",
        transform="keras_clipnorm_each", tables=[_table(entry="lookup"), _table("user", 2, "sparse_sum"),
                                                 _table("category", 13, "sparse_mean", placement="column_wise")]),
    # The one plain process's check of a checkpoint restored a hash column's legacy Keras slots ("Adam/<table>/m",
    # outside the table's scope) over its stand-in's, in the checkpoint's key order: its next steps were wrong.
    "keras-legacy-adam-hash-column-mts-sok-1-to-1": _program(
        workers=1, resume=1, backend="sok", engine="mts", family="keras_legacy", call="tf_gradients", kind="adam",
        tables=[_hash("item", False)]),
    # Issue 43's: a column-wise table with fewer rows than workers leaves a worker no row block to save, and that
    # worker wrote no part: the merge of the first checkpoint failed (seed 2028's p27 and p29, drawn placements).
    "column-wise-table-of-2-rows-3-workers": _program(
        workers=3, kind="adagrad", tables=[_table(vocab=2, entry="sparse_mean", placement="column_wise")]),
    # Issue 42's (seed 8030's p76, p175, p288, p289): a table with fewer rows than workers is an ordinary variable,
    # written whole into a delta; resumed on 1 worker, where it is a sharded table, the chain's restore read it as
    # keyed rows, found no keys and left it as the full checkpoint had it (a step stale).
    "table-of-1-row-delta-resumed-2-to-1-workers": _program(resume=1, engine="session", tables=[_table(vocab=1)]),
    # Issue 44's, packing on (``packing``: found with COLLECTIVE_PACKING=1, docs/packing.md). get_slot of a packed
    # table outside scope(), where the harness reads the slots, failed in TensorFlow's and legacy Keras' get_slot.
    "packed-adam-slots-read-outside-scope-2-workers": _program(packing=True, kind="adam"),
    "packed-keras-legacy-adagrad-slots-read-outside-scope-3-workers": _program(
        workers=3, packing=True, family="keras_legacy", call="tf_gradients", kind="adagrad"),
    # The group variable, named "<table>/packed", was taken for a variable of the dense layer named after the table.
    "packed-dense-layer-named-after-table-1-worker": _program(workers=1, packing=True, dense_name="item"),
    # hb's MonitoredTrainingSession broadcast the group's slots (each worker's own rows) as dense variables.
    "packed-hb-adagrad-built-outside-hb-scope-tf1-2-workers": _program(
        packing=True, family="hb", kind="adagrad", where="outside", tf1=True),
    # A delta's restore wrote its rows into a packed table's view of the group variable, which had no scatter_update.
    "packed-table-of-1-row-delta-resumed-2-to-1-workers": _program(packing=True, resume=1, engine="session",
                                                                    tables=[_table(vocab=1)]),
    **{f"clip-by-global-norm-{backend}-{n}-workers": _program(
        workers=n, backend=backend, call="compute_apply", transform="clip_global", kind="adagrad",
        tables=[_table(), _table("user", 13, "sparse_sum")] + _column_wise_beside(backend, n))
       for backend in ("hb", "sok", "replicated") for n in (2, 3)},
}
# Whole lives that CI always runs: each engine, each TF behaviour, N -> M from 1 to 3, in two second-life
# launches (M = 3 and 1); every model kind; table-wise tables (a hash column's too) restored into the plan of M.
LIVES_ALWAYS = {
    "life-tf1-session-hash-partitioned-2-to-3": _program(
        tf1=True, engine="session", resume=3, call="compute_apply", transform="clip_global", kind="adagrad",
        tables=[_table(placement="table_wise"), _hash("user", True)]),
    "life-tf2-mts-keras-legacy-weighted-2-to-1": _program(
        engine="mts", resume=1, backend="sok", family="keras_legacy", call="tf_gradients", kind="adam",
        tables=[_table(entry="keras_embedding"), _table("user", 5, "weighted_column")]),
    "life-tf1-estimator-shared-hash-1-to-3": _program(
        workers=1, tf1=True, engine="estimator", resume=3, kind="momentum", backend="replicated",
        tables=[_table(entry="shared_column", vocab=5, placement="table_wise"),
                {**_hash("user", False), "placement": "table_wise"}]),
}
# More whole lives, for a longer search (COLLECTIVE_PROGRAM_LIVES >= 6): the other engine of each behaviour.
LIVES_MORE = {
    "life-tf1-hb-mts-columns-3-to-1": _program(
        workers=3, tf1=True, engine="mts", resume=1, backend="sok", family="hb", kind="adagrad", where="outside",
        tables=[_table(entry="column"), _table("user", 13, "sparse_sum")]),
    "life-tf2-session-hash-partitioned-2-to-1": _program(
        engine="session", resume=1, backend="replicated", call="compute_apply", kind="adam",
        tables=[_hash("item", True), _table("user", 13, "sparse_mean")]),
    "life-tf2-estimator-shared-1-to-3": _program(
        workers=1, engine="estimator", resume=3, dense_regularizer=0.05, dense_name="user",
        tables=[_table(entry="shared_column"), _table("user", 13, regularizer=0.05)]),
}
if LIVES < 6:
    LIVES_MORE = {}
PROGRAMS = list(REGRESSIONS.values()) + list(LIVES_ALWAYS.values()) + list(LIVES_MORE.values()) \
    + draw_programs(COUNT, SEED)
NAMES_OF = dict(enumerate(list(REGRESSIONS) + list(LIVES_ALWAYS) + list(LIVES_MORE)))


def _run(programs: List[dict], n: int, life: int) -> List[Dict[str, np.ndarray]]:
    with tempfile.TemporaryDirectory(prefix=f"programs-{life}-{n}-") as out:
        path = pathlib.Path(out) / "programs.json"
        path.write_text(json.dumps([{**p, "index": PROGRAMS.index(p)} for p in programs]))
        run_workers("program_worker.py", n, [str(path), str(WORK), out, str(life)],
                    timeout=300 + 60 * len(programs))
        return load_rank_results(pathlib.Path(out), n)


@launch_once
def _first_lives(n: int) -> List[Dict[str, np.ndarray]]:
    """The first life of every program on ``n`` workers (one launch), and the plain process of those it ends."""
    return _run([p for p in PROGRAMS if p["workers"] == n], n, 1)


@launch_once
def _second_lives(m: int) -> List[Dict[str, np.ndarray]]:
    """The second life of every program resumed on ``m`` workers (one launch), and their plain process."""
    mine = [p for p in PROGRAMS if p.get("resume") == m]
    for n in sorted({p["workers"] for p in mine}):
        try:
            _first_lives(n)
        except Exception:  # pylint: disable=broad-except  (its programs report their missing first life)
            pass
    return _run(mine, m, 2)


def _part(res: Dict[str, np.ndarray], index: int, side: str) -> Dict[str, np.ndarray]:
    prefix = f"{index}/{side}/"
    return {k[len(prefix):]: v for k, v in res.items() if k.startswith(prefix)}


def _serve(version: str, inputs: Dict[str, np.ndarray]) -> np.ndarray:
    """What plain TensorFlow serves from SavedModel ``version`` for ``inputs`` (its default signature)."""
    with tf.compat.v1.Session(graph=tf.Graph()) as sess:
        meta = tf.compat.v1.saved_model.load(sess, [tf.saved_model.SERVING], version)
        signature = meta.signature_def[tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY]
        feed = {info.name: inputs[key] for key, info in signature.inputs.items()}
        return sess.run(signature.outputs["prediction"].name, feed)


def _logical(ranks: List[Dict[str, np.ndarray]], key: str, layout: str) -> np.ndarray:
    if layout.startswith("held"):  # table_wise: the whole table on its holder, no rows elsewhere
        holder = int(layout[len("held"):])
        assert all(len(res[key]) == 0 for r, res in enumerate(ranks) if r != holder), f"{key}: rows off its holder"
        return ranks[holder][key]
    if layout == "columns":  # column_wise: every row on every rank, a slice of its dims
        bounds = column_bounds(sum(res[key].shape[1] for res in ranks), len(ranks))
        assert [res[key].shape[1] for res in ranks] == np.diff(bounds).tolist(), f"{key}: column slices"
        return np.concatenate([res[key] for res in ranks], axis=1)
    if layout == "whole" or len(ranks) == 1:
        for r, res in enumerate(ranks[1:], 1):
            np.testing.assert_allclose(res[key], ranks[0][key], rtol=RTOL, atol=ATOL,
                                       err_msg=f"{key}: rank {r}'s copy differs from rank 0's")
        return ranks[0][key]
    n = len(ranks)
    rows = sum(len(res[key]) for res in ranks)
    out = np.zeros((rows,) + ranks[0][key].shape[1:], ranks[0][key].dtype)
    for r, res in enumerate(ranks):
        out[r::n] = res[key]
    return out


class _Failures(list):
    def compare(self, what: str, got, want) -> None:
        try:
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
        except (AssertionError, ValueError) as err:
            self.append(f"{what}: {' '.join(str(err).split())[:600]}")


def _check_first_life(ranks, plain, failures: _Failures) -> None:
    steps = len(ranks[0]["losses"])
    failures.compare("first life's losses (mean over workers)", np.mean([res["losses"] for res in ranks], axis=0),
                     plain["losses"][:steps])
    if "layout" not in ranks[0]:  # an Estimator: compared through its checkpoints
        return
    layouts = ranks[0]["layout"]
    for key in sorted(k[len("life1/"):] for k in plain if k.startswith("life1/")):
        want = plain[f"life1/{key}"]
        if key.startswith("dense/"):
            for r, res in enumerate(ranks):
                failures.compare(f"{key} rank {r}", res[key], want)
        elif key not in ranks[0]:
            failures.append(f"{key}: missing on the workers")
        else:
            try:
                failures.compare(key, _logical(ranks, key, str(layouts[int(key.split("/")[1])])), want)
            except AssertionError as err:
                failures.append(" ".join(str(err).split())[:600])
    extra = sorted(k for k in ranks[0] if k.startswith("slot/") and f"life1/{k}" not in plain)
    if extra:
        failures.append(f"slots only on the workers: {extra}")


def _check_checkpoints(plain, tags, failures: _Failures) -> None:
    """Each full checkpoint, restored by TF's own Saver in the plain process, holds what it held at that step."""
    for tag in tags:
        restored = sorted(k for k in plain if k.startswith(f"restored{tag}/"))
        if not restored:
            failures.append(f"checkpoint {tag}: the plain process restored none")
        for key in restored:
            what = key[len(f"restored{tag}/"):]
            failures.compare(f"checkpoint {tag}: {what}", plain[key], plain[f"at{tag}/{what}"])


@pytest.mark.parametrize("index", range(len(PROGRAMS)),
                         ids=[NAMES_OF.get(i, f"p{i}-{p['workers']}w-{p['backend']}-{p['optimizer']['family']}-"
                                              f"{program_cases.engine(p)}" + (f"-resume{p['resume']}w"
                                                                              if p.get("resume") else ""))
                              for i, p in enumerate(PROGRAMS)])
def test_program_lives_what_one_process_lives(index):
    program = PROGRAMS[index]
    shown = f"\nthe program:\n{program_cases.describe(program)}"
    first = [_part(res, index, "dist") for res in _first_lives(program["workers"])]
    second = [_part(res, index, "dist") for res in _second_lives(program["resume"])] if program.get("resume") \
        else []
    plain = _part((_second_lives(program["resume"]) if program.get("resume") else
                   _first_lives(program["workers"]))[0], index, "plain")
    errors = [str(res["error"]) for res in first + second + [plain] if "error" in res]
    assert not errors, "\n".join(errors) + shown
    failures = _Failures()
    _check_first_life(first, plain, failures)
    _check_checkpoints(plain, ("1", "2") if program.get("resume") else ("1",), failures)
    if program.get("resume"):
        failures.compare("second life's losses (mean over workers)",
                         np.mean([res["losses"] for res in second], axis=0),
                         plain["losses"][program_life.first_steps(program):])
        record = json.loads((WORK / f"program{index}" / "model" / "life2.json").read_text())
        inputs = program_cases.serving_batch(program)
        for version, key in ((record["v1"], "serve1"), (record["v2"], "serve2")):
            failures.compare(f"served by {version} (plain TF) vs the plain process", _serve(version, inputs),
                             plain[key])
    assert not failures, "\n".join(failures) + shown


def test_a_program_that_trains_nothing_fails(tmp_path):
    """Keras' new SGD in a session trains nothing in one plain process (TensorFlow's behaviour), and the harness
    fails such a program instead of comparing untrained models (in-process: the plain process alone)."""
    program = {**_program(workers=1, family="keras", call="tf_gradients", kind="momentum"), "index": 0}
    with pytest.raises(RuntimeError, match=r"trained nothing into \['dense/0', 'dense/1', 'table/0'\]"):
        program_life.plain_life(program, str(tmp_path))
