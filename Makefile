# The two commands of the README: `make demo` and `make test`. Every target sets
# up .venv first (scripts/setup.sh, idempotent: seconds when nothing changed).
# `make bench` runs the quick benchmark configuration and writes reports/quick/.
PYTHON := .venv/bin/python
WORKERS ?= 2

.PHONY: setup demo test bench clean

setup:
	@bash scripts/setup.sh

demo: setup
	@$(PYTHON) -m collective.demo --workers $(WORKERS)

test: setup
	@$(PYTHON) -m pytest -q $(PYTEST_ARGS)

bench: setup
	@$(PYTHON) -m benchmarks.run --config quick

clean:
	rm -rf .venv build *.egg-info .pytest_cache
