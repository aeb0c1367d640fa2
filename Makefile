# The two commands of the README. Both create .venv (Python 3.11) and install the pinned requirements.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

# PyPI's Linux torch is the CUDA build (about 3 GB with its NVIDIA wheels). On Linux without an
# NVIDIA driver (no nvidia-smi) torch is first installed, alone, from PyTorch's CPU index (a 190 MB
# wheel, 750 MB installed); the pinned requirements then find it installed.
# `make TORCH_CPU_INDEX= ...` turns this off.
TORCH_CPU_INDEX ?= $(if $(and $(filter Linux,$(shell uname -s)),$(if $(shell command -v nvidia-smi),,cpu)),https://download.pytorch.org/whl/cpu)
TORCH_PIN := $(shell grep -E '^torch==' requirements.txt | cut -d' ' -f1)

.PHONY: book test isa-matrix bench kernel-compile exercises grade lock clean

$(STAMP): requirements.txt requirements-grading.txt requirements-lock.txt requirements-nodeps.txt pyproject.toml exercises/pyproject.toml
	@test -x $(PY) || $(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { \
	  echo "error: the pinned requirements need Python 3.11, but '$(PYTHON)' is $$($(PYTHON) --version 2>&1)."; \
	  echo "       Install Python 3.11 (e.g. 'pyenv install 3.11' or your OS package) and run: make PYTHON=python3.11 ..."; \
	  exit 2; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "Installing the pinned requirements into $(VENV): about 2 GB, 3-10 minutes depending on the network."
	$(if $(TORCH_CPU_INDEX),$(PY) -m pip install -q --disable-pip-version-check --no-deps --retries 1 --extra-index-url $(TORCH_CPU_INDEX) "$(TORCH_PIN)+cpu")
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt -r requirements-grading.txt -c requirements-lock.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e . -e exercises
	@touch $(STAMP)

## make book: execute every notebook and build the HTML book into _build/html (fails on any error or warning)
book: $(STAMP)
	$(VENV)/bin/jupyter-book build . --all -W --keep-going
	@echo "Book built: open $(CURDIR)/_build/html/index.html"

## make test: library tests, exercises, notebooks (nbval), the -W book build and a headless-browser check
test: $(STAMP)
	@bash scripts/test_all.sh

## make isa-matrix [ARGS="OMP_NUM_THREADS=1"]: every chapter under each CPU kernel set, alone and with the saved results
isa-matrix: $(STAMP)
	bash scripts/isa_matrix.sh $(ARGS)

## make bench: the performance benchmarks (JSON results and plots in benchmarks/results/)
bench: $(STAMP)
	$(PY) benchmarks/run_all.py

## make kernel-compile [JOBS=2]: compile every Triton kernel launch for a T4, A100, L4 and H100 ahead
## of time (no GPU needed) and check shared memory, registers and tensor cores; results in
## benchmarks/results/kernel_compile.json
kernel-compile: $(STAMP)
	env -u TRITON_INTERPRET TRITON_DEFAULT_FP_FUSION=1 $(PY) -m xfam_lib.kernels._aot --full --jobs $(or $(JOBS),$(shell nproc)) --out benchmarks/results/kernel_compile.json

## make exercises: student notebooks (committed) and autograder zips (_build/exercises) from the master notebooks
exercises: $(STAMP)
	$(PY) exercises/build.py

## make grade CHAPTER=ch01 SUBMISSIONS=folder [JOBS=2]: grade every .ipynb in the folder into grades_ch01.csv
grade: $(STAMP)
	@test -n "$(CHAPTER)" -a -n "$(SUBMISSIONS)" || (echo "usage: make grade CHAPTER=ch01 SUBMISSIONS=path/to/folder [JOBS=2]" && exit 2)
	$(PY) exercises/grade.py $(CHAPTER) $(SUBMISSIONS) --out grades_$(CHAPTER).csv --jobs $(or $(JOBS),1)

## make lock [UPGRADE=1]: regenerate requirements-lock.txt from a throwaway install of the pins
lock:
	UPGRADE=$(UPGRADE) bash scripts/lock.sh

clean:
	rm -rf _build
