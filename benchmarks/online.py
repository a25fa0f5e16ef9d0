"""Online training: incremental checkpoints and serving updates against full saves and full exports.

    python -m benchmarks.online --config full [--workers 1] [--out reports/online]   # make bench-online
    python -m benchmarks.online --config quick --out reports/online_quick            # in make bench

For each worker count it launches ``python -m collective.launch -n N -m
benchmarks.online --worker ...``. Every worker builds, under
``CollectiveStrategy("hb").scope()``, the 26 tables of Criteo Kaggle at the
configuration's ``scale`` (1.0: 33.8M rows), ``dim`` 16, Adagrad, and a
linear layer over each looked-up row. Each training interval is one step
whose global batch holds ``touched`` (1%) of every table's rows, distinct,
drawn afresh; the workers split it. Measured, on the same model:

- ``full_save``: ``Saver.save`` of the whole model (tables and Adagrad slots), ``repeats`` times;
- ``full_export``: ``export_saved_model`` from that checkpoint (rank 0), ``repeats`` times;
- per interval (``deltas`` of them, after the last full save): ``delta_save``
  (``Saver.save_incremental``), ``update`` (``update_saved_model`` of the
  newest version with that delta, rank 0), ``ready`` = both, the time from
  the end of the training step to a new version a model server can load;
  and the disk's bandwidth: a file of the delta's size written and fsynced
  (``os.fsync``; TensorFlow's own saves do not fsync);
- ``restore_base`` and ``restore_chain`` (base + every delta), ``repeats`` times;
- ``load_full`` and ``load``: the full export and the newest version (its
  deltas applied by its restore op) loaded by ``tf.compat.v1.saved_model.load``
  in a fresh graph, and the newest one's rows of the last interval's ids
  against the trained model's (``served_max_abs_diff``).

Every timed write starts after ``os.sync()``: an idle disk, as when intervals
are minutes apart (back to back, each would wait for the last one's writeback).

Each worker writes ``rank<r>.json``; the parent keeps, per measurement, the
slowest worker, and writes ``OUT/online.json`` (medians over repeats and
intervals, every sample kept) and the report (:mod:`benchmarks.online_report`).
The files go to a temporary folder on the disk ``--work_dir`` names
(default: the system's temporary folder), removed at the end.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from benchmarks.launching import ROOT, launch_command, worker_env

FILE = "online.json"
CONFIGS: Dict[str, Dict[str, Any]] = {
    "quick": {"description": "1% of Criteo Kaggle's table sizes (338K rows), for make bench", "scale": 0.01,
              "dim": 16, "touched": 0.01, "deltas": 10, "repeats": 3, "workers": [1, 2], "seed": 1},
    "full": {"description": "Criteo Kaggle's real table sizes (33.8M rows)", "scale": 1.0, "dim": 16,
             "touched": 0.01, "deltas": 10, "repeats": 3, "workers": [1], "seed": 1},
}
SERVED_SAMPLE = 256  # ids per table looked up in the served version against the trained model


def _files_bytes(prefix: str) -> int:
    """Bytes of a checkpoint's bundle (``.index`` and ``.data-*``)."""
    return sum(os.path.getsize(f) for f in glob.glob(glob.escape(prefix) + ".index")
               + glob.glob(glob.escape(prefix) + ".data-*"))


def _tree_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


def disk_write_seconds(folder: str, size: int) -> float:
    """Seconds to write ``size`` bytes to a new file in ``folder`` and fsync it (the file is removed)."""
    data = np.random.default_rng(0).integers(0, 256, max(int(size), 1), dtype=np.uint8).tobytes()
    path = os.path.join(folder, "bandwidth.probe")
    started = time.perf_counter()
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - started
    os.remove(path)
    return seconds


class _Model:
    """The tables, a linear layer over each looked-up row, Adagrad; and the serving signature."""

    def __init__(self, strategy, sizes: Sequence[int], dim: int):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        self.sizes, self.dim, self.strategy = list(sizes), dim, strategy
        self.ids = [tf.compat.v1.placeholder(tf.int64, [None], name=f"ids{i}") for i in range(len(sizes))]
        self.rows = [tf.nn.embedding_lookup(t, ids) for t, ids in zip(self.tables(), self.ids)]
        w, b = self.dense()
        loss = tf.add_n([tf.reduce_mean(tf.square(tf.matmul(rows, w) + b - 1.0)) for rows in self.rows])
        self.step = tf.compat.v1.train.get_or_create_global_step()
        self.train = tf.compat.v1.train.AdagradOptimizer(0.05).minimize(loss, global_step=self.step)

    def tables(self):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        with self.strategy.embedding_scope():
            return [tf.compat.v1.get_variable(f"C{i + 1}", [size, self.dim],
                                              initializer=tf.compat.v1.random_uniform_initializer(-0.05, 0.05))
                    for i, size in enumerate(self.sizes)]

    def dense(self):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        return (tf.compat.v1.get_variable("w", [self.dim, 1], initializer=tf.compat.v1.ones_initializer()),
                tf.compat.v1.get_variable("b", [1], initializer=tf.compat.v1.zeros_initializer()))

    def signature_def_fn(self):
        """``ids`` [B, tables] -> ``rows`` [B, tables, dim] and ``score`` [B, 1], named as in the training graph."""
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        def build():
            ids = tf.compat.v1.placeholder(tf.int64, [None, len(self.sizes)], name="ids")
            rows = tf.stack([tf.nn.embedding_lookup(t, ids[:, i]) for i, t in enumerate(self.tables())], axis=1)
            w, b = self.dense()
            score = tf.reduce_sum(tf.tensordot(rows, w, 1), axis=1) + b
            return tf.compat.v1.saved_model.predict_signature_def({"ids": ids}, {"rows": rows, "score": score})

        return build


def table_sizes(config: Dict[str, Any]) -> List[int]:
    """Rows of the configuration's tables: Criteo Kaggle's 26 at ``scale`` (the first ``tables`` of them)."""
    from datasets.synthetic import cardinalities  # pylint: disable=import-outside-toplevel

    return list(cardinalities(float(config["scale"])))[:int(config.get("tables", 26))]


def _interval_ids(rng: np.random.Generator, sizes: Sequence[int], touched: float) -> List[np.ndarray]:
    """One interval's global batch: ``touched`` of every table's rows, distinct (at least one row)."""
    return [np.sort(rng.choice(size, max(1, int(round(size * touched))), replace=False)).astype(np.int64)
            for size in sizes]


def worker(out_dir: str, config: Dict[str, Any]) -> None:
    """Runs the measurements on this worker; writes ``out_dir/rank<r>.json``."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from collective import CollectiveStrategy, comm, context  # pylint: disable=import-outside-toplevel
    from collective.checkpoint import Saver, manifest  # pylint: disable=import-outside-toplevel
    from collective.integration import serving_deltas  # pylint: disable=import-outside-toplevel
    from collective.integration.export import export_saved_model  # pylint: disable=import-outside-toplevel
    from collective.integration.serving_update import update_saved_model  # pylint: disable=import-outside-toplevel
    strategy = CollectiveStrategy("hb")
    r, n = strategy.rank(), strategy.world_size()
    sizes = table_sizes(config)
    rng = np.random.default_rng(int(config["seed"]))  # the same draws on every worker: each feeds its share
    model_dir, exports = os.path.join(out_dir, "model"), os.path.join(out_dir, "exports")
    out: Dict[str, Any] = {"rank": r, "workers": n, "rows": int(sum(sizes)), "tables": len(sizes), "intervals": []}
    with strategy.scope(), tf.Graph().as_default():
        model = _Model(strategy, sizes, int(config["dim"]))
        saver = Saver(max_to_keep=None)
        barrier = comm.allreduce(tf.constant(1.0), "sum")  # every worker starts a timed restore together
        sess = tf.compat.v1.Session(config=context.session_config())
        started = time.perf_counter()
        sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
        out["init_s"] = time.perf_counter() - started

        def train_interval() -> List[np.ndarray]:
            ids = _interval_ids(rng, sizes, float(config["touched"]))
            sess.run(model.train, {ph: part[r::n] for ph, part in zip(model.ids, ids)})
            return ids

        train_interval()
        out["full_save_s"], out["full_export_s"] = [], []
        base = None
        for repeat in range(int(config["repeats"])):
            os.sync()  # every timed write starts on an idle disk, as it does when saves are minutes apart
            started = time.perf_counter()
            base = saver.save(sess, os.path.join(model_dir, f"full{repeat}", "model.ckpt"), global_step=model.step)
            out["full_save_s"].append(time.perf_counter() - started)
            out["full_save_bytes"] = _files_bytes(base)
        for repeat in range(int(config["repeats"]) if r == 0 else 0):
            os.sync()
            started = time.perf_counter()
            exported = export_saved_model(os.path.join(exports, f"full{repeat}"), base, model.signature_def_fn())
            out["full_export_s"].append(time.perf_counter() - started)
            out["export_bytes"] = _tree_bytes(exported.decode())
            if repeat:
                shutil.rmtree(os.path.join(exports, f"full{repeat}"))
        if r == 0:  # the chain's base stays; the other full saves go
            for repeat in range(int(config["repeats"]) - 1):
                shutil.rmtree(os.path.join(model_dir, f"full{repeat}"))
        served = os.path.join(exports, "full0")
        delta = None
        for _ in range(int(config["deltas"])):
            os.sync()
            ids = train_interval()
            step_end = time.perf_counter()
            delta = saver.save_incremental(sess, os.path.join(model_dir, f"full{int(config['repeats']) - 1}",
                                                              "model.ckpt"), global_step=model.step)
            interval = {"delta_save_s": time.perf_counter() - step_end}
            if r == 0:
                started = time.perf_counter()
                version = update_saved_model(served, delta)
                interval["update_s"] = time.perf_counter() - started
                interval["ready_s"] = time.perf_counter() - step_end
                written = manifest.read_manifest(delta)
                interval["delta_bytes"] = sum(entry["bytes"] for entry in written["files"])
                interval["delta_rows"] = sum(written["rows"].values())
                # What the touched rows hold: their values, one Adagrad slot and the int64 key.
                interval["touched_bytes"] = interval["delta_rows"] * (int(config["dim"]) * 4 * 2 + 8)
                interval["disk_write_s"] = disk_write_seconds(out_dir, interval["delta_bytes"])
                interval["version"] = os.path.basename(version.decode())
                newest = serving_deltas.delta_numbers(version.decode())[-1]
                interval["update_bytes"] = _files_bytes(serving_deltas.delta_prefix(version.decode(), newest))
                for old in sorted(os.listdir(served), key=int)[1:-2]:  # the full export and the 2 newest stay
                    shutil.rmtree(os.path.join(served, old))
            out["intervals"].append(interval)
        out["restore_base_s"], out["restore_chain_s"] = [], []
        for _ in range(int(config["repeats"])):
            sess.run(barrier)
            started = time.perf_counter()
            saver.restore(sess, base)
            out["restore_base_s"].append(time.perf_counter() - started)
            sess.run(barrier)
            started = time.perf_counter()
            saver.restore(sess, delta)
            out["restore_chain_s"].append(time.perf_counter() - started)
        out["chain_deltas"] = len(manifest.verify_chain(delta).deltas)
        sample = [part[:SERVED_SAMPLE] for part in ids]
        trained = sess.run(model.rows, {ph: part if r == 0 else part[:0] for ph, part in zip(model.ids, sample)})
        sess.close()
    if r == 0:
        out.update(_serve(served, sample, trained))
    out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
        json.dump(out, f, indent=1)


def _serve(export_base: str, sample: List[np.ndarray], trained: List[np.ndarray]) -> Dict[str, Any]:
    """Loads the newest version with plain TensorFlow; its rows of ``sample`` against the trained ``trained``."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    versions = sorted(int(v) for v in os.listdir(export_base) if v.isdigit())
    count = max(len(part) for part in sample)
    ids = np.stack([np.resize(part, count) for part in sample], axis=1)
    result = {}
    for key, version in (("load_full_s", versions[0]), ("load_s", versions[-1])):  # the full export, the newest
        os.sync()
        started = time.perf_counter()
        with tf.compat.v1.Session(graph=tf.Graph()) as sess:
            meta = tf.compat.v1.saved_model.load(sess, [tf.saved_model.SERVING], os.path.join(export_base,
                                                                                              str(version)))
            result[key] = time.perf_counter() - started
            signature = meta.signature_def[tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY]
            rows = sess.run(signature.outputs["rows"].name, {signature.inputs["ids"].name: ids})
    result["served_version"] = str(versions[-1])
    result["served_max_abs_diff"] = max(float(np.abs(rows[:len(part), i] - trained[i]).max())
                                        for i, part in enumerate(sample))
    return result


def summarize(ranks: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One worker count's result: per measurement the slowest worker's, medians and every sample."""
    def slowest(key: str) -> List[float]:
        samples = [rank[key] for rank in ranks if rank.get(key)]
        return [max(values) for values in zip(*samples)]

    def slowest_interval(key: str) -> List[float]:
        return [max(rank["intervals"][i][key] for rank in ranks if key in rank["intervals"][i])
                for i in range(len(ranks[0]["intervals"]))]

    first = ranks[0]
    result: Dict[str, Any] = {"workers": first["workers"], "rows": first["rows"], "tables": first["tables"],
                              "samples": {}}
    for key in ("full_save_s", "full_export_s", "restore_base_s", "restore_chain_s"):
        result["samples"][key] = slowest(key)
    for key in ("delta_save_s", "update_s", "ready_s", "disk_write_s", "delta_bytes", "delta_rows", "touched_bytes",
                "update_bytes"):
        result["samples"][key] = slowest_interval(key)
    result["median"] = {key: statistics.median(values) for key, values in result["samples"].items()}
    for key in ("full_save_bytes", "export_bytes", "load_s", "load_full_s", "served_max_abs_diff", "chain_deltas",
                "init_s"):
        result[key] = first.get(key)
    result["peak_rss_bytes"] = max(rank["peak_rss_bytes"] for rank in ranks)
    median = result["median"]
    result["disk_bytes_per_s"] = median["delta_bytes"] / median["disk_write_s"]
    result["delta_goal_s"] = 2 * median["touched_bytes"] / result["disk_bytes_per_s"]
    result["full_path_s"] = median["full_save_s"] + median["full_export_s"]
    return result


def measure(config: Dict[str, Any], workers: Sequence[int], work_dir: Optional[str]) -> Dict[str, Any]:
    """Launches one job per worker count; returns ``{"config", "machine", "runs": [summaries]}``."""
    from benchmarks import machine  # pylint: disable=import-outside-toplevel

    runs = []
    for n in workers:
        with tempfile.TemporaryDirectory(prefix="online-", dir=work_dir) as tmp:
            cmd = launch_command(n, "benchmarks.online", "--worker", tmp, "--config_json", json.dumps(config))
            env = worker_env(CUDA_VISIBLE_DEVICES="")
            started = time.monotonic()
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=3600)
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd[:6])} exited {proc.returncode}:\n{proc.stderr[-6000:]}")
            ranks = []
            for r in range(n):
                with open(os.path.join(tmp, f"rank{r}.json")) as f:
                    ranks.append(json.load(f))
        run = summarize(ranks)
        run["wall_s"] = time.monotonic() - started
        runs.append(run)
        logging.getLogger("benchmarks.online").info("N=%d done in %.0f s", n, run["wall_s"])
    return {"config": config, "machine": machine.describe(), "runs": runs}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.online", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="quick", choices=sorted(CONFIGS), help="configuration (default quick)")
    parser.add_argument("--workers", default=None, help="worker counts, comma-separated (default: the config's)")
    parser.add_argument("--out", default=None, help="report folder (default reports/online for full, "
                                                    "reports/online_quick for quick)")
    parser.add_argument("--work_dir", default=None, help="where checkpoints and versions are written (a temporary "
                                                         "folder in it, removed at the end)")
    parser.add_argument("--report_only", action="store_true", help="rebuild REPORT.md from OUT/online.json")
    parser.add_argument("--append", action="store_true", help="keep OUT/online.json's runs of other worker counts")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # set by the launch itself
    parser.add_argument("--config_json", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.worker:
        worker(args.worker, json.loads(args.config_json))
        return 0
    from benchmarks import online_report  # pylint: disable=import-outside-toplevel

    out = args.out or os.path.join("reports", "online" if args.config == "full" else f"online_{args.config}")
    if not args.report_only:
        config = {"name": args.config, **CONFIGS[args.config]}
        if args.workers:
            config["workers"] = [int(n) for n in args.workers.split(",")]
        result = measure(config, config["workers"], args.work_dir)
        path = os.path.join(out, FILE)
        if args.append and os.path.exists(path):
            with open(path) as f:
                kept = [run for run in json.load(f)["runs"] if run["workers"] not in config["workers"]]
            result["runs"] = sorted(kept + result["runs"], key=lambda run: run["workers"])
            result["config"]["workers"] = [run["workers"] for run in result["runs"]]
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, FILE), "w") as f:
            json.dump(result, f, indent=1)
    print(online_report.write(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
