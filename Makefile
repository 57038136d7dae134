# tempo-jax — two-command quick start: `make demo`, `make test`.
# Both create .venv in the repo root on first use and install the project with its dev extra.
# Every target takes VENV= (which environment); VENV=.venv-latest is the second CI environment: created with the
# newest Python here (scripts/newest_python.sh) and the newest jax / flax / optax pip offers (eager upgrade whenever
# its stamp is stale; `make clean VENV=.venv-latest` rebuilds it). PYTHON= / INSTALL_FLAGS= override either choice
# (not PIP_*: pip reads those from the environment).
VENV   ?= .venv
LATEST_VENV := .venv-latest
ifeq ($(VENV),$(LATEST_VENV))
PYTHON ?= $$(scripts/newest_python.sh)
INSTALL_FLAGS ?= --upgrade --upgrade-strategy eager
else
PYTHON ?= python3
INSTALL_FLAGS ?=
endif
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST := $(PY) -m pytest
# Fake 8 CPU devices for expert parallelism everywhere (tests set it again in conftest.py).
export XLA_FLAGS ?= --xla_force_host_platform_device_count=8

.PHONY: demo serve test test-latest test-all bench bench-peers bench-solver bench-gemm bench-ep bench-ingraph bench-cascade bench-sim bench-refresh bench-metrics gpu-check gpu-smoke notebooks lint venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(INSTALL_FLAGS) -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m tempo_jax demo

# The tiny MoE LM serving prefill + decode steps, every MoE layer with live tables from one solver worker
# process (status line per step, refresh time, results/serve.json and results/serve.png), its metrics at
# http://127.0.0.1:$(METRICS_PORT)/metrics (printed at the start; kept up until one scrape after the run, at most
# 30 s) and in results/metrics.jsonl (`tempo-jax report results` draws them).
METRICS_PORT ?= 9464
serve: $(STAMP)
	$(PY) -m tempo_jax serve --kill-worker-at 30 --metrics-port $(METRICS_PORT) --metrics-linger-s 30

# Fast suite (no `slow` marker). pytest exits 5 when it collected nothing: that is a failure here too. Each test file
# runs on one worker (--dist loadscope): its module fixtures are built once (jax 0.12: 1,167 → 1,106 worker-seconds).
# A worker that dies (a native crash) ends the run at once, naming its test (--max-worker-restart 0): pytest-xdist
# 3.8's loadscope scheduler can deadlock after replacing a crashed worker (pytest-dev/pytest-xdist#1378), which once
# held CI until its time limit.
XDIST := -n 2 --dist loadscope --max-worker-restart 0
MARKS := not slow
test: $(STAMP)
	$(PYTEST) -q $(XDIST) -m "$(MARKS)" --durations=20

# The fast suite again in the second environment (see VENV above): `make demo VENV=.venv-latest` and the rest alike.
# The `one_env` cases (heavy, one environment suffices: notebooks, docs' snippets, runtimes around the layer, layer
# cases whose property other cases check in both) run in `make test` only, which keeps each suite near 10 minutes;
# `make test-all VENV=.venv-latest` runs them here too.
test-latest:
	$(MAKE) test VENV=$(LATEST_VENV) MARKS="not slow and not one_env"

test-all: $(STAMP)
	$(PYTEST) -q $(XDIST) -m ""

bench: bench-solver bench-gemm bench-ep bench-ingraph bench-cascade bench-sim bench-refresh bench-metrics bench-peers

# The layer beside Levanter's MoE (issue 71), in an environment of its own: Levanter (marin-levanter) needs Python >=
# 3.12 and jax < 0.12 and pins optax < 0.2.7 and safetensors < 0.7, older than this project asks for; the layer runs
# with them (tempo-jax installed --no-deps beside Levanter, its other dependencies named here).
PEERS_VENV  := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed
$(PEERS_STAMP): pyproject.toml
	test -x $(PEERS_VENV)/bin/python || $$(scripts/newest_python.sh) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install --quiet "jax<0.12" marin-levanter "flax>=0.12.8" scipy ortools matplotlib \
		tqdm joblib "dask[distributed]" prometheus-client tensorboardX
	$(PEERS_VENV)/bin/python -m pip install --quiet --no-deps -e .
	touch $(PEERS_STAMP)

bench-peers: $(PEERS_STAMP)
	$(PEERS_VENV)/bin/python scripts/bench_peers.py

bench-solver: $(STAMP)
	$(PY) scripts/bench_solver.py

bench-gemm: $(STAMP)
	$(PY) scripts/bench_gemm.py

bench-ep: $(STAMP)
	$(PY) scripts/bench_ep.py
	$(PY) scripts/bench_layer_stages.py

# The in-graph dispatch (issue 38): relief's makespan / tempo's; the layer's cost in-graph vs fixed tables.
bench-ingraph: $(STAMP)
	$(PY) scripts/bench_ingraph.py

bench-cascade: $(STAMP)
	$(PY) scripts/bench_cascade.py

# The CascadeEP simulator: fast vs reference timeline, and the whole 1-hour Mooncake trace × 4 modes (results/bench_sim.json).
bench-sim: $(STAMP)
	$(PY) scripts/bench_sim.py

bench-refresh: $(STAMP)
	$(PY) scripts/bench_refresh.py

# What watching costs a served step (issue 50): watched / not watched, and the records at DeepSeek-V3 size.
bench-metrics: $(STAMP)
	$(PY) scripts/bench_metrics.py

gpu-check:  # on a machine with a CUDA GPU; needs only jax with CUDA (no venv)
	bash scripts/gpu_check.sh

gpu-smoke: $(STAMP)  # the same steps on CPU: tiny shapes, Pallas in interpret mode
	OUT=results/gpu_smoke PY=$(PY) bash scripts/gpu_check.sh --smoke

# Full-size figure notebooks (CI runs them at SMALL=1 inside `make test`): figures in notebooks/figures, numbers in
# results/notebooks/*.json (committed), then docs/reproduced.md's tables rendered from them.
notebooks: $(STAMP)
	$(PY) -m tempo_jax reproduce all
	$(PY) -m tempo_jax reproduce --docs

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis results/*.json
