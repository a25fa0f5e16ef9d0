"""Generated user programs on N workers against one plain TensorFlow process.

Hypothesis draws programs from a grammar of what users write around our API
(:func:`programs`): 1-2 tables with vocabularies smaller than N and not
divisible by N, each looked up through ``embedding_lookup``,
``embedding_lookup_sparse`` (sum, mean) or a Keras ``Embedding`` layer, with or
without a regularizer; a dense head named ``head`` or after a table, with or
without a regularizer; an optimizer of ``tf.compat.v1.train``, ``hb.train``,
legacy Keras or Keras, built inside or outside the scope, called through
``minimize``, ``compute_gradients`` + ``apply_gradients`` or ``tf.gradients`` +
``apply_gradients``, with ``clip_by_global_norm``, ``clip_by_value``, a scaling
or Keras' ``global_clipnorm`` between; a mean or summed loss; TF1 behaviour on
or off; the backend; N from 1 to 3. Each program trains 3 steps on N workers
(one launch per N runs all of its programs) and in one process on the global
batch, and losses, tables, slots and dense weights must agree; the workers
also save a checkpoint (``collective.checkpoint.Saver``) that the one process
restores with TensorFlow's own ``Saver``: it must read the workers' logical
tables, slots and weights.

Each example costs a share of a launch, so the programs are drawn up front
(no shrinking): a failure prints the whole program. CI draws
``COLLECTIVE_PROGRAMS`` (default 24) programs with seed
``COLLECTIVE_PROGRAMS_SEED`` (default 2028). A longer search by hand::

    COLLECTIVE_PROGRAMS=300 COLLECTIVE_PROGRAMS_SEED=$RANDOM .venv/bin/python -m pytest -q tests/test_programs.py
"""

import json
import os
import pathlib
import tempfile
from typing import Dict, List

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from launcher import launch_once, load_rank_results, run_workers
from workers import program_cases

COUNT = int(os.environ.get("COLLECTIVE_PROGRAMS", "24"))
SEED = int(os.environ.get("COLLECTIVE_PROGRAMS_SEED", "2028"))
RTOL, ATOL = 1e-4, 1e-5
NAMES = ("item", "user", "category")
CALLS = {"v1": ("minimize", "compute_apply", "tf_gradients"), "hb": ("minimize", "compute_apply", "tf_gradients"),
         "keras_legacy": ("tf_gradients",), "keras": ("tf_gradients",)}
# Transforms between computing and applying: after compute_gradients any; gradients of tf.gradients are not
# averaged until apply_gradients (docs/support.md), so only transforms that commute with averaging go there.
TRANSFORMS = {"compute_apply": ("none", "clip_global", "clip_value", "scale"), "minimize": ("none",),
              "tf_gradients": ("none", "scale")}
pytestmark = pytest.mark.timeout(900)


@st.composite
def programs(draw) -> dict:
    """One user program (see program_cases)."""
    names = draw(st.permutations(NAMES))[:draw(st.integers(1, 2))]
    tables = []
    for name in names:
        entry = draw(st.sampled_from(("lookup", "sparse_sum", "sparse_mean", "keras_embedding")))
        tables.append({"name": name, "vocab": draw(st.sampled_from((1, 2, 5, 7, 13))),
                       "dim": draw(st.sampled_from((2, 3))), "entry": entry,
                       "regularizer": 0.0 if entry == "keras_embedding" else draw(st.sampled_from((0.0, 0.05))),
                       "outside": entry != "keras_embedding" and draw(st.sampled_from((False, False, True)))})
    family = draw(st.sampled_from(tuple(CALLS)))
    call = draw(st.sampled_from(CALLS[family]))
    transforms = TRANSFORMS[call] + (("keras_clipnorm",) if family.startswith("keras") else ())
    return {
        "seed": draw(st.integers(0, 10_000)),
        "workers": 1,
        "backend": draw(st.sampled_from(("hb", "sok", "replicated"))),
        "tables": tables,
        "dense_name": draw(st.sampled_from(("head",) + tuple(names))),
        "dense_regularizer": draw(st.sampled_from((0.0, 0.05))),
        "optimizer": {"family": family, "kind": draw(st.sampled_from(("sgd", "adagrad", "adam", "momentum"))),
                      "where": draw(st.sampled_from(("inside", "outside"))), "call": call},
        "transform": draw(st.sampled_from(transforms)),
        "clip": draw(st.sampled_from((0.05, 0.5))),
        "reduction": draw(st.sampled_from(("mean", "sum"))),
        # Keras optimizers (legacy too) make slots of reference variables wrongly, and those of TF 2.11+ refuse
        # them: TF1 behaviour (no resource variables) fails with them in one process too.
        "tf1": False if family.startswith("keras") else draw(st.booleans()),
    }


def draw_programs(count: int, seed_value: int) -> List[dict]:
    """``count`` distinct programs drawn with a fixed seed."""
    found: Dict[str, dict] = {}

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
    return drawn


def _program(workers: int = 2, backend: str = "hb", tables=None, family: str = "v1", kind: str = "sgd",
             where: str = "inside", call: str = "minimize", **rest) -> dict:
    program = {"seed": 11, "workers": workers, "backend": backend, "dense_name": "head", "dense_regularizer": 0.0,
               "tables": tables or [_table()], "transform": "none", "clip": 0.05, "reduction": "mean", "tf1": False,
               "optimizer": {"family": family, "kind": kind, "where": where, "call": call}}
    program.update(rest)
    return program


def _table(name: str = "item", vocab: int = 7, entry: str = "lookup", regularizer: float = 0.0,
           outside: bool = False) -> dict:
    return {"name": name, "vocab": vocab, "dim": 3, "entry": entry, "regularizer": regularizer, "outside": outside}


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
    "keras-sgd-apply": _program(family="keras", call="tf_gradients", kind="momentum", transform="keras_clipnorm"),
    "keras-adagrad-apply-3-workers": _program(workers=3, family="keras", call="tf_gradients", kind="adagrad"),
    **{f"clip-by-global-norm-{backend}-{n}-workers": _program(
        workers=n, backend=backend, call="compute_apply", transform="clip_global", kind="adagrad",
        tables=[_table(), _table("user", 13, "sparse_sum")])
       for backend in ("hb", "sok", "replicated") for n in (2, 3)},
}
PROGRAMS = list(REGRESSIONS.values()) + draw_programs(COUNT, SEED)
NAMES_OF = {i: name for i, name in enumerate(REGRESSIONS)}


@launch_once
def _launch(n: int) -> List[Dict[str, np.ndarray]]:
    mine = [p for p in PROGRAMS if p["workers"] == n]
    with tempfile.TemporaryDirectory(prefix=f"programs-{n}-") as out:
        path = pathlib.Path(out) / "programs.json"
        path.write_text(json.dumps(mine))
        run_workers("program_worker.py", n, [str(path), out], timeout=600)
        return load_rank_results(pathlib.Path(out), n)


def _results(program: dict):
    n = program["workers"]
    index = next(i for i, p in enumerate(p for p in PROGRAMS if p["workers"] == n) if p is program)
    ranks = _launch(n)

    def part(res, side):
        prefix = f"{index}/{side}/"
        return {k[len(prefix):]: v for k, v in res.items() if k.startswith(prefix)}

    return [part(res, "dist") for res in ranks], part(ranks[0], "plain")


def _logical(ranks: List[Dict[str, np.ndarray]], key: str, layout: str) -> np.ndarray:
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


@pytest.mark.parametrize("index", range(len(PROGRAMS)),
                         ids=[NAMES_OF.get(i, f"p{i}-{p['workers']}w-{p['backend']}-{p['optimizer']['family']}")
                              for i, p in enumerate(PROGRAMS)])
def test_program_trains_what_one_process_trains(index):
    program = PROGRAMS[index]
    ranks, plain = _results(program)
    shown = f"\nthe program:\n{program_cases.describe(program)}"
    errors = [str(res["error"]) for res in ranks + [plain] if "error" in res]
    assert not errors, "\n".join(errors) + shown
    failures = []

    def compare(what, got, want):
        try:
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
        except AssertionError as err:
            failures.append(f"{what}: {' '.join(str(err).split())[:600]}")

    compare("losses (mean over workers)", np.mean([res["losses"] for res in ranks], axis=0), plain["losses"])
    layouts = ranks[0]["layout"]
    for key in sorted(plain):
        if key.startswith("table/") or key.startswith("slot/"):
            table = int(key.split("/")[1])
            if key not in ranks[0]:
                failures.append(f"{key}: missing on the workers")
                continue
            try:
                compare(key, _logical(ranks, key, str(layouts[table])), plain[key])
            except AssertionError as err:
                failures.append(" ".join(str(err).split())[:600])
        elif key.startswith("dense/"):
            for r, res in enumerate(ranks):
                compare(f"{key} rank {r}", res[key], plain[key])
    for key in sorted(k for k in plain if k.startswith("restored/")):  # the workers' checkpoint, read by one process
        what = key[len("restored/"):]
        if what.startswith("dense/"):
            compare(f"{what} from the checkpoint", plain[key], ranks[0][what])
        else:
            compare(f"{what} from the checkpoint", plain[key],
                    _logical(ranks, what, str(layouts[int(what.split("/")[1])])))
    extra = sorted(k for k in ranks[0] if k.startswith("slot/") and k not in plain)
    assert not extra, f"slots only on the workers: {extra}{shown}"
    assert not failures, "\n".join(failures) + shown
