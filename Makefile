# Every target creates/reuses .venv, so the two README commands work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 120
export PREFECT_HOME ?= $(CURDIR)/.prefect
export MLFLOW_TRACKING_URI ?= sqlite:///$(CURDIR)/mlflow.db
CONFIG ?= pipeline_config/presets/trifeature_quick.yaml
SEEDS ?= 0,1,2

.PHONY: install run test test-slow test-all reproduce bench bench-scale gpu-check gpu-bundle ui-mlflow ui-prefect clean stack stack-stop ui-check image

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[cpu,test]'
	$(BIN)/python -m flows.local_server --make-template || echo "no Prefect database template: each new database is migrated as a run starts"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/mclpipe run $(CONFIG)

# make test runs in pytest-xdist processes: the cores this process may use, at most 4 (each one runs torch and
# starts its own Prefect test server); TEST_WORKERS=0 runs everything in one process. --durations=15: the slowest
# tests at the end of the log, where CI time is tuned from.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(4, len(os.sched_getaffinity(0))))")
# torch's CPU threads in each test process: its share of the cores (WORKERS=0: one process, all of them). torch takes
# every core by default, and N processes each spinning that many OpenMP threads oversubscribe the machine: two slow
# tests side by side on 2 cores took 30 % longer that way (BENCHMARKS.md, "CI runs"). OMP_NUM_THREADS set by hand wins.
threads_per = $(or $(OMP_NUM_THREADS),$(shell $(PYTHON) -c "import os; print(max(1, len(os.sched_getaffinity(0)) // max(1, $(1))))"))

test: $(STAMP)
	OMP_NUM_THREADS=$(call threads_per,$(TEST_WORKERS)) $(BIN)/python -m pytest -q -m "not slow" -n $(TEST_WORKERS) \
	  --dist worksteal --durations=15

# make test-slow runs in SLOW_WORKERS pytest-xdist processes (default 2) with --dist loadgroup: the tests of a group
# run in one process, one after the other, because they share a singleton (tests/conftest.py lists each group's
# files and schedules them): "team_stack", every test on the session's PostgreSQL stack (its servers, its `prefect worker` and
# work pools; the load tests' eight pipelines too, so they never train beside another stack test); "slurm", the
# one-node Slurm cluster (OverSubscribe=NO: a second test's job would queue behind the first and miss its
# timings); "slurm_two_nodes", the two-node cluster of .ci/setup-slurm-2node.sh (one test kills a node of it).
# The rest share nothing fixed: free ports, their own tmp_path (tmpfs mounts included), their own
# PostgreSQL databases (.ci/setup-postgres.sh takes a lock), signals within their own process.
# SLOW_WORKERS=0 runs them in one process. -rfE --durations=30: what failed and what took longest, in the log's tail.
SLOW_WORKERS ?= 2

test-slow: $(STAMP)
	OMP_NUM_THREADS=$(call threads_per,$(SLOW_WORKERS)) $(BIN)/python -m pytest -q -m slow -n $(SLOW_WORKERS) \
	  --dist loadgroup -rfE --durations=30

test-all: $(STAMP)
	$(BIN)/python -m pytest -q

reproduce: $(STAMP)
	$(BIN)/mclpipe reproduce $(CONFIG) --seeds $(SEEDS)

bench: $(STAMP)
	$(BIN)/python -m bench.run_all

# How the data path of the CLIP and image pipelines grows with M (100k, 300k, 1M synthetic samples; bench/scale.py):
# seconds, peak RSS, bytes and MLflow / Prefect records per step, slopes, the CC12M projection, into BENCHMARKS.md;
# the time slopes also into planning/bench_scale_slopes.json (what `mclpipe plan` grows its projections along).
# Not part of `make bench` (hours on 2 cores). Smaller: make bench-scale SCALE_SIZES=2000,6000,20000
SCALE_SIZES ?= 100000,300000,1000000
bench-scale: $(STAMP)
	$(BIN)/python -m bench.scale --sizes $(SCALE_SIZES) --report BENCHMARKS.md --slopes planning/bench_scale_slopes.json

# Mutation testing (mutmut 3, the `mutation` extra) of the library's core, each module group against its own fast
# unit tests, in mutants/<group>/ (scripts/mutation.py); prints the per-module table of docs/testing.md. Not in CI:
# about an hour on 2 cores. Some groups: make mutation MUTATION_GROUPS="mcl losses"; MUTATION_WORKERS (default 2).
.PHONY: mutation
mutation: $(STAMP)
	$(BIN)/python -c "import mutmut" 2>/dev/null || $(BIN)/pip install -q -e '.[mutation]'
	MUTATION_WORKERS=$(or $(MUTATION_WORKERS),2) nice -n 15 $(BIN)/python scripts/mutation.py $(MUTATION_GROUPS)

# The acceptance rows of a CUDA machine (issue 24) into BENCHMARKS.md; without CUDA: one "not measured" line a row.
# Some rows only: make gpu-check ROWS=simclr,export. DRY=1: check the GPU sizes, then run every row on the CPU at
# toy sizes into a temporary report (docs/gpu.md; tests/bench/test_gpu_check.py runs it in make test).
gpu-check: $(STAMP)
	$(BIN)/python -m bench.gpu_check $(if $(ROWS),--rows $(ROWS)) $(if $(DRY),--dry-run)

# For a GPU machine without network (a lent one, an air-gapped node) that has its own Python 3.12 and CUDA torch:
# mclpipe's other dependencies as one archive, .whl/site-py312.tar.xz, verified by starting a Prefect server from it
# under a local python3.12; there, `bash bench/on_device.sh ROWS` runs make gpu-check's rows (docs/gpu.md).
gpu-bundle: $(STAMP)
	$(BIN)/python -m bench.gpu_bundle $(ARGS)

ui-mlflow: $(STAMP)
	$(BIN)/mlflow ui --backend-store-uri $(MLFLOW_TRACKING_URI) --port 5000

ui-prefect: $(STAMP)
	$(BIN)/prefect server start

# The project's image (Dockerfile; docs/running.md): BASE=... (default debian:bookworm-slim; where the registry cannot
# be reached, one made from Debian's packages by scripts/make-base-image.sh), WHEELHOUSE=1 (the Python packages from
# wheelhouse/, the venv's versions, scripts/build-wheelhouse.sh), IMAGE=name:tag (default mclpipe:latest).
image:
	test -x $(BIN)/pip || $(MAKE) install
	bash scripts/build-image.sh

# The team stack without Docker: PostgreSQL + an MLflow server (basic-auth app) and a Prefect server (basic auth) on
# it, on 127.0.0.1; secrets in .env, written with random values when missing (docs/tracking.md, docs/operating.md).
stack: $(STAMP)
	bash .ci/stack.sh start

stack-stop:
	bash .ci/stack.sh stop

# A real browser (Debian's chromium) through the MLflow and Prefect UIs after a tiny pipeline on the team stack and a
# custom run from the deployment form executed by a process worker (docs/ui.md);
# screenshots in $(UI_CHECK_DIR).
UI_CHECK_DIR ?= $(CURDIR)/runs/ui-check
ui-check: $(STAMP)
	bash .ci/setup-postgres.sh
	bash .ci/setup-browser.sh
	MCLPIPE_UI_SCREENSHOTS=$(UI_CHECK_DIR) $(BIN)/python -m pytest -q -m slow tests/e2e/test_ui_browser.py \
		tests/e2e/test_ui_deployment.py

clean:
	rm -rf runs mlflow.db .prefect
