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

# On a CUDA machine: every Triton configuration against the reference, then the kernel timing table
gpu: venv
	$(PY) -m pytest -q -rA tests/gpu
	$(PY) -m benchmarks.kernels --json gpu-kernels.json

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
