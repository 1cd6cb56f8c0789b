# make test  — the whole suite: lint, types, tests on Django 5.2 and (where Python 3.13 is
#              found) again on Django 6.1. Each bootstraps its own virtualenv.
# make demo  — the example project against Redis.
# make bench — the benchmark suite (a private Redis, real workers): a Markdown table.
# make chaos — the fault scenarios (tests/chaos) at full size, then their figures table.

PYTHON ?= python3
VENV := .venv
VENV_NEXT := .venv-django61
PY313 := $(shell scripts/find-python 3.13)
PYTEST_ARGS ?=
# make chaos: a 100,000-message soak and 5 faults per scenario (make test runs them small).
CHAOS_ARGS ?= --chaos-messages 100000 --chaos-rounds 5

PY312 := $(shell scripts/find-python 3.12)

.PHONY: test test-main test-next lint demo bench chaos redis-check tox clean

test: redis-check lint test-main test-next

redis-check:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "redis-server is not on PATH. The tests start their own Redis servers and need it:"; \
	  echo "  Debian/Ubuntu: sudo apt-get install redis-server    macOS: brew install redis"; \
	  exit 1; }
	@command -v redis-cli >/dev/null 2>&1 || { echo "redis-cli is not on PATH (it comes with redis-server)."; exit 1; }

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e ".[test,lint,tasks,hiredis]" "Django>=5.2,<6.0"
	touch $@

$(VENV_NEXT)/.installed: pyproject.toml
	$(PY313) -m venv $(VENV_NEXT)
	$(VENV_NEXT)/bin/pip install --quiet --upgrade pip
	$(VENV_NEXT)/bin/pip install --quiet -e ".[test]" "Django>=6.1,<6.2"
	touch $@

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy delayqueue_django tests example_project benchmarks

test-main: $(VENV)/.installed
	@echo "== pytest: $$($(VENV)/bin/python --version), Django $$($(VENV)/bin/python -m django --version)"
	$(VENV)/bin/pytest $(PYTEST_ARGS)

ifeq ($(PY313),)
test-next:
	@echo "== SKIPPED the Django 6.1 run: no Python 3.13 found (pyenv install 3.13, or put python3.13 on PATH)."
else
# The fault scenarios drive Redis and worker processes, not Django: the first run has them.
test-next: $(VENV_NEXT)/.installed
	@echo "== pytest: $$($(VENV_NEXT)/bin/python --version), Django $$($(VENV_NEXT)/bin/python -m django --version)"
	@echo "== (the chaos scenarios ran in the first run; deselected here with -m 'not chaos')"
	$(VENV_NEXT)/bin/pytest -m "not chaos" $(PYTEST_ARGS)
endif

# The whole tox matrix; the interpreters are passed explicitly because tox cannot see
# through pyenv's shims.
tox: redis-check $(VENV)/.installed
	$(VENV)/bin/pip install --quiet tox
	$(VENV)/bin/tox --discover $(PY312) $(PY313) $(TOX_ARGS)

chaos: redis-check $(VENV)/.installed
	$(VENV)/bin/pytest tests/chaos -m chaos --timeout 1800 $(CHAOS_ARGS) $(PYTEST_ARGS)

demo: redis-check $(VENV)/.installed
	$(VENV)/bin/python example_project/demo.py

# BENCH_ARGS="--runs 3 --only send,drain" narrows it; python -m benchmarks --help lists all.
bench: redis-check $(VENV)/.installed
	$(VENV)/bin/python -m benchmarks $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(VENV_NEXT) .tox .mypy_cache .ruff_cache .pytest_cache .demo
