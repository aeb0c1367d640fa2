# The two commands of the README. Both create .venv with a supported Python (3.11, 3.12 or 3.13)
# and install the pinned requirements.
# PYTHON=/path/to/python3.x chooses the interpreter; by default the first supported one of
# python3, python3.13, python3.12, python3.11 on PATH.
PYTHON_CANDIDATES := python3 python3.13 python3.12 python3.11
# exits 0 on a supported Python: the versions requirements-lock.txt was resolved and tested for
IS_SUPPORTED := -c 'import sys; sys.exit(sys.version_info[:2] not in [(3, 11), (3, 12), (3, 13)])'
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PIP    := $(PY) -m pip install -q --disable-pip-version-check

# PyPI's Linux torch is the CUDA build (about 3 GB with its NVIDIA wheels). On Linux without an
# NVIDIA driver (no nvidia-smi) torch is first installed, alone, from PyTorch's CPU index (a 190 MB
# wheel, 750 MB installed); the pinned requirements then find it installed. If that index cannot be
# reached, the install says so and goes on with PyPI's build. `make TORCH_CPU_INDEX= ...` turns
# this off.
TORCH_CPU_INDEX ?= $(if $(and $(filter Linux,$(shell uname -s)),$(if $(shell command -v nvidia-smi),,cpu)),https://download.pytorch.org/whl/cpu)
TORCH_PIN := $(shell grep -E '^torch==' requirements.txt | cut -d' ' -f1)

.PHONY: book test isa-matrix bench kernel-compile exercises grade lock clean colab-twin test-tritons

$(STAMP): requirements.txt requirements-grading.txt requirements-lock.txt requirements-nodeps.txt pyproject.toml exercises/pyproject.toml
	@if [ -x $(PY) ]; then \
	  $(PY) $(IS_SUPPORTED) || { \
	    echo "error: $(VENV) has $$($(PY) --version 2>&1); the pins cover Python 3.11, 3.12 and 3.13. Remove $(VENV) and run make again."; \
	    exit 2; }; \
	else \
	  python=$(or $(PYTHON),$$(for p in $(PYTHON_CANDIDATES); do \
	    $$p $(IS_SUPPORTED) 2>/dev/null && { echo $$p; break; }; done)); \
	  if [ -z "$$python" ] || ! $$python $(IS_SUPPORTED) 2>/dev/null; then \
	    echo "error: the pins need Python 3.11, 3.12 or 3.13; found $(if $(PYTHON),'$(PYTHON)': $$($(PYTHON) --version 2>&1),none among $(PYTHON_CANDIDATES))."; \
	    echo "       Install one (Debian/Ubuntu: apt install python3.12-venv; macOS: brew install python@3.13;"; \
	    echo "       anywhere: pyenv install 3.13) and run: make PYTHON=python3.12 ... (or its full path)"; \
	    exit 2; fi; \
	  echo "Creating $(VENV) with $$python ($$($$python --version 2>&1))"; \
	  $$python -m venv $(VENV) || { echo "error: '$$python -m venv' failed (Debian/Ubuntu: apt install python3-venv)"; exit 2; }; \
	fi
	@echo "Installing the pinned requirements into $(VENV): about 2 GB, 3-10 minutes depending on the network."
	$(if $(TORCH_CPU_INDEX),$(PIP) --no-deps --retries 1 --extra-index-url $(TORCH_CPU_INDEX) "$(TORCH_PIN)+cpu" || \
	  echo "warning: torch's CPU build could not be installed from $(TORCH_CPU_INDEX) (pip's message is above); PyPI's build comes next (on Linux the CUDA one, about 3 GB)")
	$(PIP) -r requirements.txt -r requirements-grading.txt -c requirements-lock.txt
	$(PIP) --no-deps -r requirements-nodeps.txt
	$(PIP) --no-deps --no-build-isolation -e . -e exercises
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
## benchmarks/results/kernel_compile.json, saved as they come: a stopped run resumes where it stopped
kernel-compile: $(STAMP)
	env -u TRITON_INTERPRET TRITON_DEFAULT_FP_FUSION=1 $(PY) -m xfam_lib.kernels._aot --full --jobs $(or $(JOBS),$(shell nproc)) --out benchmarks/results/kernel_compile.json --resume

## make exercises: student notebooks (committed) and autograder zips (_build/exercises) from the master notebooks
exercises: $(STAMP)
	$(PY) exercises/build.py

## make grade CHAPTER=ch01 SUBMISSIONS=folder [JOBS=2]: grade every .ipynb in the folder into grades_ch01.csv
grade: $(STAMP)
	@test -n "$(CHAPTER)" -a -n "$(SUBMISSIONS)" || (echo "usage: make grade CHAPTER=ch01 SUBMISSIONS=path/to/folder [JOBS=2]" && exit 2)
	$(PY) exercises/grade.py $(CHAPTER) $(SUBMISSIONS) --out grades_$(CHAPTER).csv --jobs $(or $(JOBS),1)

## make lock [UPGRADE=1]: regenerate requirements-lock.txt (one universal resolution: every supported Python and platform)
lock:
	UPGRADE=$(UPGRADE) PYTHON=$(or $(PYTHON),python3) bash scripts/lock.sh

## make test-tritons [TRITONS="3.6.0 3.9.0"]: the kernel tests (interpreter) under each other Triton a reader meets
test-tritons: $(STAMP)
	bash scripts/test_tritons.sh $(TRITONS)

## make colab-twin [TWIN_PYTHON=python3.13]: every chapter and student exercise notebook alone in a venv of Colab's
## versions (requirements-colab.txt); run by python3 (3.11 or newer)
colab-twin:
	$(or $(PYTHON),python3) scripts/colab_twin.py

clean:
	rm -rf _build
