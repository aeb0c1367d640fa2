"""Shared pytest configuration: CUDA-only tests are skipped on machines without a GPU; the exercises'
grading package (exercises/xfam_grading, installed with the exercises, not with xfam_lib) imports."""
import sys
from pathlib import Path

import pytest
import torch

EXERCISES = str(Path(__file__).resolve().parent.parent / "exercises")
if EXERCISES not in sys.path:
    sys.path.insert(0, EXERCISES)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gen():
    """A seeded CPU generator, so every test draws the same numbers."""
    return torch.Generator().manual_seed(0)
