"""MkDocs hook: the package's wheel and sdist, built with the site and served from it.

The reader installs the code that computed the site from the site itself (`run.md`, "Run it
yourself"; the exercises' first cell):

- `on_config` copies what the distributions hold (`pyproject.toml`, `README.md`, `attention/`,
  `attention_bench/`) to a temporary directory and starts setuptools' own build there
  (`setuptools.build_meta.build_sdist` and `build_wheel`, in a subprocess: offline, no build
  isolation, the docs environment's setuptools), while the other hooks start. It records what
  the pages and the notebooks need in `config.extra["package"]` (`Package.as_extra`): the
  files' names, the wheel's URL when the site's is known (`site_url`, which the Pages workflow
  sets through `ATTENTION_SITE_URL`), and the repository's address when the build knows it
  (mkdocs.yml's `repo_url`, else GitHub Actions' `GITHUB_SERVER_URL`/`GITHUB_REPOSITORY`).
- `on_files` waits for the build, checks that the wheel holds the library and nothing else
  (`attention`, `attention_bench` and its metadata: `attention_site` stays in the repository)
  and adds both files to the site under `dist/`.
- `<!-- package: install -->`, `contents` and `source` in a page become the install command
  and the files' links, the wheel's contents, and where the source lives (`on_page_markdown`).

Nothing built is written into the checkout: the copy, setuptools' `build/` and `*.egg-info`
and the distributions live in the temporary directory until the site has its copies.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

log = logging.getLogger("mkdocs.hooks.package")

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "attention", "attention_bench")
"""What the distributions are built from: pyproject.toml's packages, its readme, itself."""
LIBRARY = ("attention", "attention_bench")
"""The wheel's packages (pyproject.toml's `packages.find`); anything else in it fails the build."""
DIST = "dist"
"""Where the site serves the files: `site/dist/NAME`."""

BUILD = """\
import sys
from setuptools import build_meta
out = sys.argv[1]  # read first: build_meta rewrites sys.argv
build_meta.build_sdist(out)
build_meta.build_wheel(out)
"""
_DIRECTIVE = re.compile(r"^<!-- package: (?P<name>[\w-]+) -->$", re.MULTILINE)


@dataclass(frozen=True)
class Package:
    """What the site says about its distributions: names, where they are, where the source is."""

    wheel: str
    sdist: str
    site_url: str | None = None
    repository: str | None = None

    @property
    def wheel_url(self) -> str | None:
        """The wheel's address on the published site, if the build knows the site's."""
        return f"{self.site_url.rstrip('/')}/{DIST}/{self.wheel}" if self.site_url else None

    def as_extra(self) -> dict[str, str | None]:
        """`config.extra["package"]`, read by docs/hooks/notebooks.py (the install cell)."""
        return {"wheel": self.wheel, "sdist": self.sdist, "wheel_url": self.wheel_url,
                "repository": self.repository}  # fmt: skip


def distribution_names(pyproject: Path) -> tuple[str, str]:
    """The wheel's and the sdist's file names for `pyproject` (PEP 427, PEP 625).

    >>> distribution_names(ROOT / "pyproject.toml")
    ('literate_attention-0.1.0-py3-none-any.whl', 'literate_attention-0.1.0.tar.gz')
    """
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    if "version" not in project:
        raise PluginError(f"{pyproject}: no static [project] version to name the wheel by")
    stem = f"{re.sub(r'[-_.]+', '_', project['name']).lower()}-{project['version']}"
    return f"{stem}-py3-none-any.whl", f"{stem}.tar.gz"


def repository_url(repo_url: str | None, environ: dict[str, str]) -> str | None:
    """The repository's address: mkdocs.yml's `repo_url`, else the GitHub Actions run's own
    (`GITHUB_SERVER_URL`/`GITHUB_REPOSITORY`), else None: the build does not know it.

    >>> repository_url(None, {"GITHUB_SERVER_URL": "https://github.com",
    ...                       "GITHUB_REPOSITORY": "someone/attention"})
    'https://github.com/someone/attention'
    >>> repository_url(None, {}) is None
    True
    """
    if repo_url:
        return repo_url.rstrip("/")
    server, name = environ.get("GITHUB_SERVER_URL"), environ.get("GITHUB_REPOSITORY")
    return f"{server.rstrip('/')}/{name}" if server and name else None


def check_wheel(wheel: Path) -> dict[str, tuple[int, int]]:
    """The wheel's top-level entries, each with its number of files and their bytes; raises
    unless they are the library's packages and the wheel's metadata."""
    with zipfile.ZipFile(wheel) as archive:
        infos = [info for info in archive.infolist() if not info.is_dir()]
    contents: dict[str, tuple[int, int]] = {}
    for info in infos:
        top = info.filename.split("/", 1)[0]
        files, size = contents.get(top, (0, 0))
        contents[top] = (files + 1, size + info.file_size)
    extra = [top for top in contents if top not in LIBRARY and not top.endswith(".dist-info")]
    if extra or not set(LIBRARY) <= set(contents):
        raise PluginError(
            f"{wheel.name} must hold {', '.join(LIBRARY)} and its metadata, nothing else; "
            f"it holds {sorted(contents)} (pyproject.toml's [tool.setuptools.packages.find])"
        )
    return contents


@dataclass
class _Build:
    """One build's distributions: started in `on_config`, served from `on_files`."""

    package: Package
    process: subprocess.Popen[bytes]
    work: Path  # the temporary directory: src/ (the copy), site/dist/ (the files), build.log
    start: float
    contents: dict[str, tuple[int, int]] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)


_builds: list[_Build] = []  # this build's, once started (`mkdocs serve`: the latest last)


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    """Start building the distributions; tell the pages and notebooks what they will be."""
    import attention

    wheel, sdist = distribution_names(ROOT / "pyproject.toml")
    version = wheel.split("-")[1]
    if version != attention.__version__:  # the wheel's name and `import attention` must agree
        raise PluginError(
            f"pyproject.toml's version {version} is not attention.__version__ "
            f"{attention.__version__}: change both"
        )
    repository = repository_url(config.get("repo_url"), dict(os.environ))
    package = Package(wheel, sdist, config.get("site_url"), repository)
    config.extra["package"] = package.as_extra()
    work = Path(tempfile.mkdtemp(prefix="attention-dist-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    copy_sources(work / "src")
    (work / "site" / DIST).mkdir(parents=True)
    with open(work / "build.log", "w", encoding="utf-8") as output:
        process = subprocess.Popen(
            [sys.executable, "-c", BUILD, str(work / "site" / DIST)],
            cwd=work / "src", stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip
    _builds.append(_Build(package, process, work, time.perf_counter()))
    return config


def copy_sources(target: Path) -> None:
    """What the distributions are built from (`SOURCES`), copied into `target`."""
    ignore = shutil.ignore_patterns("__pycache__", "*.py[cod]", "*.egg-info")
    target.mkdir(parents=True)
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, target / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, target / name)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Wait for the distributions, check the wheel, and serve both under `dist/`."""
    build, waited = _builds[-1], time.perf_counter()
    if build.process.wait(timeout=300) != 0:
        output = (build.work / "build.log").read_text(encoding="utf-8")[-3000:]
        raise PluginError(f"building the wheel and sdist failed:\n{output}")
    out, package = build.work / "site" / DIST, build.package
    built = sorted(path.name for path in out.iterdir())
    if built != sorted([package.wheel, package.sdist]):
        raise PluginError(f"expected {package.wheel} and {package.sdist}, setuptools built {built}")
    build.contents = check_wheel(out / package.wheel)
    for name in built:
        build.sizes[name] = (out / name).stat().st_size
        files.append(
            File(f"{DIST}/{name}", src_dir=str(out.parent), dest_dir=config["site_dir"],
                 use_directory_urls=config["use_directory_urls"])
        )  # fmt: skip
    now = time.perf_counter()
    log.info("Built %s and %s in %.1f s (%.1f s of it waited for)",
             package.wheel, package.sdist, now - build.start, now - waited)  # fmt: skip
    return files


def size(nbytes: int) -> str:
    """Bytes for a reader: `578 kB`, `1.4 MB`.

    >>> size(577_856), size(1_431_002), size(912)
    ('578 kB', '1.4 MB', '1 kB')
    """
    return f"{nbytes / 1e6:.1f} MB" if nbytes >= 1e6 else f"{max(1, round(nbytes / 1e3))} kB"


def install_text(package: Package, sizes: dict[str, int]) -> str:
    """Markdown: how to install the wheel (from its URL, or the file), and the sdist."""
    wheel, sdist = package.wheel, package.sdist
    link = f"[`{wheel}`]({DIST}/{wheel}) ({size(sizes[wheel])})"
    if package.wheel_url:
        # the URL on a line of its own: the command fits the column
        lines = ["```bash", "pip install \\", f"  {package.wheel_url}", "```", "",
                 f"That is this build's wheel, {link}."]  # fmt: skip
    else:
        lines = [f"Download this build's wheel, {link}, and install the file:", "",
                 "```bash", f"pip install ./{wheel}", "```"]  # fmt: skip
    sdist_link = f"[`{sdist}`]({DIST}/{sdist}) ({size(sizes[sdist])})"
    lines += ["", f"Or its source distribution, {sdist_link}, the same way: pip builds the "
              "same wheel from it."]  # fmt: skip
    return "\n".join(lines)


def contents_table(contents: dict[str, tuple[int, int]]) -> str:
    """Markdown: the wheel's top-level entries, their files and bytes (uncompressed)."""
    rows = ["| In the wheel | Files | Size |", "| --- | ---: | ---: |"]
    for top, (files, nbytes) in contents.items():  # the metadata's long name would not fit a phone
        name = "its metadata, `.dist-info/`" if top.endswith(".dist-info") else f"`{top}/`"
        rows.append(f"| {name} | {files} | {size(nbytes)} |")
    return "\n".join(rows)


def source_text(package: Package) -> str:
    """Markdown: where the source lives; without a known repository, only what the site has."""
    if package.repository:
        name = re.sub(r"^https?://", "", package.repository)
        return (
            f"The source is in the repository [{name}]({package.repository}): the package "
            "(`attention/`, `attention_bench/`), this site's pages (`docs/`) and its tooling "
            "(`attention_site/`), and the tests (`tests/`). Its README says how to run the "
            "tests and build this site."
        )
    return (
        "The source distribution above holds the package's source, `attention/` and "
        "`attention_bench/`. The site's pages, its tooling and the tests are in the project's "
        "repository, whose address this build was not given."
    )


def expand(markdown: str, package: Package, sizes: dict[str, int],
           contents: dict[str, tuple[int, int]], where: str) -> str:  # fmt: skip
    """`<!-- package: install -->`, `<!-- package: contents -->`, `<!-- package: source -->`
    of the page `where`, written out."""
    directives = {
        "install": lambda: install_text(package, sizes),
        "contents": lambda: contents_table(contents),
        "source": lambda: source_text(package),
    }

    def replace(match: re.Match[str]) -> str:
        if match["name"] not in directives:
            raise PluginError(f"{where}: no <!-- package: {match['name']} -->; "
                              f"there are {', '.join(directives)}")  # fmt: skip
        return directives[match["name"]]()

    return _DIRECTIVE.sub(replace, markdown)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    build = _builds[-1]
    return expand(markdown, build.package, build.sizes, build.contents, page.file.src_uri)
