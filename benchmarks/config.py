"""Benchmark configurations: ``benchmarks/configs/<name>.json`` and the run matrix they expand to."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
BACKENDS = ("hb", "sok")
BASELINES = ("tf_single", "hvd_replicated")

DEFAULTS: Dict[str, Any] = {
    "description": "",
    "models": ["embedding"],
    "backends": list(BACKENDS),
    "baselines": list(BASELINES),
    "workers": [1, 2],
    "baseline_workers": None,  # worker counts of hvd_replicated; None: the same as "workers"
    "batch_sizes": [512],
    "warmup": 5,
    "steps": 20,
    "repeats": 3,
    "dim": 16,
    "scale": 0.01,
    "learning_rate": 0.05,
    "seed": 1,
    "train_batches": 8,
    "eval_rows": 20000,
    "timeout_s": 900,  # per run
    # One launch per worker count running its runs one after another (fast,
    # for tests; peak memory is then the process's peak so far).
    "share_launch": False,
    "projection": {"batch_size": 512, "max_workers": 1024, "batches": 2, "movielens": True},
    "note": "",
}


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message names the file."""


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
    if unknown:
        raise ConfigError(f"{path}: unknown keys {unknown}; known keys: {', '.join(sorted(DEFAULTS))}")
    config = {**DEFAULTS, **raw, "projection": {**DEFAULTS["projection"], **raw.get("projection", {})}}
    config["name"] = raw.get("name", os.path.splitext(os.path.basename(path))[0])
    for key in ("backends", "baselines"):
        allowed = BACKENDS if key == "backends" else BASELINES
        bad = [x for x in config[key] if x not in allowed]
        if bad:
            raise ConfigError(f"{path}: {key} {bad} not among {', '.join(allowed)}")
    from benchmarks import models  # pylint: disable=import-outside-toplevel

    bad = [m for m in config["models"] if m not in models.MODELS]
    if bad:
        raise ConfigError(f"{path}: models {bad} not among {', '.join(sorted(models.MODELS))}")
    for key in ("workers", "batch_sizes"):
        if not config[key] or any(not isinstance(v, int) or v < 1 for v in config[key]):
            raise ConfigError(f"{path}: {key} must be a non-empty list of positive integers, got {config[key]!r}")
    return config


def matrix(config: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One spec per run: model x batch size x (backends and hvd_replicated per worker count, tf_single once)."""
    runs = []
    keys = ("warmup", "steps", "repeats", "dim", "scale", "learning_rate", "seed", "train_batches", "eval_rows")
    hvd_workers = config["baseline_workers"] or config["workers"]
    for model in config["models"]:
        for batch in config["batch_sizes"]:
            common = {"model": model, "batch_size": batch, **{k: config[k] for k in keys}}
            if "tf_single" in config["baselines"]:
                runs.append({**common, "mode": "tf_single", "workers": 1})
            for n in sorted(set(config["workers"]) | set(hvd_workers)):
                for mode in config["backends"]:
                    if n in config["workers"]:
                        runs.append({**common, "mode": mode, "workers": n})
                if "hvd_replicated" in config["baselines"] and n in hvd_workers:
                    runs.append({**common, "mode": "hvd_replicated", "workers": n})
    return runs
