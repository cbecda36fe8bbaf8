"""Shared fixtures: the device every equivalence test runs on, and small seeded inputs."""

from __future__ import annotations

import pytest
import torch

CUDA = torch.cuda.is_available()


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
