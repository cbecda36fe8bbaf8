"""The package's own source, for a page to print: pages show the code that runs.

[`attention_site.plot`][attention_site.plot] re-exports
[`source`][attention_site.listing.source], which the chapters import from there.
"""

from __future__ import annotations

from typing import Any

__all__ = ["source"]


def source(*objs: Any, docstrings: bool = False) -> str:
    """The package's own source of `objs`, as one fenced python block for a page to print.

    Pages show the code that runs, never a copy of it: a chapter prints
    `source(CausalAttention.forward)` from an `exec="1"` block and the reader sees the lines
    the package executes today.

    Args:
        *objs: functions, methods or classes.
        docstrings: keep their docstrings (by default they are dropped: the page's prose and
            the API reference carry them).

    Returns:
        Markdown: a fenced python block holding each object's dedented source, in order.

    Examples:
        >>> from attention.derivation.core import softmax_stable
        >>> block = source(softmax_stable)
        >>> block.splitlines()[:2]
        ['```python', 'def softmax_stable(x: Tensor, dim: int = -1) -> Tensor:']
        >>> "Softmax that cannot overflow" in block  # the docstring is dropped
        False
    """
    import ast
    import inspect
    import textwrap

    blocks = []
    for obj in objs:
        src = textwrap.dedent(inspect.getsource(obj))
        dropped: set[int] = set()
        if not docstrings:
            for node in ast.walk(ast.parse(src)):
                body = getattr(node, "body", None)
                if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
                    value = body[0].value
                    if isinstance(value, ast.Constant) and isinstance(value.value, str):
                        end = body[0].end_lineno or body[0].lineno
                        dropped.update(range(body[0].lineno, end + 1))
        kept = [line for n, line in enumerate(src.splitlines(), 1) if n not in dropped]
        blocks.append("\n".join(kept))
    return "```python\n" + "\n\n".join(blocks) + "\n```"
