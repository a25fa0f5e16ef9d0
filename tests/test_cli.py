"""One flag convention (collective.cli): every CLI's long options are snake_case, except collective.launch
(horovodrun's -np, -H, kebab-case); the older kebab-case spellings still parse, unlisted in --help."""

import json
import re
import subprocess
import sys
import textwrap

import pyarrow.parquet as pq

# Each --help in its own process, all at once; the CLIs that avoid TensorFlow stay cheap. Those whose --help
# loads TensorFlow (TENSORFLOW) share one process, which runs each as `python CLI --help` would (runpy as
# __main__), so that TensorFlow is imported once, not four times (about 14 CPU-seconds less).
TENSORFLOW = [["modelzoo/dlrm/train.py"], ["modelzoo/deepfm/train.py"], ["modelzoo/movielens/train.py"],
              ["-m", "benchmarks.embedding"]]
CLIS = TENSORFLOW + [["-m", "collective.demo"], ["-m", "benchmarks.run"], ["-m", "benchmarks.report"],
                     ["-m", "benchmarks.kernels"], ["-m", "benchmarks.projection"], ["-m", "benchmarks.data"],
                     ["-m", "datasets.criteo"], ["-m", "datasets.movielens"], ["-m", "datasets.synthetic"]]
LONG_OPTION = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")
_HELPS_IN_ONE = textwrap.dedent("""
    import contextlib, io, json, runpy, sys
    helps = []
    for cli in json.loads(sys.argv[1]):
        sys.argv, text, code = [cli[-1], "--help"], io.StringIO(), 0
        with contextlib.redirect_stdout(text):
            try:
                if cli[0] == "-m":
                    runpy.run_module(cli[1], run_name="__main__", alter_sys=True)
                else:
                    runpy.run_path(cli[0], run_name="__main__")
            except SystemExit as exit:
                code = exit.code
        helps.append([text.getvalue(), code])
    print(json.dumps(helps))
""")


def _helps(repo_root, clis):
    """(stdout, stderr, exit code) of ``CLI --help`` for each of ``clis``."""
    shared = [cli for cli in clis if cli in TENSORFLOW]
    procs = [subprocess.Popen([sys.executable, *cli, "--help"], cwd=repo_root, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for cli in clis if cli not in TENSORFLOW]
    helps = {}
    if shared:
        proc = subprocess.run([sys.executable, "-c", _HELPS_IN_ONE, json.dumps(shared)], cwd=repo_root,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        lines = proc.stdout.strip().splitlines()
        for cli, (out, code) in zip(shared, json.loads(lines[-1])):
            helps[tuple(cli)] = (out, proc.stderr, code or 0)
    for cli, p in zip([cli for cli in clis if cli not in TENSORFLOW], procs):
        helps[tuple(cli)] = p.communicate(timeout=300) + (p.returncode,)
    return [helps[tuple(cli)] for cli in clis]


def test_every_cli_spells_long_options_in_snake_case(repo_root):
    for cli, (out, err, code) in zip(CLIS, _helps(repo_root, CLIS)):
        assert code == 0, (cli, err[-2000:])
        options = set(LONG_OPTION.findall(out))
        assert len(options) >= 2, (cli, out)
        # argparse's BooleanOptionalAction writes --no-X beside --X; nothing else may carry a hyphen.
        kebab = {o for o in options if "-" in o[2:] and not (o.startswith("--no-") and "--" + o[5:] in options)}
        assert not kebab, f"{' '.join(cli)} --help lists {sorted(kebab)}"


def test_the_launcher_keeps_horovodrun_spellings(repo_root):
    (out, err, code), = _helps(repo_root, [["-m", "collective.launch"]])
    assert code == 0, err
    assert "-np" in out and "-H" in out and "--stall-timeout" in out


def test_old_kebab_spellings_still_parse(repo_root, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "datasets.synthetic", "--out", str(tmp_path), "--rows", "10",
                           "--row-group-size", "4", "--teacher-seed", "2", "--quiet"], cwd=repo_root,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    files = sorted(tmp_path.glob("*.parquet"))
    assert files and pq.ParquetFile(files[0]).metadata.num_row_groups == 3  # 10 rows in groups of 4
    from benchmarks import embedding  # pylint: disable=import-outside-toplevel

    args = embedding.parse_args(["--per-table", "--batch-size", "96"])
    assert args.per_table and args.batch_size == 96
