# The two commands of the README. Each creates or refreshes .venv itself (re-installs when
# pyproject.toml changes), so they work on a fresh machine with only python3.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=

.PHONY: demo lint test test-fast clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	rm -f $(VENV)/.installed-* && touch $@

# Pretrain the tiny BERT on the embedded corpus (no download), from scratch each time.
demo: $(STAMP)
	rm -rf runs/demo
	$(PY) -m bertology.pretrain --config configs/bert.py:tiny --workdir runs/demo

# The linter and the type checker on src/ (configured in pyproject.toml; seconds).
lint: $(STAMP)
	$(VENV)/bin/ruff check src
	$(VENV)/bin/mypy

# Lint, then the whole test suite (what CI runs). worksteal: a worker that runs out of tests takes
# queued ones from the other, which the default scheduler never does (it left one worker idle for
# minutes behind the other's initial share of the slow tests, which conftest orders first).
test: lint
	$(PY) -m pytest -n 2 --dist worksteal $(PYTEST_ARGS)

# Skip the heavier checks marked `slow`.
test-fast: $(STAMP)
	$(PY) -m pytest -n 2 --dist worksteal -m "not slow" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs
