"""benchmarks: byte projection against hand counts and collective.comm's counter, harness end to end, report."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import config as configs
from benchmarks import id_model, projection, projection_report, real_projection, report
from benchmarks.batches import synthetic_rows
from benchmarks.tables import table_sizes
from collective import byte_model
from datasets import schema
from datasets.synthetic import cardinalities, zipf_ranks
from datasets.synthetic.generate import rank_ids

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = configs.BASELINES + configs.BACKENDS
# The end-to-end tests share one harness run (3 launches at once, 1-3 workers, 4 of the 26 tables): a few minutes
# on a 2-core machine, much longer on a loaded one, so they get more than the default 600 s.
END_TO_END_TIMEOUT = pytest.mark.timeout(1800)


# ---------------------------------------------------------------- projection by hand

def test_projection_counts_a_small_batch_by_hand():
    # N=2, 2 samples per worker, one table of 10 rows, dim 2, one dense variable of 12 bytes.
    # Worker 0 holds ids [1, 1], worker 1 holds [2, 3]; owner = id % 2.
    ids, vocabs, dense = [np.array([1, 1, 2, 3])], [10], [12]
    hb = projection.step_bytes(ids, vocabs, 2, 2, 2, "hb", dense).per_worker
    # hb: w0 sends id 1 (8) + its gradient (8) and returns id 2's vector (8); w1 sends id 2 (8) + gradient (8)
    # and returns id 1's vector (8). Dense: 12 * 2 * 1 // 2 = 12.
    assert hb.tolist() == [24 + 12, 24 + 12]
    sok = projection.step_bytes(ids, vocabs, 2, 2, 2, "sok", dense).per_worker
    # sok: allgather of 2 (id, sample) rows + the closing row x 16 B; the other worker's 2 samples' partial
    # sums ([2, 2] floats, 16 B) out, their gradients back (16 B).
    assert sok.tolist() == [48 + 16 + 16 + 12] * 2
    hvd = projection.step_bytes(ids, vocabs, 2, 2, 2, "hvd_replicated", dense).per_worker
    # Replicated: unique ids x (2 floats + int64 index) to the other worker: w0 has 1 unique id, w1 has 2.
    assert hvd.tolist() == [16 + 12, 32 + 12]
    # A table with fewer rows than workers stays whole under hb: an allreduce of its [1, 2 + 1] floats (12 B),
    # 12 * 2 * 1 // 2 = 12 B per worker.
    small = projection.step_bytes([np.array([0, 0, 0, 0])], [1], 2, 2, 2, "hb").per_worker
    assert small.tolist() == [12, 12]
    assert projection.step_bytes([np.array([5, 6])], [10], 2, 1, 2, "hb", dense).total == 0


def test_projection_sok_pays_one_allgather_and_two_alltoalls_per_lookup_group():
    ids, vocabs, dims = [np.array([1, 1, 2, 3])] * 2, [10, 10], [1, 2]
    # Per group: (2 samples x its tables + 1) rows x 16 B; 2 partial sums x its widths x 4 B, out and back.
    one = projection.step_bytes(ids, vocabs, dims, 2, 2, "sok", groups=[0, 0]).per_worker
    assert one.tolist() == [(4 + 1) * 16 + 2 * 2 * 3 * 4] * 2
    two = projection.step_bytes(ids, vocabs, dims, 2, 2, "sok", groups=[0, 1]).per_worker
    assert two.tolist() == [(2 + 1) * 16 + 2 * 2 * 1 * 4 + (2 + 1) * 16 + 2 * 2 * 2 * 4] * 2
    assert projection.model_tables("deepfm", [10] * 26, 4)[3] == [0] * 26 + [1] * 26


def test_projection_time_model_and_movielens_rows():
    step = projection.StepBytes(np.array([1000, 3000]), alltoall_calls=3, other_calls=2)
    fabric = projection.Fabric("test", bandwidth=1e3, latency=0.5)
    assert projection.projected_seconds(step, 2, fabric) == pytest.approx(3 * 0.5 + 2 * 0.5 + 3.0)
    source = projection.IdSource("toy", [7, 5], lambda rows, k: [np.arange(rows) % 7, np.arange(rows) % 5])
    rows = projection.project(source, dim=4, batch_size=8, worker_counts=[1, 2, 4], batches=1, dense_features=0)
    assert {(r["backend"], r["workers"]) for r in rows} == {(b, n) for b in projection.BACKENDS for n in (1, 2, 4)}
    assert all(r["bytes_per_step"] == 0 for r in rows if r["workers"] == 1)
    assert all(r["bytes_per_step"] > 0 for r in rows if r["workers"] > 1)



def test_host_projection_counts_both_levels_by_hand():
    # 3 ranks, host 0 = ranks 0 and 1, host 1 = rank 2; owner id % 3; dim 2: an id out with its gradient is
    # 8 + 8 bytes, a vector back 8.
    ids, hosts = [np.array([5, 2, 2, 1]), np.array([5, 3]), np.array([4, 0])], [[0, 1], [2]]
    flat = projection.host_step_bytes(ids, hosts, 2, hierarchical=False)
    # across: rank 0 asks 2 and 5, rank 1 asks 5 (owner 2), rank 2 asks 0 and 4 (owners 0 and 1)
    assert flat.cross.tolist() == [3 * 16 + 2 * 8, 2 * 16 + 3 * 8]
    # within host 0: rank 0 asks 1 of rank 1, rank 1 asks 3 of rank 0
    assert flat.intra.tolist() == [16 + 8, 16 + 8, 0]
    hier = projection.host_step_bytes(ids, hosts, 2, hierarchical=True)
    # host 0 asks {2, 5} once, host 1 {0, 4}
    assert hier.cross.tolist() == [2 * 16 + 2 * 8, 2 * 16 + 2 * 8]
    # host 0's relays: owners 0 and 2 -> rank 0, owner 1 -> rank 1: rank 0 sends 1, rank 1 sends 3 and 5
    assert hier.intra.tolist() == [16 + 2 * 8, 2 * 16 + 8, 0]
    for step, hierarchical in ((flat, False), (hier, True)):
        crossing = byte_model.cross_host_ids(ids, lambda i: np.asarray(i) % 3, hosts, hierarchical)
        assert step.cross.sum() == crossing * (8 + 2 * 2 * 4)
    two = projection.HostFabric("test", intra=projection.Fabric("in", bandwidth=8.0, latency=0.5),
                                cross=projection.Fabric("across", bandwidth=16.0, latency=1.0))
    # 3 all-to-alls over all ranks of 1 hop within and 1 across; the hierarchical exchange 3 more within host 0
    assert projection.host_projected_seconds(flat, hosts, two) == pytest.approx(3 * 1.5 + 24 / 8 + 64 / 16)
    assert projection.host_projected_seconds(hier, hosts, two) == pytest.approx(3 * 1.5 + 3 * 0.5 + 40 / 8 + 48 / 16)


def test_host_projection_with_one_rank_per_host_is_the_flat_projection():
    n, b, vocab, dim = 4, 6, 50, 3
    ids = np.random.default_rng(3).integers(0, vocab, n * b)
    hosts = [[r] for r in range(n)]
    per_rank = [ids[r * b:(r + 1) * b] for r in range(n)]
    flat = projection.step_bytes([ids], [vocab], dim, n, b, "hb")
    for hierarchical in (False, True):
        step = projection.host_step_bytes(per_rank, hosts, dim, hierarchical)
        assert step.cross.tolist() == flat.per_worker.tolist() and step.intra.sum() == 0
    fabric = projection.Fabric("test", bandwidth=100.0, latency=0.01)
    two = projection.HostFabric("test", intra=projection.FABRICS[0], cross=fabric)
    assert projection.host_projected_seconds(step, hosts, two) == pytest.approx(
        projection.projected_seconds(flat, n, fabric))



def test_hosts_report_rows_and_projection_go_through_the_two_level_model(tmp_path):
    from benchmarks import hosts  # pylint: disable=import-outside-toplevel  (imports the hosts' worker)
    record = {"steps": 2, "batch": 8, "vocab": 50, "dim": 2, "warmup": 1, "hierarchical": True}
    layout = [[0, 1], [2, 3]]
    steps = hosts.modelled_steps(layout, record, hierarchical=True)
    payload = sum(int(s.cross.sum()) for s in steps)
    link = np.mean([projection.host_projected_seconds(s, layout, hosts.fabric("1gbit")) for s in steps])
    where = tmp_path / "records" / "1gbit_4_hierarchical"
    where.mkdir(parents=True)
    for rank in range(4):  # each host's first rank reads its link: together they sent the framed model's bytes
        sent = hosts.wire_bytes(payload) // 2 + (hosts.wire_bytes(payload) % 2 if rank == 2 else 0)
        (where / f"rank{rank}.json").write_text(json.dumps(dict(record, rank=rank, seconds=0.5 + rank / 100,
                                                                link={"tx_bytes": sent if rank in (0, 2) else 0})))
    [row] = hosts.load(str(tmp_path))
    assert row["error"] == 0 and row["model_payload_B_per_sample"] == payload / (2 * 8 * 4)
    assert row["off_link_seconds"] == pytest.approx(0.53 / 2 - link)
    assert hosts.link_rate("10gbit") == 1e10
    fabric = hosts.fabric("10gbit")
    rows = hosts.project(record, 0.1, [fabric], hosts=2, per_host=2)
    ids = [hosts.ids_of(1, r, 8, 50) for r in range(4)]
    for row, hierarchical in zip(rows, (False, True)):
        step = projection.host_step_bytes(ids, layout, 2, hierarchical)
        seconds = projection.host_projected_seconds(step, layout, fabric)
        assert row["samples_per_s"] == pytest.approx(32 / (0.1 + seconds))
        assert row["cross_B_per_sample"] == pytest.approx(step.cross.sum() / 32)


# ---------------------------------------------------------------- projection at real sizes: expected distinct ids

def test_expected_distinct_ids_match_numpy_sampling():
    rng = np.random.default_rng(3)
    # (rows, exponent, draws, workers); 200,000 rows go past id_model.HEAD, so their tail is integrated in buckets.
    for size, exponent, draws, workers in [(50, 1.1, 40, 4), (1000, 0.8, 300, 3), (200_000, 1.1, 4096, 5)]:
        law, trials = id_model.PowerLaw(size, exponent), 300
        unique, owned = np.zeros(trials), np.zeros((trials, workers))
        for t in range(trials):
            ids = np.unique(rank_ids(7, size, zipf_ranks(rng, draws, size, exponent)))
            unique[t], owned[t] = len(ids), np.bincount(ids % workers, minlength=workers)
        expected = id_model.expected_unique(law, draws)
        assert abs(expected - unique.mean()) < 4 * unique.std() / np.sqrt(trials), (size, expected, unique.mean())
        per_owner = id_model.expected_owned(law, draws, workers, table=7)
        assert per_owner.sum() == pytest.approx(expected, rel=1e-12)
        assert np.all(abs(per_owner - owned.mean(0)) < 4 * owned.std(0) / np.sqrt(trials) + 1e-9), (size, per_owner)
    assert id_model.PowerLaw(40_000_000).mass(0, 40_000_000) == pytest.approx(1.0, rel=1e-12)


def test_expected_step_bytes_match_counts_on_drawn_batches():
    n, b, batches, dim = 8, 256, 4, 16
    vocabs = list(cardinalities(0.01))
    columns = synthetic_rows(batches * n * b, 0.01, 5)
    dense = projection.head_param_bytes(len(vocabs), dim, len(schema.DENSE))
    tables = real_projection.expected_tables(vocabs, "embedding", dim, n, b)
    for backend in projection.BACKENDS:
        counted = np.mean([projection.step_bytes([columns[c][k * n * b:(k + 1) * n * b] for c in schema.CATEGORICAL],
                                                 vocabs, dim, n, b, backend, dense).total for k in range(batches)])
        assert projection.traffic_bytes(tables, n, b, backend, dense).total == pytest.approx(counted, rel=0.01)
    # Every table sharded (none has fewer rows than N = 2): hb moves exactly the deduplicated ids.
    two = real_projection.expected_tables(vocabs, "embedding", dim, 2, b)
    assert projection.traffic_bytes(two, 2, b, "hb", dense).total == pytest.approx(
        projection.lower_bound_bytes(two, 2, dense), rel=1e-12)


def test_config_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"modes": {"hb": [1]}, "speed": 3}))
    with pytest.raises(configs.ConfigError, match=r"bad\.json.*unknown keys \['speed'\]"):
        configs.load(str(bad))
    bad.write_text(json.dumps({"modes": {"estimator": [2]}}))
    with pytest.raises(configs.ConfigError, match=r"bad\.json: modes\.estimator is one TensorFlow process"):
        configs.load(str(bad))
    bad.write_text(json.dumps({"models": ["dlrm"], "model_modes": {"deepfm": {"hb": [1]}}}))
    with pytest.raises(configs.ConfigError, match=r"model_modes names models \['deepfm'\]"):
        configs.load(str(bad))
    with pytest.raises(configs.ConfigError, match="no benchmark configuration 'nope'"):
        configs.load("nope")
    for tables in (0, 27, 2.5, True):
        bad.write_text(json.dumps({"tables": tables}))
        with pytest.raises(configs.ConfigError, match=rf"bad\.json: tables must be a whole number from 1 to 26.*"
                                                      rf"got {tables!r}"):
            configs.load(str(bad))
    bad.write_text(json.dumps({"parallel_launches": "yes"}))
    with pytest.raises(configs.ConfigError, match=r"bad\.json: parallel_launches must be true or false, got 'yes'"):
        configs.load(str(bad))


def test_tables_key_keeps_the_first_criteo_columns():
    tiny = configs.load("tiny")
    assert tiny["tables"] == 4 and all(r["tables"] == 4 for r in configs.matrix(tiny))
    assert table_sizes(tiny) == cardinalities(tiny["scale"])[:4]
    assert min(table_sizes(tiny)) >= 3, "every tiny table is sharded on 3 workers (hb moves the lower bound)"
    assert configs.load("quick")["tables"] == 26 and len(table_sizes({"scale": 0.01})) == 26


def test_quick_config_runs_the_headline_and_its_baselines():
    quick = configs.load("quick")
    runs = configs.matrix(quick)
    headline = {("hb", 1), ("hb", 2), ("sok", 2), ("ceiling", 1), ("ceiling", 2)}
    as_shipped_and_tuned = {("estimator", 1), ("estimator_tuned", 1), ("tf_mts", 1), ("tf_mts_tuned", 1),
                            ("hvd_dp", 2), ("hvd_dp_tuned", 2)}
    for model in ("dlrm", "deepfm"):
        assert {(r["mode"], r["workers"]) for r in runs if r["model"] == model} >= headline | as_shipped_and_tuned
    assert all(r["global_batch"] == 4096 for r in runs)
    for name in ("full", "full_zoo", "full_mlperf"):
        full = configs.load(name)
        runs = {(r["mode"], r["workers"]) for r in configs.matrix(full)}
        assert full["scale"] == 1.0 and runs >= headline | {("tf_mts_tuned", 1), ("hvd_dp_tuned", 2)}, name


# ---------------------------------------------------------------- report errors

def test_missing_or_malformed_records_name_the_file(tmp_path):
    with pytest.raises(report.RecordError, match="no records"):
        report.load_records(str(tmp_path))
    records = tmp_path / "records"
    records.mkdir()
    (records / "broken.json").write_text("{not json")
    with pytest.raises(report.RecordError, match=r"broken\.json cannot be read as JSON"):
        report.load_records(str(tmp_path))
    (records / "broken.json").write_text(json.dumps({"schema": 1, "run_id": "x", "model": "embedding",
                                                     "mode": "hb", "workers": 2, "global_batch": 8, "status": "ok"}))
    with pytest.raises(report.RecordError, match=r"broken\.json lacks samples_per_s"):
        report.load_records(str(tmp_path))


# ---------------------------------------------------------------- end to end through the launcher

@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The ``tiny`` configuration run once through ``python -m benchmarks.run`` (real launcher, 1-3 workers)."""
    out = tmp_path_factory.mktemp("bench") / "tiny"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--config", "tiny", "--out", str(out)],
                          capture_output=True, text=True, timeout=1700, cwd=ROOT)
    assert proc.returncode == 0, f"benchmarks.run failed\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    return out, proc.stdout


@END_TO_END_TIMEOUT
def test_harness_writes_a_valid_record_per_run(tiny_run):
    out, stdout = tiny_run
    records = report.load_records(str(out))
    expected = {(r["model"], r["mode"], r["workers"]) for r in configs.matrix(configs.load("tiny"))}
    assert {(r["model"], r["mode"], r["workers"]) for r in records} == expected
    assert {r["mode"] for r in records} == set(MODES)
    assert f"[{len(records)}/{len(records)}]" in stdout
    for r in records:
        assert r["status"] == "ok", r.get("error")
        s = r["samples_per_s"]
        assert 0 < s["total_min"] <= s["total_median"] <= s["total_max"]
        assert len(s["repeats"]) == 2 and s["per_worker_median"] == pytest.approx(s["total_median"] / r["workers"])
        assert 0 < r["step_time_s"]["p50"] <= r["step_time_s"]["p90"] and len(r["step_time_s"]["all"]) == 4
        assert r["global_batch"] == r["workers"] * r["worker_batch"] == 96
        assert len(r["peak_rss_bytes"]) == r["workers"] and min(r["peak_rss_bytes"]) > 0
        assert r["machine"]["cores"] >= 1 and r["machine"]["libraries"]["tensorflow"] != "not installed"
        assert (r["bytes_per_step"] > 0) == (r["workers"] > 1), r["run_id"]
    # Sharded tables: each worker holds about 1/N of what one process holds; Horovod DP holds them whole.
    held = {(r["model"], r["mode"], r["workers"]): max(r["embedding_bytes"]) for r in records}
    whole = held[("dlrm", "estimator", 1)]
    assert whole > 0 and held[("dlrm", "tf_mts", 1)] == whole and held[("dlrm", "hvd_dp", 2)] == whole
    assert held[("dlrm", "hb", 2)] < 0.6 * whole and held[("dlrm", "sok", 2)] < 0.6 * whole


@END_TO_END_TIMEOUT
def test_every_mode_trains_the_same_model(tiny_run):
    """The stock Estimator, plain TF, Horovod DP and the three backends (hb also packed) start from the same
    tables and read the same rows: their training losses agree (the rows' order within a global batch differs with N)."""
    out, _ = tiny_run
    losses = {}
    for r in report.load_records(str(out)):
        # the ceiling is the model without tables; DLRM with its tables outside embedding_scope() is DLRM
        model = "dlrm" if r["model"] == "dlrm_outside_scope" else r["model"]
        model = f"{model} ceiling" if r["mode"] == "ceiling" else model
        losses.setdefault(model, {})[(r["model"], r["mode"], r["workers"])] = r["loss"]
    assert len(losses["dlrm"]) == 16 and len(losses["dlrm ceiling"]) == 2
    groups = {(r["mode"], r["workers"]): r["packing_groups"] for r in report.load_records(str(out))
              if r["model"] == "dlrm" and r["mode"] in ("hb", "hb_packed")}
    assert groups[("hb", 1)] == 0 and groups[("hb_packed", 1)] >= 1 and groups[("hb_packed", 2)] >= 1, groups
    assert losses["dlrm ceiling"][("dlrm", "ceiling", 1)] != pytest.approx(losses["dlrm"][("dlrm", "hb", 1)])
    for model, by_run in losses.items():
        values = np.array(list(by_run.values()))
        assert np.all(np.isfinite(values)) and values.max() - values.min() < 2e-3 * values.mean(), (model, by_run)


@END_TO_END_TIMEOUT
def test_tuned_baselines_and_collective_read_no_whole_table(tiny_run):
    """In the graphs TensorFlow runs for a step (after Grappler), the baselines as shipped read whole tables
    (its SimplifyEmbeddingLookupStage); the tuned ones, the ceiling and every collective mode, tables outside
    embedding_scope() included, read none, on 1, 2 and 3 workers."""
    out, _ = tiny_run
    seen = set()
    for r in report.load_records(str(out)):
        reads = r["whole_table_reads"]
        assert len(reads) == r["workers"] and all(isinstance(c, int) for c in reads), r["run_id"]
        if r["mode"] in configs.AS_SHIPPED:  # every table (tiny's models: one per column) read whole, every worker
            assert reads == [r["spec"]["tables"]] * r["workers"], (r["run_id"], reads)
        else:
            assert max(reads) == 0, (r["run_id"], reads)
            seen.add((r["model"], r["workers"]))
    assert {("dlrm_outside_scope", n) for n in (1, 2, 3)} | {("dlrm", 1), ("dlrm", 2), ("embedding", 3)} <= seen


@END_TO_END_TIMEOUT
def test_projected_bytes_equal_counted_bytes_on_2_and_3_workers(tiny_run):
    out, _ = tiny_run
    checked = 0
    for r in report.load_records(str(out)):
        if r["projected_bytes_per_step"] is None or r["workers"] == 1:
            continue
        assert r["projected_bytes_per_step"] == pytest.approx(r["bytes_per_step"], rel=1e-12), r["run_id"]
        if r["mode"] == "hb" and r["workers"] > 1:  # every tiny table is sharded: hb moves the lower bound
            assert r["lower_bound_bytes_per_step"] == pytest.approx(r["bytes_per_step"], rel=1e-12), r["run_id"]
        checked += 1
    assert checked == 10  # dlrm: hvd_dp, hvd_dp_tuned, hb, hb_packed, sok on 2; embedding: hvd_dp on 2, hb and sok on
    # 2 and 3


@END_TO_END_TIMEOUT
def test_report_headlines_the_baselines_with_targets_and_plots(tiny_run):
    out, _ = tiny_run
    text = (out / "REPORT.md").read_text()
    assert text.index("## Headline") < text.index("### Targets") < text.index("## Machine")
    for mode in MODES:
        assert f"| {mode} |" in text
    for figure in ("hb@1 / best baseline@1 (", "hb@1 / embedding-free ceiling@1 |", "hb@2 / best Horovod DP@2 (",
                   "sok@2 / best Horovod DP@2 (", "hb@2 bytes/sample / dedup lower bound |"):
        assert f"| dlrm | 96 | {figure}" in text
    assert report.WHY_AS_SHIPPED in text and "| / best baseline@N |" in text
    for section in ("Bytes on the wire", "Memory per worker", "Training loss", "Communication at real table sizes",
                    "The embedding-only step"):
        assert section in text
    for png in ("throughput.png", "step_times.png", "bytes.png", "memory.png", projection_report.PLOT):
        assert (out / png).stat().st_size > 1000 and f"({png})" in text
    projected = json.loads((out / "projection.json").read_text())["real_rows"]
    assert {r["workers"] for r in projected} == {1, 2, 3, 4, 8, 16}


@END_TO_END_TIMEOUT
def test_real_size_projection_calibrates_on_the_tiny_run_and_writes_its_section(tiny_run, tmp_path):
    out, _ = tiny_run
    calibration = real_projection.calibration_rows(report.load_records(str(out)))
    assert {(c["model"], c["backend"], c["workers"]) for c in calibration} == {
        ("embedding", "hb", 2), ("embedding", "hb", 3), ("embedding", "sok", 2), ("embedding", "sok", 3),
        ("embedding", "hvd_replicated", 2), ("dlrm", "hb", 2), ("dlrm", "sok", 2), ("dlrm", "hvd_replicated", 2)}
    for c in calibration:
        assert c["sampled_bytes_per_sample"] == pytest.approx(c["measured_bytes_per_sample"], rel=1e-12)
        # sok's bytes do not depend on the ids; the others' are an expectation over two batches of 64 rows a worker.
        assert abs(c["error_pct"]) < (1e-9 if c["backend"] == "sok" else 5.0), c
    rows = real_projection.projection_rows(worker_counts=[1, 2, 8, 1024], batch_size=64, dim=4)
    text = projection_report.projection_section(rows, calibration, str(tmp_path))
    assert (tmp_path / projection_report.PLOT).stat().st_size > 1000 and f"({projection_report.PLOT})" in text
    assert text.count("| embedding | hb |") == 2 and text.count("| dlrm | hb |") == 1 and "Largest error" in text
    for dataset in real_projection.DATASETS:
        assert f"**{dataset.name}**" in text
        for fabric in projection.FABRICS:
            runs = projection_report.winners(rows)[dataset.name, fabric.name]
            fastest = [backend for n in (2, 8, 1024) for backend, lo, hi in runs if lo <= n <= hi]
            expected = []
            for n in (2, 8, 1024):
                times = {r["backend"]: r[f"seconds[{fabric.name}]"] for r in rows
                         if r["dataset"] == dataset.name and r["workers"] == n}
                expected.append(min(times, key=times.get))
            assert fastest == expected, (dataset.name, fabric.name, runs)
