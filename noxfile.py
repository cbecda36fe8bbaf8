"""Maintainer tasks, run exactly as CI runs them: `nox -s tests`, `nox -s docs`, ...

The torch build every session installs comes from one place, so a CPU runner and a GPU runner
run the same sessions:

- `ATTENTION_TORCH` (default `torch==2.13.0`): the requirement, e.g. `torch==2.13.0+cu128`.
- `ATTENTION_TORCH_INDEX` (default unset): an extra index URL for that requirement, e.g.
  the PyTorch CUDA wheel index.
- `ATTENTION_DEVICE` (default `cpu`): the device tests and docs run on (`cuda` on a GPU runner).
"""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "venv"  # not uv: uv ignores pip's config (local wheels)
nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = ["3.11"]
TORCH = os.environ.get("ATTENTION_TORCH", "torch==2.13.0")
TORCH_INDEX = os.environ.get("ATTENTION_TORCH_INDEX", "")


def install_torch(session: nox.Session) -> None:
    """Install the one torch build this run uses, before anything that depends on torch."""
    args = [TORCH]
    if TORCH_INDEX:
        args += ["--extra-index-url", TORCH_INDEX]
    session.install(*args)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Unit, property and equivalence tests plus the package's doctests."""
    install_torch(session)
    session.install("-e", ".[test]")
    session.run(
        "python",
        "-m",
        "pytest",
        "tests",
        "attention",
        "README.md",
        "--doctest-modules",
        "--doctest-glob=README.md",
        *session.posargs,
    )
