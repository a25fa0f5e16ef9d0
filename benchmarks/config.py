"""Benchmark configurations: ``benchmarks/configs/<name>.json`` and the run matrix they expand to."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List

from datasets import schema

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
BACKENDS = ("hb", "hb_packed", "sok", "replicated")
# hb with packing on (docs/packing.md: COLLECTIVE_PACKING=1 for that run's graph), beside hb with it off.
PACKED_MODES = ("hb_packed",)
# As shipped, then tuned: ``*_tuned`` turn Grappler's arithmetic optimizer off (its
# SimplifyEmbeddingLookupStage reads whole tables every step), ``hvd_dp_dense`` also allreduces the tables'
# gradients dense (``sparse_as_dense=True``); ``ceiling`` is the model without lookups (constant vectors),
# one process at N = 1 and Horovod data parallelism of the dense layers beyond.
AS_SHIPPED = ("estimator", "tf_mts", "hvd_dp")
TUNED = ("estimator_tuned", "tf_mts_tuned", "hvd_dp_tuned", "hvd_dp_dense")
CEILING = "ceiling"
BASELINES = AS_SHIPPED + TUNED + (CEILING,)
SINGLE_PROCESS = ("estimator", "estimator_tuned", "tf_mts", "tf_mts_tuned")  # one TensorFlow process: N = 1 only
DATA_PARALLEL = ("hvd_dp", "hvd_dp_tuned", "hvd_dp_dense")  # Horovod data parallelism, tables replicated
# Models whose tables are plain TensorFlow variables in every mode: the exchanges' byte model does not apply.
TABLES_OUTSIDE_SCOPE = frozenset({"dlrm_outside_scope"})

DEFAULTS: Dict[str, Any] = {
    "description": "",
    "models": ["dlrm", "deepfm"],
    # mode -> the worker counts it runs at
    "modes": {"estimator": [1], "tf_mts": [1], "hvd_dp": [1, 2], "replicated": [2], "hb": [1, 2], "sok": [1, 2]},
    # model -> its own "modes", replacing the above for that model
    "model_modes": {},
    "global_batch": [4096],  # rows per step over all workers; each of N workers reads global_batch // N
    "warmup": 5,
    "steps": 20,
    "repeats": 3,
    "dim": 16,
    "scale": 0.01,
    # the models read the first `tables` of the 26 Criteo id columns (C1..C<tables>), one table each
    "tables": 26,
    "api": "feature_columns",
    "bottom_mlp": [64, 32],  # hidden layers; DLRM's last bottom layer is the embedding dim
    "top_mlp": [64, 32],  # hidden layers; DLRM's last top layer is the logit
    "dnn": [64, 32],  # DeepFM's hidden layers
    "learning_rate": 0.05,
    "seed": 1,
    "train_batches": 8,  # distinct global batches in the Parquet data; runs read them repeatedly
    "timeout_s": 900,  # per run
    # One launch per worker count running its runs one after another (fast,
    # for tests; peak memory is then the process's peak so far).
    "share_launch": False,
    # The launches (one per run, or per worker count with share_launch) all at once instead of one after another
    # (for tests: their runs then contend for the cores, so the timings mean nothing).
    "parallel_launches": False,
    # Workers forked from a launcher that imported TensorFlow once (``--preload``; fast, for tests): step times
    # are the same, but a forked worker's peak RSS leaves out the imported pages it never touches (~200 MB).
    "preload": False,
    "projection": {"batch_size": 512, "max_workers": 1024, "batches": 2, "movielens": True},
    "reader": False,  # measure the Parquet reader's rows/s on one core (benchmarks.data)
    "note": "",
}


def backend_of(mode: str) -> str:
    """The ``CollectiveStrategy`` backend a collective mode runs (``hb_packed``: ``hb``)."""
    return "hb" if mode in PACKED_MODES else mode


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message names the file."""


def _check_modes(path: str, where: str, modes: Any) -> None:
    if not isinstance(modes, dict) or not modes:
        raise ConfigError(f"{path}: {where} must map mode names to lists of worker counts, got {modes!r}")
    bad = [m for m in modes if m not in BACKENDS + BASELINES]
    if bad:
        raise ConfigError(f"{path}: {where}: modes {bad} not among {', '.join(BASELINES + BACKENDS)}")
    for mode, counts in modes.items():
        if not counts or any(not isinstance(v, int) or v < 1 for v in counts):
            raise ConfigError(f"{path}: {where}.{mode} must be a non-empty list of positive worker counts, "
                              f"got {counts!r}")
        if mode in SINGLE_PROCESS and counts != [1]:
            raise ConfigError(f"{path}: {where}.{mode} is one TensorFlow process: give it [1], not {counts!r}")


def _check_tables(path: str, tables: Any) -> None:
    count = len(schema.CATEGORICAL)
    if isinstance(tables, bool) or not isinstance(tables, int) or not 1 <= tables <= count:
        raise ConfigError(f"{path}: tables must be a whole number from 1 to {count} (the models then read the "
                          f"first that many Criteo id columns C1..), got {tables!r}")


def modes_of(config: Dict[str, Any], model: str) -> Dict[str, List[int]]:
    """The modes (and their worker counts) that ``model`` runs in."""
    return config["model_modes"].get(model, config["modes"])


def path_of(name: str) -> str:
    """``name`` itself if it is a file, else ``benchmarks/configs/<name>.json``."""
    if os.path.isfile(name):
        return name
    path = os.path.join(CONFIG_DIR, name if name.endswith(".json") else name + ".json")
    if not os.path.isfile(path):
        known = sorted(f[:-5] for f in os.listdir(CONFIG_DIR) if f.endswith(".json"))
        raise ConfigError(f"no benchmark configuration {name!r} (looked for {path}); known: {', '.join(known)}")
    return path


def load(name: str) -> Dict[str, Any]:
    """The configuration ``name`` (a file or a name under benchmarks/configs) merged over the defaults."""
    path = path_of(name)
    try:
        with open(path) as f:
            raw = json.load(f)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a JSON object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(DEFAULTS) - {"name"})
    bad = sorted(set(raw.get("model_modes", {})) - set(raw.get("models", DEFAULTS["models"])))
    if bad:
        raise ConfigError(f"{path}: model_modes names models {bad} that are not in models")
    if unknown:
        raise ConfigError(f"{path}: unknown keys {unknown}; known keys: {', '.join(sorted(DEFAULTS))}")
    config = {**DEFAULTS, **raw, "projection": {**DEFAULTS["projection"], **raw.get("projection", {})}}
    config["name"] = raw.get("name", os.path.splitext(os.path.basename(path))[0])
    for where, modes in [("modes", config["modes"])] + [(f"model_modes.{m}", v)
                                                        for m, v in config["model_modes"].items()]:
        _check_modes(path, where, modes)
    _check_tables(path, config["tables"])
    if not isinstance(config["parallel_launches"], bool):
        raise ConfigError(f"{path}: parallel_launches must be true or false, got {config['parallel_launches']!r}")
    from benchmarks import models  # pylint: disable=import-outside-toplevel

    bad = [m for m in config["models"] if m not in models.MODELS]
    if bad:
        raise ConfigError(f"{path}: models {bad} not among {', '.join(sorted(models.MODELS))}")
    if config["api"] not in models.APIS:
        raise ConfigError(f"{path}: api {config['api']!r} not among {', '.join(models.APIS)}")
    if not config["global_batch"] or any(not isinstance(v, int) or v < 1 for v in config["global_batch"]):
        raise ConfigError(f"{path}: global_batch must be a non-empty list of positive integers, "
                          f"got {config['global_batch']!r}")
    if not isinstance(config["warmup"], int) or config["warmup"] < 1:
        raise ConfigError(f"{path}: warmup must be at least 1 (the first timed step's interval starts there)")
    return config


def worker_counts(config: Dict[str, Any]) -> List[int]:
    """Every worker count some run uses, ascending."""
    return sorted({n for model in config["models"] for counts in modes_of(config, model).values() for n in counts})


def matrix(config: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One spec per run: model x global batch x worker count x mode (baselines first)."""
    runs = []
    keys = ("warmup", "steps", "repeats", "dim", "scale", "tables", "api", "bottom_mlp", "top_mlp", "dnn",
            "learning_rate", "seed", "train_batches")
    for model in config["models"]:
        modes = modes_of(config, model)
        order = [m for m in BASELINES + BACKENDS if m in modes]  # baselines first
        for batch in config["global_batch"]:
            common = {"model": model, "global_batch": batch, **{k: config[k] for k in keys}}
            for n in worker_counts(config):
                runs += [{**common, "mode": mode, "workers": n} for mode in order if n in modes[mode]]
    return runs
