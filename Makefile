# The two commands of the README: `make demo` and `make test`. Every target sets
# up .venv first (scripts/setup.sh, idempotent: seconds when nothing changed).
# `make bench` runs the quick benchmark configuration and writes reports/quick/ (records, step traces of the
# headline runs, the per-step overhead, REPORT.md), the stream benchmark of vocabulary policies (reports/stream/)
# and the online-training benchmark's small configuration (reports/online_quick); `make bench-full` does the same
# for the three configurations at Criteo Kaggle's real table sizes (reports/full, reports/full_zoo,
# reports/full_mlperf) and the online-training benchmark at real sizes (`make bench-online`: reports/online).
PYTHON := .venv/bin/python
WORKERS ?= 2
PROFILED := dlrm:tf_mts@1,dlrm:tf_mts_tuned@1,dlrm:ceiling@1,dlrm:hb@1,dlrm:hvd_dp_tuned@2,dlrm:ceiling@2,dlrm:hb@2,dlrm:sok@2
FULL_CONFIGS := full full_zoo full_mlperf

.PHONY: setup demo test bench bench-full bench-online clean

setup:
	@bash scripts/setup.sh

demo: setup
	@$(PYTHON) -m collective.demo --workers $(WORKERS)

test: setup
	@$(PYTHON) tests/timed.py "make test" $(PYTHON) -m pytest -q $(PYTEST_ARGS)

bench: setup
	@$(PYTHON) -m benchmarks.run --config quick --no_report
	@$(PYTHON) -m benchmarks.profile --config quick --runs $(PROFILED)
	@$(PYTHON) -m benchmarks.overhead --out reports/quick
	@$(PYTHON) -m benchmarks.report --dir reports/quick
	@$(PYTHON) -m benchmarks.stream --out reports/stream
	@$(PYTHON) -m benchmarks.online --config quick --out reports/online_quick

bench-full: setup
	@for c in $(FULL_CONFIGS); do $(PYTHON) -m benchmarks.run --config $$c --no_report || exit 1; done
	@$(PYTHON) -m benchmarks.profile --config full --runs dlrm:tf_mts_tuned@1,dlrm:ceiling@1,dlrm:hb@1
	@for c in $(FULL_CONFIGS); do $(PYTHON) -m benchmarks.report --dir reports/$$c || exit 1; done
	@$(MAKE) --no-print-directory bench-online

bench-online: setup
	@$(PYTHON) -m benchmarks.online --config full --out reports/online

clean:
	rm -rf .venv build *.egg-info .pytest_cache
