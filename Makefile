# Two commands do all the set-up on a fresh machine:
#   make up    - install, then run the workbench on embedded defaults (UI on 127.0.0.1:7860)
#   make test  - install, then run the whole test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export OMP_NUM_THREADS ?= 1
export GRADIO_ANALYTICS_ENABLED := False
export HF_HUB_OFFLINE := 1
export HF_HUB_DISABLE_TELEMETRY := 1

.PHONY: install up demo demo-policy calculator-policy r1-policy test lint docs format bench gpu-check

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

up: install
	$(VENV)/bin/rlwb up $(UP_ARGS)

demo: install
	$(PY) -m core_engine.demo

# Rebuild the shipped demo policy (core_engine/assets/demo-policy; a few minutes of warm-up).
demo-policy: install
	$(PY) -m core_engine.policies.demo

# Rebuild the calculator demo policy (core_engine/assets/calculator-policy; minutes of warm-up).
calculator-policy: install
	$(PY) -m core_engine.policies.calculator

# Rebuild the R1 demo policy (core_engine/assets/r1-policy; a minute or two of warm-up).
r1-policy: install
	$(PY) -m core_engine.policies.r1

# The suite runs in PYTEST_WORKERS pytest-xdist processes (each with its own Redis database,
# PostgreSQL schemas, temp dirs and ports), one more than the cores, 2 to 4: the tests also wait
# (on worker processes, servers, browsers), and other work on the machine takes less of their
# share (2 cores: 3 workers). `make test PYTEST_WORKERS=0` runs the suite in one process.
PYTEST_WORKERS ?= $(shell n=$$(( $$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 1) + 1 )); echo $$(( n < 2 ? 2 : n > 4 ? 4 : n )))
test: install lint docs
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The documentation site (mkdocs.yml, docs/) into site/, offline, in seconds; strict, so a
# broken link, a missing page or a reference to a removed name fails it (and `make test`).
export NO_MKDOCS_2_WARNING := 1
docs: install
	$(VENV)/bin/mkdocs build --strict

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: install
	$(PY) benchmarks/bench_engine.py

# On a machine with a CUDA device: the CUDA-only tests (graphs, bf16 engine, trainer on device).
gpu-check: install
	$(PY) -m pytest -m cuda -v tests/core_engine
