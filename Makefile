# Every target installs what it needs into .venv first, so each works alone on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: venv run test test-all gpu lint typecheck bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e ".[dev]"
	touch $@

venv: $(VENV)/.installed

run: venv
	$(PY) -m recipes.vit_imagenet

test: venv
	$(PY) -m pytest -q

test-all: venv
	$(PY) -m pytest -q -m "slow or not slow"

# On a CUDA machine: every Triton configuration against the reference (8 processes, so its compiles run in
# parallel), the kernel timing table (once: the suite's own timing test is that table), the two dQ paths of
# the backward, then the per-configuration sweep; JSON records in outputs/gpu/
gpu: venv
	mkdir -p outputs/gpu
	$(PY) -m pytest -q -rA tests/gpu -k "not timing_table" -n 8
	$(PY) -m benchmarks.kernels --json outputs/gpu/kernels.json
	$(PY) -m benchmarks.kernels --compare-dq --json outputs/gpu/dq.json
	$(PY) -m benchmarks.kernel_sweep --json outputs/gpu/sweep.json

# ruff: pyflakes, bugbear, import order, pyupgrade ([tool.ruff] in pyproject.toml)
lint: venv
	$(PY) -m ruff check .

# mypy over diffzoo/layers and diffzoo/kernels ([tool.mypy] in pyproject.toml)
typecheck: venv
	$(PY) -m mypy

bench: venv
	$(PY) -m benchmarks.attention

clean:
	rm -rf $(VENV) outputs
