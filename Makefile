# `make demo` and `make test` set everything up on a fresh machine.
# TORCH_SPEC installs the small CPU wheel first; a GPU user overrides it, e.g.
#   make test TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126"
PYTHON ?= python3.11
# The tests, the demo and the benchmarks run one-node Ray instances: keep them on 127.0.0.1 (Ray otherwise
# binds its services to the machine's outward address). tests/_cluster.py turns it back on for its nodes.
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER ?= 0
TORCH_SPEC ?= torch==2.13.0
# The suite runs its test files on this many processes (each file on one, with its own Ray instance): much of
# it waits on Ray, servers and subprocesses, so 2 finish it in about 12 minutes on 2 cores, against 22 on one.
TEST_WORKERS ?= 2
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	rm -rf demo_store demo_store_ray
	$(PY) examples/tune_sweep.py

test: $(STAMP)
	$(PY) -m ruff check ray_cmf tests benchmarks examples
	$(PY) -m mypy
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

bench: $(STAMP)
	$(PY) benchmarks/bench_log_metric.py
	$(PY) benchmarks/bench_commit.py
	$(PY) benchmarks/bench_metric_sync.py
	$(PY) benchmarks/bench_tune.py
	$(PY) benchmarks/bench_train.py
	$(PY) benchmarks/bench_sweep_scale.py
	$(PY) benchmarks/bench_writer.py
	$(PY) benchmarks/bench_system_metrics.py
	$(PY) benchmarks/bench_report.py
	$(PY) benchmarks/bench_team_store.py
	$(PY) benchmarks/bench_lifecycle.py
	$(PY) benchmarks/bench_trial_cost.py
	$(PY) benchmarks/bench_scale.py
	$(PY) benchmarks/bench_versions.py
	$(PY) benchmarks/render_results.py

clean:
	rm -rf $(VENV) cmf_store demo_store demo_store_ray demo_curves.png demo_report.html .pytest_cache
