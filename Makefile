# zeroserve: `make serve` runs the server, `make test` runs the test suite.
# Both create .venv and install what they need on first use, then reuse it.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000
MODEL ?= smollm2-135m-instruct
ARGS ?=
# `make test` runs the suite on this many pytest-xdist workers, one test module to a worker.
TEST_WORKERS ?= 2
# torch's build: cpu, or a CUDA tag of PyTorch's own index for a GPU machine, e.g.
# `make serve TORCH=cu130` (driver 580 or newer; cu128 for an older one).
TORCH ?= cpu
TORCH_VERSION := 2.13.0
ifeq ($(TORCH),cpu)
TORCH_REQUIREMENT := torch==$(TORCH_VERSION)
TORCH_STAMP :=
else
TORCH_REQUIREMENT := torch==$(TORCH_VERSION)+$(TORCH) --index-url https://download.pytorch.org/whl/$(TORCH)
# NOTE: a stamp per CUDA tag, so naming one reinstalls torch; a later plain `make serve` keeps it
# (pip takes torch==2.13.0+cu130 as torch==2.13.0).
TORCH_STAMP := $(VENV)/.torch-$(TORCH)
endif

.PHONY: serve test test-fast install install-test model clean

serve: $(VENV)/.installed
	$(PY) -m service serve $(MODEL) --host $(HOST) --port $(PORT) $(ARGS)

test: $(VENV)/.installed-test
	$(VENV)/bin/ruff check
	$(PY) -m mypy
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder $(ARGS)

# The quick run: lint, types, and the tests that start no process and load no real model.
test-fast: $(VENV)/.installed-test
	$(VENV)/bin/ruff check
	$(PY) -m mypy
	$(PY) -m pytest -m "not slow" $(ARGS)

install: $(VENV)/.installed

# What benchmarks/gpu_check.py runs with: `make install-test TORCH=cu130` on a GPU machine.
install-test: $(VENV)/.installed-test

model: $(VENV)/.installed
	$(PY) -c "from service.model_files.model_registry import resolve_model; print(resolve_model('$(MODEL)').path)"

$(PY):
	@echo "make: creating the virtual environment $(VENV)"
	$(PYTHON) -m venv $(VENV)

$(TORCH_STAMP): | $(PY)
	touch $@

# NOTE: torch first and pinned: this exact CPU build is on the machine; a bare `torch`
# requirement would pull a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml $(TORCH_STAMP) | $(PY)
	@echo "make: installing torch ($(TORCH)) and zeroserve's dependencies into $(VENV) (minutes, the first time)"
	$(PY) -m pip install --quiet $(TORCH_REQUIREMENT)
	$(PY) -m pip install --quiet -e .
	@echo "make: fetching the default model (98 MB from PyPI, once)"
	$(PY) -c "from service.model_files.model_registry import resolve_model; resolve_model('smollm2-135m-instruct')"
	@echo "make: building zeroserve's C++ kernels for this CPU (a minute or two, once)"
	$(PY) -c "from engine_proc.cpu.kernels import load_cpu_kernels; load_cpu_kernels()"
	touch $@

# NOTE: the tests' references (llama.cpp's vocabularies with its tokenizations, its converter)
# come from the PyPI sdist of llama-cpp-python: fetched here once, before the workers start.
$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml
	@echo "make: installing the test dependencies, and fetching llama.cpp's sources (the tests' references)"
	$(PY) -m pip install --quiet -e '.[test]'
	$(PY) -m benchmarks.llama_cpp_tree >/dev/null
	touch $@

clean:
	rm -rf $(VENV)
