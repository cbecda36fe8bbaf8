"""MkDocs hook: the footer of every page, stating what computed its outputs.

The `attention` and torch versions, the devices and the date; on a page that runs no code
(`page.meta["computed"]`, set by docs/hooks/build.py), what built it. What a page shows but
this build did not compute is named as the exception: results named by its front matter
(`stored:`), and the trainings its blocks read back from `.cache/attention-runs/`
([`attention_site.runs.from_disk`][attention_site.runs.from_disk]).
Listed before docs/hooks/package.py in mkdocs.yml, which links each page's source after it.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page

NOTEBOOK_READ_BACK = (
    "This notebook's outputs were computed by an earlier build of the same notebook, code and "
    "versions, and read back (<code>attention_site.stored</code>)"
)
"""The footer's opening on a notebook's page whose outputs were read back
(docs/hooks/notebooks.py)."""


def build_stamp(
    computed: bool = True, stored: str | None = None, notebook_stored: bool = False
) -> str:
    """One line for the footer: what computed every output on the page (or built a page that
    `computed` nothing: no executed block, no console transcript, no notebook), except what
    `stored` names: outputs the page reads from files made before the build; or, on a
    notebook's page whose outputs were all read back (`notebook_stored`), that they were
    (`NOTEBOOK_READ_BACK`)."""
    import torch

    import attention

    def describe(device: torch.device) -> str:
        if device.type == "cuda":
            return f"{device} ({torch.cuda.get_device_name(device)})"
        return str(device)

    # The pages' tensors live on torch's default device: report that, not a setting, so the
    # stamp cannot claim a GPU that computed nothing. Only the measurements follow the setting.
    pages = describe(torch.get_default_device())
    measured = describe(torch.device(os.environ.get("ATTENTION_DEVICE", "cpu")))
    devices = f"<code>{pages}</code>"
    if measured != pages:
        devices += f" (measurements on <code>{measured}</code>)"
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    now = dt.datetime.fromtimestamp(int(epoch), dt.UTC) if epoch else dt.datetime.now(dt.UTC)
    if notebook_stored:
        what = f"{NOTEBOOK_READ_BACK}; the site was built"
    elif computed:
        what = "Every output on this page was computed while the site was built"
    else:
        what = "This page runs no code; the site was built"
    but = f", except {stored}" if stored and computed and not notebook_stored else ""
    return (
        f'<span class="build-stamp">{what} on {now:%Y-%m-%d}, by <code>attention</code> '
        f"{attention.__version__} with torch {torch.__version__} on {devices} (Python "
        f"{sys.version_info.major}.{sys.version_info.minor}){but}.</span>"
    )


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    config["copyright"] = build_stamp()
    return config


def on_page_content(html: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Note on the page the trainings its blocks read from disk (`attention_site.stored`)
    instead of computing them in this build: its footer names them."""
    from attention_site.runs import from_disk

    read = from_disk()
    if read and "stored" not in page.meta:
        page.meta["stored"] = read_back(read)
    return html


def read_back(functions: list[str]) -> str:
    """What the footer says of the trainings (`module.name`) a page read from disk."""
    names = ", ".join(f"<code>{name.rsplit('.', 1)[-1]}</code>" for name in functions)
    trainings = "the training" if len(functions) == 1 else "the trainings"
    return (
        f"{trainings} {names}, read from the runs stored by an earlier build or test run "
        "of the same code, data and versions (<code>attention_site.stored</code>)"
    )


def on_page_context(context: Any, page: Page, config: MkDocsConfig, nav: Any) -> Any:
    stored = page.meta.get("stored")  # what the page shows but did not compute
    computed = page.meta.get("computed", True)  # set by docs/hooks/build.py
    notebook_stored = bool(page.meta.get("notebook_stored"))  # set by docs/hooks/notebooks.py
    config["copyright"] = build_stamp(computed, str(stored) if stored else None, notebook_stored)
    return context
