# The two commands of the README: `make demo` and `make test`. Both set up
# .venv first (scripts/setup.sh, idempotent: seconds when nothing changed).
PYTHON := .venv/bin/python
WORKERS ?= 2

.PHONY: setup demo test clean

setup:
	@bash scripts/setup.sh

demo: setup
	@$(PYTHON) -m collective.demo --workers $(WORKERS)

test: setup
	@$(PYTHON) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf .venv build *.egg-info .pytest_cache
