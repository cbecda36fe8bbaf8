"""Install the built site's wheel in a fresh virtual environment and run an exercise with it.

Run by `nox -s site` after the browser check (not collected by pytest: the file name does not
start with `test_`):

    python tests/browser/check_install.py [--site site] [--notebook 03_simplified]
        [--torch torch==2.13.0] [--torch-index URL]

It does what a reader of "Run it yourself" does, with the site's own files:

1. a plain virtual environment (no system site-packages) made by this Python;
2. torch installed into it first (`--torch`, from `--torch-index` too where given: the
   sessions' `ATTENTION_TORCH` and `ATTENTION_TORCH_INDEX`);
3. the exercise's `.py` download (`site/exercises/NAME/NAME.py`, the notebook as a script,
   its install cell first) run from top to bottom in an empty folder, with neither the
   checkout nor `PYTHONPATH` on the path. Its install cell installs the wheel: the file from
   `site/dist/`, put next to it, where the cell names the file (a build without `site_url`);
   where it names the published URL, which need not exist yet, the wheel from `site/dist/` is
   installed first, and the cell installs the rest (matplotlib).

Then `attention` must import from the environment, not the checkout, and `attention_site` (not
in the wheel) must not import at all. Any failure prints what failed and the run's output, and
exits 1. Offline where pip's configuration has local wheels (`PIP_FIND_LINKS`, a local index).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHECK_IMPORTS = """\
import importlib.util, sys
import attention
assert attention.__file__.startswith(sys.prefix), attention.__file__
assert importlib.util.find_spec("attention_site") is None, "attention_site imports"
print("attention", attention.__version__, "from", attention.__file__)
"""


class Failed(Exception):
    """A step failed: its message says which, and what it printed."""


def run(step: str, command: list[str], cwd: Path, env: dict[str, str], timeout: int) -> float:
    """Run `command`; raise `Failed` naming `step`, with the command's output, unless it
    exits 0. Returns its wall time in seconds."""
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired as error:
        raise Failed(f"{step}: no result after {timeout} s: {' '.join(command)}") from error
    if done.returncode != 0:
        output = (done.stdout + done.stderr)[-4000:]
        raise Failed(
            f"{step}: exit status {done.returncode} from\n  {' '.join(command)}\n"
            f"--- its output (the end) ---\n{output}"
        )
    return time.perf_counter() - start


def clean_env(venv: Path) -> dict[str, str]:
    """The environment a reader's shell would have in `venv`: no PYTHONPATH (the session's
    points at the checkout), no other virtual environment, a figure backend with no display."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["MPLBACKEND"] = "Agg"
    return env


def site_files(site: Path, notebook: str) -> tuple[Path, Path]:
    """The site's one wheel and the exercise's `.py` download; `Failed` if either is missing."""
    wheels = sorted((site / "dist").glob("*.whl"))
    if len(wheels) != 1:
        raise Failed(
            f"expected one wheel in {site / 'dist'}/, found {[w.name for w in wheels]}: the "
            "build makes it (docs/hooks/package.py); run `nox -s docs` first"
        )
    script = site / "exercises" / notebook / f"{notebook}.py"
    if not script.is_file():
        raise Failed(f"no {script}: no exercise {notebook!r} in the built site")
    return wheels[0], script


def check(site: Path, notebook: str, torch: list[str], work: Path) -> dict[str, float]:
    """The steps of the module docstring, in `work`; their wall times in seconds."""
    wheel, script = site_files(site, notebook)
    cell = re.search(r'^WHEEL = (?:SITE \+ )?"(?P<wheel>[^"]+)"$', script.read_text(), re.M)
    if cell is None:
        raise Failed(f"{script.name}: no install cell (`WHEEL = ...`) in the download")
    venv, folder = work / "venv", work / "exercise"
    folder.mkdir()
    env, python = clean_env(venv), str(venv / "bin" / "python")
    times = {"venv": run("python -m venv", [sys.executable, "-m", "venv", str(venv)],
                         work, env, 120)}  # fmt: skip
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    times["torch"] = run("installing torch", [*pip, *torch], work, env, 600)
    shutil.copy2(script, folder)
    if cell["wheel"] == wheel.name:  # the cell installs the file beside the notebook
        shutil.copy2(wheel, folder)
    elif cell["wheel"].endswith("/" + wheel.name):  # the published URL: install the file now
        times["wheel"] = run("installing the wheel", [*pip, str(wheel)], work, env, 600)
    else:
        raise Failed(f"{script.name}'s install cell names {cell['wheel']}, not {wheel.name}")
    times["notebook"] = run(
        f"exercise {notebook}, run as a script with the site's wheel",
        [python, script.name], folder, env, 600,
    )  # fmt: skip
    times["imports"] = run(
        "importing attention from the wheel", [python, "-c", CHECK_IMPORTS], folder, env, 120
    )
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, default=Path("site"))
    parser.add_argument("--notebook", default="03_simplified")
    parser.add_argument("--torch", default=os.environ.get("ATTENTION_TORCH", "torch==2.13.0"))
    parser.add_argument("--torch-index", default=os.environ.get("ATTENTION_TORCH_INDEX", ""))
    args = parser.parse_args()
    torch = [args.torch, *(["--extra-index-url", args.torch_index] if args.torch_index else [])]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="attention-install-") as work:
        try:
            times = check(args.site.resolve(), args.notebook, torch, Path(work))
        except Failed as error:
            print(f"FAIL install check: {error}", file=sys.stderr)
            return 1
        cleanup = time.perf_counter()
    times["cleanup"] = time.perf_counter() - cleanup  # the environment's files, torch's mostly
    steps = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in times.items())
    print(
        f"ok   install check: {args.notebook} ran top to bottom in a fresh virtual environment "
        f"with the site's wheel ({steps}; {time.perf_counter() - start:.1f} s in all)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
