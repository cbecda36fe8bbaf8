"""Shared fixtures: the device every equivalence test runs on, and small seeded inputs."""

from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()


def pytest_configure(config: pytest.Config) -> None:
    """Under `ATTENTION_DEVICE=cuda` (the GPU sessions), a missing GPU is an error, not a skip."""
    if os.environ.get("ATTENTION_DEVICE", "cpu").startswith("cuda") and not CUDA:
        raise pytest.UsageError(
            f"ATTENTION_DEVICE=cuda but torch {torch.__version__} (CUDA build: "
            f"{torch.version.cuda}) sees no CUDA device: refusing to skip every CUDA test. "
            "Run on a GPU machine with a CUDA torch build, or unset ATTENTION_DEVICE."
        )


@pytest.fixture(
    params=[
        "cpu",
        pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="CUDA is not available")),
    ]
)
def device(request: pytest.FixtureRequest) -> torch.device:
    """Each test that takes `device` runs on the CPU, and on CUDA where there is one."""
    return torch.device(request.param)


@pytest.fixture(autouse=True)
def _deterministic() -> None:
    torch.manual_seed(0)
