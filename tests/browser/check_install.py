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

Before step 3, while the environment holds torch and the wheel only (no numpy, no
matplotlib), chapters 3 to 16 run there as their pages run them: each page's blocks, hidden
ones included (a figure's or a check's setup is part of the page's program), in order, one
namespace per markdown-exec session, each block's output discarded. The blocks that need
more than the wheel (`attention_site.pages.repository_blocks`: they import `attention_site` or
`transformers`, or read what such a block made) are left out, and the built page must say so
under each shown one and link the repository, name its setting or say what to pip install
(docs/hooks/package.py); the check prints them. Then
`attention` must import from the environment, not the checkout, and `attention_site` (not in
the wheel) must not import at all. Any failure prints what failed and the run's output, and
exits 1. Offline where pip's configuration has local wheels (`PIP_FIND_LINKS`, a local index).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # attention_site.pages: what a page runs (the checkout's)
from attention_site.pages import chapters, page_blocks, repository_blocks  # noqa: E402

FIRST, LAST = 3, 16
"""The chapters whose blocks run with the wheel alone (1 and 2 draw and train)."""

RUN_BLOCKS = """\
import contextlib, io, json, sys, traceback
spaces = {}
for number, block in enumerate(json.load(open(sys.argv[1]))):
    session = block["session"]
    namespace = spaces.setdefault(session, {"__name__": "__main__"}) if session else {}
    namespace.setdefault("__name__", "__main__")
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(block["code"], f"{block['page']}:{block['line']}", "exec"), namespace)
    except BaseException:
        print(json.dumps({"failed": number, "error": traceback.format_exc()[-1500:]}))
        sys.exit(1)
"""
"""Run a page's blocks (a JSON list) in order, a namespace per session; stop at one that raises."""

NO_NUMPY = """\
import importlib.util
assert importlib.util.find_spec("numpy") is None, "numpy is installed: the check needs it absent"
"""

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


def marked(html: str) -> list[str]:
    """The built page's notes under blocks that need the repository (docs/hooks/package.py)."""
    return re.findall(r'<p class="needs-repository">(.*?)</p>', html, re.DOTALL)


def run_blocks(site: Path, python: str, work: Path, env: dict[str, str]) -> list[str]:
    """Chapters FIRST to LAST run page by page in the environment, but the blocks that need
    the repository; each page's notes checked. Returns a line per page: what ran, what not."""
    report = []
    for page in chapters(ROOT)[FIRST - 1 : LAST]:
        blocks = page_blocks((ROOT / "docs" / page).read_text(encoding="utf-8"), page)
        needs = repository_blocks(blocks)
        shown = [block for block in needs if block.shown]
        notes = marked((site / page.removesuffix(".md") / "index.html").read_text("utf-8"))
        if len(notes) != len(shown) or not all(
            "href=" in note or "ATTENTION_REPO_URL" in note or "pip install" in note
            for note in notes
        ):
            raise Failed(
                f"{page}: {len(shown)} shown block(s) need more than the wheel (lines "
                f"{[block.line for block in shown]}), and the built page has {len(notes)} "
                "note(s) saying so that link the repository, name its setting or say what to "
                "pip install"
            )
        runnable = [block.__dict__ for block in blocks if block not in needs]
        path = work / f"{page}.json"
        path.write_text(json.dumps(runnable), encoding="utf-8")
        done = subprocess.run([python, "-c", RUN_BLOCKS, str(path)], cwd=work, env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        if done.returncode != 0:
            lines = done.stdout.strip().splitlines()
            failed = json.loads(lines[-1]) if lines else {}
            where = runnable[failed["failed"]] if "failed" in failed else {"line": "?"}
            raise Failed(
                f"{page}: the block at line {where['line']} raised with the wheel alone\n"
                f"{failed.get('error', done.stderr[-2000:])}"
            )
        left = ", ".join(f"{block.line}{'' if block.shown else ' (hidden)'} "
                         f"({'+'.join(need.modules)})" for block, need in needs.items())  # fmt: skip
        report.append(f"{page}: {len(runnable)} blocks ran; need more than the wheel: "
                      f"{left or 'none'}")  # fmt: skip
    return report


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
    # the chapters' blocks, before the notebook's cell installs matplotlib (and numpy with it)
    blocks_start = time.perf_counter()
    cell_installs = "wheel" not in times  # then it must install the wheel itself: removed after
    if cell_installs:
        run("installing the wheel", [*pip, str(wheel)], work, env, 600)
    run("no numpy", [python, "-c", NO_NUMPY], work, env, 60)
    for line in run_blocks(site, python, work, env):
        print(f"     {line}")
    if cell_installs:
        uninstall = [python, "-m", "pip", "uninstall", "--yes", "--quiet", "literate-attention"]
        run("removing the wheel for the notebook's cell", uninstall, work, env, 120)
    times["chapters' blocks"] = time.perf_counter() - blocks_start
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
