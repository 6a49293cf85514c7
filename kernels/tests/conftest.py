"""Puts kernels/ on sys.path; without CUDA, runs Triton in its CPU interpreter (set before triton is imported)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parent.parent
if str(KERNELS) not in sys.path:
    sys.path.insert(0, str(KERNELS))

import torch  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if HAS_CUDA else "cpu")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)
