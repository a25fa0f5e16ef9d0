"""How long building a model's training graph takes under hb, with packing off and on (issue 44's graph-build target).

    python -m benchmarks.graph_build [--config packing_quick] [--models dlrm,deepfm] [--repeats 5]

One process (world size 1, no launch). Each turn builds, in a fresh graph,
the training graph a benchmark run of that model builds under
``CollectiveStrategy("hb").scope()`` (:func:`benchmarks.worker.build_train`:
the model, Adagrad, the global step), fed by placeholders shaped like the
input pipeline's batch; ``hb`` and ``hb_packed`` take turns, so a loaded
machine slows both alike. Printed per model and mode: the median build
seconds (min..max over turns), the ops in the graph and its sparse applies,
and the packed / unpacked ratio of the medians.
"""

from __future__ import annotations

import argparse
import collections
import logging
import statistics
import time
from typing import Any, Dict, List

import tensorflow as tf

from benchmarks import config as configs
from datasets import schema

logger = logging.getLogger("benchmarks.graph_build")
MODES = ("hb", "hb_packed")


def _features(batch: int) -> Dict[str, tf.Tensor]:
    features = {name: tf.compat.v1.placeholder(tf.float32, [batch], name=name) for name in schema.DENSE}
    features.update({name: tf.compat.v1.placeholder(tf.int64, [batch], name=name) for name in schema.CATEGORICAL})
    return features


def build_once(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Builds ``spec``'s training graph once; its build seconds, op count and sparse applies."""
    from benchmarks import worker  # pylint: disable=import-outside-toplevel
    from collective import CollectiveStrategy  # pylint: disable=import-outside-toplevel
    from collective.embedding import packing  # pylint: disable=import-outside-toplevel

    batch = worker.worker_batch(spec, 1)
    with tf.Graph().as_default() as graph:
        start = time.perf_counter()
        with CollectiveStrategy(configs.backend_of(spec["mode"])).scope(), \
                packing.using(spec["mode"] in configs.PACKED_MODES):
            worker.build_train(spec, _features(batch), tf.compat.v1.placeholder(tf.float32, [batch, 1]))
        seconds = time.perf_counter() - start
        types = collections.Counter(op.type for op in graph.get_operations())
    return {"seconds": seconds, "ops": sum(types.values()),
            "sparse_applies": sum(n for t, n in types.items() if t.startswith("ResourceSparseApply"))}


def measure(config: Dict[str, Any], models: List[str], repeats: int) -> Dict[str, Dict[str, Any]]:
    """``{f"{model} {mode}": figures}`` over ``repeats`` turns of each mode, one build of each per turn."""
    specs = {(r["model"], r["mode"]): r for r in configs.matrix(config) if r["workers"] == 1}
    results: Dict[str, Dict[str, Any]] = {}
    for model in models:
        runs: Dict[str, List[Dict[str, Any]]] = {mode: [] for mode in MODES}
        for turn in range(repeats):
            for mode in MODES:
                runs[mode].append(build_once(dict(specs[(model, "hb")], mode=mode)))
            logger.info("%s: turn %d of %d built", model, turn + 1, repeats)
        for mode, built in runs.items():
            seconds = [b["seconds"] for b in built]
            results[f"{model} {mode}"] = {"median_s": statistics.median(seconds), "min_s": min(seconds),
                                          "max_s": max(seconds), "ops": built[-1]["ops"],
                                          "sparse_applies": built[-1]["sparse_applies"]}
    return results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--config", default="packing_quick")
    parser.add_argument("--models", default="dlrm,deepfm")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    models = [m for m in args.models.split(",") if m]
    results = measure(configs.load(args.config), models, args.repeats)
    print(f"{'model mode':<18} {'median s':>9} {'min..max s':>14} {'ops':>7} {'sparse applies':>15}")
    for name, r in results.items():
        print(f"{name:<18} {r['median_s']:>9.2f} {r['min_s']:>6.2f}..{r['max_s']:<6.2f} {r['ops']:>7,} "
              f"{r['sparse_applies']:>15}")
    for model in models:
        ratio = results[f"{model} hb_packed"]["median_s"] / results[f"{model} hb"]["median_s"]
        print(f"{model}: packed build / unpacked build = {ratio:.2f}")


if __name__ == "__main__":
    main()
