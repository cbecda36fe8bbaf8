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
  (`repository`: the setting `ATTENTION_REPO_URL`, else GitHub Actions' run, else the
  checkout's `origin` remote).
- `on_files` waits for the build, checks that the wheel holds the library and nothing else
  (`attention`, `attention_bench` and its metadata: `attention_site` stays in the repository)
  and adds both files to the site under `dist/`.
- `<!-- package: install -->`, `contents`, `source`, `repository` and `source-of PATH` in a
  page become the install command and the files' links, the wheel's contents, where the
  source lives (or how a build is told), and a module's file; a shown block that imports
  `attention_site` gets a line saying it needs the repository (`on_page_markdown`);
- `on_page_context` links each page's footer to its source file (an API page's: its module);
  `on_post_build` fails the build where a built page lacks that link, or where a build that
  does not know the repository does not say how to give it (`unlinked_pages`).

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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

if TYPE_CHECKING:
    from attention_site.pages import Need

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
_DIRECTIVE = re.compile(r"^(?P<indent> *)<!-- package: (?P<name>[\w-]+) -->$", re.MULTILINE)
_MODULE_DIRECTIVE = re.compile(r"^<!-- package: source-of (?P<arg>[\w/.]+\.py) -->$", re.MULTILINE)


@dataclass(frozen=True)
class Package:
    """What the site says about its distributions: names, where they are, where the source is."""

    wheel: str
    sdist: str
    site_url: str | None = None
    repository: Repository | None = None

    @property
    def wheel_url(self) -> str | None:
        """The wheel's address on the published site, if the build knows the site's."""
        return f"{self.site_url.rstrip('/')}/{DIST}/{self.wheel}" if self.site_url else None

    def as_extra(self) -> dict[str, str | None]:
        """`config.extra["package"]`, read by docs/hooks/notebooks.py (the install cell)."""
        return {
            "wheel": self.wheel,
            "sdist": self.sdist,
            "wheel_url": self.wheel_url,
            "repository": self.repository.url if self.repository else None,
        }


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


REPOSITORY_SETTING = "ATTENTION_REPO_URL"
"""The setting that gives the build the repository's web address (an environment variable)."""


@dataclass(frozen=True)
class Repository:
    """Where the source is on the web: the repository's address and the ref its links name."""

    url: str
    ref: str = "HEAD"  # a commit, a branch; `HEAD` is the default branch on GitHub and GitLab

    def blob(self, path: str) -> str:
        """The address of the file `path` (relative to the checkout) at `ref`."""
        return f"{self.url}/blob/{self.ref}/{path}"


def web_address(remote: str) -> str | None:
    """A git remote's web address: `git@host:o/r.git`, `ssh://git@host/o/r.git` and
    `https://host/o/r.git` become `https://host/o/r`; a path or anything else is None. A
    user name or token in the address is dropped: it must not reach a page.

    >>> web_address("git@github.com:someone/attention.git")
    'https://github.com/someone/attention'
    >>> web_address("https://user:secret@github.com/someone/attention.git/")
    'https://github.com/someone/attention'
    >>> web_address("/srv/git/attention.git") is None
    True
    """
    remote = remote.strip().removesuffix("/").removesuffix(".git")
    scp = re.fullmatch(r"[\w.-]+@(?P<host>[\w.-]+):(?P<path>[^/][^:]*)", remote)
    url = re.fullmatch(
        r"(?:https?|ssh|git)://(?:[^@/]+@)?(?P<host>[\w.-]+)(?::\d+)?/(?P<path>.+)", remote
    )
    match = scp or url
    return f"https://{match['host']}/{match['path']}" if match else None


def _git(root: Path, *args: str) -> str | None:
    """`git -C root ARGS`' output, stripped; None where git fails or prints nothing."""
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def repository(environ: Mapping[str, str], root: Path = ROOT) -> Repository | None:
    """The repository's address, resolved once per build: the setting `ATTENTION_REPO_URL`
    where given; else the GitHub Actions run's (`GITHUB_SERVER_URL`/`GITHUB_REPOSITORY`);
    else the checkout's `origin` remote where it is a web or SSH address (`git config`, no
    network); else None: the build does not know it. The ref is the run's commit
    (`GITHUB_SHA`), else the checkout's commit where a remote branch holds it (a local commit
    would be a dead link), else `HEAD`, the repository's default branch.

    >>> repository({"GITHUB_SERVER_URL": "https://github.com",
    ...             "GITHUB_REPOSITORY": "someone/attention", "GITHUB_SHA": "abc123"})
    Repository(url='https://github.com/someone/attention', ref='abc123')
    """
    server, name = environ.get("GITHUB_SERVER_URL"), environ.get("GITHUB_REPOSITORY")
    setting = environ.get(REPOSITORY_SETTING, "").strip()
    if setting:
        url: str | None = setting.rstrip("/")
    elif server and name:
        url = f"{server.rstrip('/')}/{name}"
    else:
        origin = _git(root, "config", "--get", "remote.origin.url")
        url = web_address(origin) if origin else None
    if url is None:
        return None
    ref = environ.get("GITHUB_SHA") if server and name else None
    if not ref:
        commit = _git(root, "rev-parse", "HEAD")
        ref = commit if commit and _git(root, "branch", "-r", "--contains", commit) else "HEAD"
    return Repository(url, ref)


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
    package = Package(wheel, sdist, config.get("site_url"), repository(os.environ))
    config.extra["package"] = package.as_extra()
    work = Path(tempfile.mkdtemp(prefix="attention-dist-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    copy_sources(work / "src")
    (work / "site" / DIST).mkdir(parents=True)
    with open(work / "build.log", "w", encoding="utf-8") as output:
        process = subprocess.Popen(
            [sys.executable, "-c", BUILD, str(work / "site" / DIST)],
            cwd=work / "src",
            stdout=output,
            stderr=subprocess.STDOUT,
        )
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
            File(
                f"{DIST}/{name}",
                src_dir=str(out.parent),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
            )
        )
    now = time.perf_counter()
    log.info(
        "Built %s and %s in %.1f s (%.1f s of it waited for)",
        package.wheel,
        package.sdist,
        now - build.start,
        now - waited,
    )
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
        lines = [
            "```bash",
            "pip install \\",
            f"  {package.wheel_url}",
            "```",
            "",
            f"That is this build's wheel, {link}.",
        ]
    else:
        lines = [
            f"Download this build's wheel, {link}, and install the file:",
            "",
            "```bash",
            f"pip install ./{wheel}",
            "```",
        ]
    sdist_link = f"[`{sdist}`]({DIST}/{sdist}) ({size(sizes[sdist])})"
    lines += [
        "",
        f"Or its source distribution, {sdist_link}, the same way: pip builds the "
        "same wheel from it.",
    ]
    return "\n".join(lines)


def contents_table(contents: dict[str, tuple[int, int]]) -> str:
    """Markdown: the wheel's top-level entries, their files and bytes (uncompressed)."""
    rows = ["| In the wheel | Files | Size |", "| --- | ---: | ---: |"]
    for top, (files, nbytes) in contents.items():  # the metadata's long name would not fit a phone
        name = "its metadata, `.dist-info/`" if top.endswith(".dist-info") else f"`{top}/`"
        rows.append(f"| {name} | {files} | {size(nbytes)} |")
    return "\n".join(rows)


def _name(repository: Repository) -> str:
    """`github.com/o/r`: the address as a link's text."""
    return re.sub(r"^https?://", "", repository.url)


HOW_TO_GIVE = (
    f"A build takes it from the setting `{REPOSITORY_SETTING}` (an environment variable), "
    "else from the GitHub Actions run that builds it, else from its checkout's `origin` remote."
)


def source_text(package: Package) -> str:
    """Markdown: where the source lives; without a known repository, how to give it."""
    if package.repository:
        url = package.repository.url
        return (
            f"The source is in the repository [{_name(package.repository)}]({url}): the package "
            "(`attention/`, `attention_bench/`), this site's pages (`docs/`) and its tooling "
            "(`attention_site/`), and the tests (`tests/`). Its README says how to run the "
            "tests and build this site."
        )
    return (
        "The source distribution above holds the package's source, `attention/` and "
        "`attention_bench/`. The site's pages, its tooling and the tests are in the project's "
        f"repository, whose address this build was not given. {HOW_TO_GIVE}"
    )


def repository_text(package: Package) -> str:
    """Markdown, one paragraph: the repository's link and how to check it out, or how a
    build is given its address."""
    what = "The repository holds the package, these pages, their tooling and the tests"
    if package.repository:
        url = package.repository.url
        return f"{what}: [{_name(package.repository)}]({url}), checked out by `git clone {url}`."
    return f"{what}; this build was not given its address. {HOW_TO_GIVE}"


def module_source_text(package: Package, path: str) -> str:
    """Markdown: where the module `path` (`attention/layer/fused.py`) is in the repository."""
    if package.repository:
        return f"Source: [`{path}`]({package.repository.blob(path)})."
    return (
        f"Source: `{path}`, in the repository, whose address this build was not given "
        f"(the setting `{REPOSITORY_SETTING}`)."
    )


def page_source(package: Package, src_uri: str) -> str:
    """HTML for a page's footer: a link to the file it is made from (an API page's: its
    module); nothing where the repository is unknown."""
    if package.repository is None:
        return ""
    path = f"docs/{src_uri}"
    api = re.fullmatch(r"api/(?P<module>[\w.]+)\.md", src_uri)
    if api:  # a module's page: its package's __init__.py, else its .py (as Python finds it)
        module = ROOT.joinpath(*api["module"].split("."))
        files = [module / "__init__.py", module.with_suffix(".py")]
        file = next((file for file in files if file.is_file()), None)
        if file is None:  # the index and the nav: generated, no file of their own
            return f' <a class="page-source" href="{package.repository.url}">The repository</a>.'
        path = file.relative_to(ROOT).as_posix()
    link = package.repository.blob(path)
    return f' <a class="page-source" href="{link}">This page\'s source</a>.'


_PAGE_SOURCE = re.compile(r'<a class="page-source" href="(?P<href>[^"]+)"')
HOW_TO_GIVE_PAGES = ("index.html", "start/index.html", "run/index.html")
"""The built pages that say how to give a build the repository's address when it has none."""


def unlinked_pages(site_dir: Path, repository: Repository | None, root: Path = ROOT) -> list[str]:
    """The built pages that break the promise of a repository one click away, each with why.

    With a repository, every page (`*.html` but `404.html`) must link it in its footer
    (`page_source`): the repository itself, or a file that exists in the checkout at
    `repository.ref`'s path (no dead link). Without one, the pages of `HOW_TO_GIVE_PAGES`
    must name the setting `ATTENTION_REPO_URL`.
    """
    problems = []
    if repository is None:
        for name in HOW_TO_GIVE_PAGES:
            page = site_dir / name
            if not page.is_file() or REPOSITORY_SETTING not in page.read_text(encoding="utf-8"):
                problems.append(f"{name}: does not say how to give the repository's address")
        return problems
    prefix = repository.blob("")
    for page in sorted(site_dir.rglob("*.html")):
        name = page.relative_to(site_dir).as_posix()
        if name == "404.html":
            continue
        links = _PAGE_SOURCE.findall(page.read_text(encoding="utf-8"))
        if len(links) != 1:
            problems.append(f"{name}: {len(links)} links to its source, not 1")
        elif links[0] != repository.url and not (
            links[0].startswith(prefix) and (root / links[0].removeprefix(prefix)).is_file()
        ):
            problems.append(f"{name}: its source link {links[0]} names no file of the checkout")
    return problems


def needs_repository(package: Package, need: Need | None = None) -> str:
    """HTML, under a shown block that needs more than the wheel (`need`; by default, a block
    that imports `attention_site`): where it runs. A block that needs `attention_site` runs in a
    checkout of the repository; one that needs `transformers` (only) after `pip install
    transformers`. The block imports them, or (`need.names`) reads what an earlier block that
    needs them defined."""
    from attention_site.pages import Need

    need = need or Need(("attention_site",))

    def listed(modules: tuple[str, ...]) -> str:
        return " and ".join(
            f"<code>{m}</code>" + (" (the site's tooling)" if m == "attention_site" else "")
            for m in modules
        )

    parts = [f"imports {listed(need.imports)}"] if need.imports else []
    if need.names:
        names = ", ".join(f"<code>{name}</code>" for name in need.names)
        parts.append(f"uses {names}, defined by an earlier block that needs {listed(need.via)}")
    what = " and ".join(parts)
    if "attention_site" not in need.modules:
        return (
            f'<p class="needs-repository">This block {what}, which the wheel does not install: '
            f"it runs after <code>pip install {' '.join(need.modules)}</code>.</p>"
        )
    if package.repository:
        where = f'<a href="{package.repository.url}">the repository</a>'
    else:
        where = (
            "the repository (this build was not given its address: "
            f"<code>{REPOSITORY_SETTING}</code>)"
        )
    more = [module for module in need.modules if module != "attention_site"]
    also = f" with <code>pip install {' '.join(more)}</code>" if more else ""
    return (
        f'<p class="needs-repository">This block {what}: it runs in a checkout of {where}{also}, '
        "not with the wheel alone.</p>"
    )


def mark_repository_blocks(markdown: str, package: Package) -> str:
    """Each shown block that needs more than the wheel followed by `needs_repository`: the
    blocks that import `attention_site` or `transformers`, and those that read what they made
    (`attention_site.pages`)."""
    from attention_site.pages import SHOWN, is_shown, page_blocks, repository_blocks

    needs = {block.line: names for block, names in repository_blocks(page_blocks(markdown)).items()}

    def mark(match: re.Match[str]) -> str:
        line = markdown.count("\n", 0, match.start()) + 1
        if not is_shown(match["options"]) or line not in needs:
            return match[0]
        return f"{match[0]}\n\n{match['indent']}{needs_repository(package, needs[line])}"

    return SHOWN.sub(mark, markdown)


def expand(
    markdown: str,
    package: Package,
    sizes: dict[str, int],
    contents: dict[str, tuple[int, int]],
    where: str,
) -> str:
    """`<!-- package: install -->`, `contents`, `source`, `repository` and
    `source-of attention/PATH.py` of the page `where`, written out; each shown block that
    imports `attention_site` marked (`mark_repository_blocks`)."""
    directives = {
        "install": lambda: install_text(package, sizes),
        "contents": lambda: contents_table(contents),
        "source": lambda: source_text(package),
        "repository": lambda: repository_text(package),
    }

    def replace(match: re.Match[str]) -> str:
        if match["name"] not in directives:
            raise PluginError(
                f"{where}: no <!-- package: {match['name']} -->; there are {', '.join(directives)}"
            )
        text = directives[match["name"]]()  # indented like the directive (in a list item)
        return "\n".join(match["indent"] + line if line else line for line in text.split("\n"))

    def replace_module(match: re.Match[str]) -> str:
        return module_source_text(package, match["arg"])

    markdown = _MODULE_DIRECTIVE.sub(replace_module, markdown)
    return mark_repository_blocks(_DIRECTIVE.sub(replace, markdown), package)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    build = _builds[-1]
    return expand(markdown, build.package, build.sizes, build.contents, page.file.src_uri)


def on_page_context(context: Any, page: Page, config: MkDocsConfig, nav: Any) -> Any:
    """The footer (docs/hooks/stamp.py's stamp, set just before) links the page's source."""
    config["copyright"] += page_source(_builds[-1].package, page.file.src_uri)
    return context


def on_post_build(config: MkDocsConfig) -> None:
    """Fail the build where a page does not link the repository (`unlinked_pages`)."""
    problems = unlinked_pages(Path(config["site_dir"]), _builds[-1].package.repository)
    if problems:
        raise PluginError("the repository is not one click away:\n" + "\n".join(problems))
