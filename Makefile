# colo-fsm: two commands on a fresh machine, and one for every day.
#   make demo   - set everything up, run the demo (async GRPO on a tiny megatron-core GPT, CPU by default)
#   make test   - set everything up, run the test suite (what CI runs)
#   make check  - lint and the quick tests (the everyday loop: no demo, Ray, process groups or megatron models)
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# pyenv reads .python-version (3.12); elsewhere set PYTHON=python3.12
PYTHON ?= python
DEMO_ARGS ?=
PYTEST_ARGS ?=
# the default suite runs on this many pytest-xdist workers (a module stays on one worker; tests/conftest.py)
TEST_WORKERS ?= 2

.PHONY: setup demo test check test-deep lint format bench gpu-check clean nemo-gym-venv docs

# nemo-gym's own clients run in a venv of their own: nemo-gym 0.7.0 needs Python 3.13 (the project runs on 3.12).
# It declares Requires-Python >= 3.13.14 while pyenv here has 3.13.0, hence --ignore-requires-python (its code
# runs on 3.13.0; tests/test_server_nemo_gym.py drives it). Without a python3.13 those tests skip, saying so.
GYM_VENV ?= .venv-gym
PYTHON313 ?= $(shell for p in python3.13 $$HOME/.pyenv/versions/3.13*/bin/python; do \
  $$p -c 'import sys; sys.exit(sys.version_info[:2] != (3, 13))' 2>/dev/null && { echo $$p; break; }; done)

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; v=sys.version_info; sys.exit(0 if v >= (3, 12) else "colo-fsm needs Python >= 3.12 (megatron-core 0.17+); got %d.%d: install it or set PYTHON=python3.12" % v[:2])'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	# megatron-bridge's own dependency set is huge; colo-fsm uses only its AutoMapping registry (tests/test_megatron_bridge.py)
	$(PY) -m pip install -q --no-deps megatron-bridge==0.6.2
	@touch $@

setup: $(VENV)/.installed

demo: setup
	$(PY) -m colo_fsm.cli demo $(DEMO_ARGS)

$(GYM_VENV)/.installed:
	@if [ -z "$(PYTHON313)" ]; then echo "no python3.13: the nemo-gym tests will skip"; else \
	  $(PYTHON313) -m venv $(GYM_VENV) && \
	  $(GYM_VENV)/bin/python -m pip install -q --ignore-requires-python 'nemo-gym==0.7.0' && touch $@; fi

nemo-gym-venv: $(GYM_VENV)/.installed

# the two venvs are built side by side (each is mostly downloads and unpacking), then the default suite runs
test:
	@$(MAKE) --no-print-directory -j2 setup nemo-gym-venv
	COLO_FSM_NEMO_GYM_PYTHON=$(abspath $(GYM_VENV))/bin/python $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup \
	  -m "not slow and not gpu" $(PYTEST_ARGS)

# lint, then the default suite without the modules marked heavy (tests/conftest.py): no nemo-gym venv needed
check: lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "not slow and not gpu and not heavy" $(PYTEST_ARGS)

test-deep: setup
	COLO_FSM_HYPOTHESIS_PROFILE=colo-fsm-deep $(PY) -m pytest -q -m "slow and not gpu" $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check colo_fsm tests bench scripts examples
	$(VENV)/bin/ruff format --check colo_fsm tests bench scripts examples
	$(VENV)/bin/mypy --explicit-package-bases colo_fsm tests/support bench
	MYPYPATH=scripts $(VENV)/bin/mypy --explicit-package-bases scripts

format: setup
	$(VENV)/bin/ruff check --fix colo_fsm tests bench scripts examples
	$(VENV)/bin/ruff format colo_fsm tests bench scripts examples

# the docs site with the API reference from the docstrings; warnings are errors; built into a temp dir
docs: setup
	d=$$(mktemp -d) && $(VENV)/bin/mkdocs build --strict --quiet -d $$d && echo "docs built in $$d"

bench: setup
	$(PY) bench/run_all.py

# On a GPU machine with megatron-core and flash-attn-4 importable (docs/megatron.md): the adapter on 1 GPU, TP=2 and
# DP=2 where there are 2 GPUs, the demo on CUDA. All GPU evidence: python3 -m bench.gpu --list
gpu-check:
	python3 -m bench.gpu --stages adapter-1gpu,adapter-tp2,adapter-dp2,demo-cuda --out gpu-check-out

clean:
	rm -rf $(VENV) $(GYM_VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
