"""Shared pytest configuration: CUDA-only tests are skipped on machines without a GPU; the exercises'
grading package (exercises/xfam_grading, installed with the exercises, not with xfam_lib) imports.

``XFAM_GPU_TESTS_ON=cpu`` runs the ``gpu`` tests of tests/test_gpu.py on the CPU instead (a dry run of
that module; its ``device`` fixture then yields the CPU). Other ``gpu`` tests still need CUDA.
"""
import os
import sys
from pathlib import Path

import pytest
import torch

# Without CUDA, tests/test_kernels.py runs the Triton kernels in Triton's CPU interpreter. The
# variable must be set before anything imports triton (other test modules' oracles do), so here.
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
GPU_DRY_RUN_MODULE = Path(__file__).with_name("test_gpu.py")
EXERCISES = str(Path(__file__).resolve().parent.parent / "exercises")
if EXERCISES not in sys.path:
    sys.path.insert(0, EXERCISES)


def pytest_collection_modifyitems(config, items):
    on = os.environ.get("XFAM_GPU_TESTS_ON")
    if on not in (None, "", "cpu"):
        raise pytest.UsageError(f"XFAM_GPU_TESTS_ON must be 'cpu' (or unset), got {on!r}")
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not (on == "cpu" and item.path == GPU_DRY_RUN_MODULE):
            item.add_marker(skip)


@pytest.fixture
def gen():
    """A seeded CPU generator, so every test draws the same numbers."""
    return torch.Generator().manual_seed(0)
