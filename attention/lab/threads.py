"""Small trainings on few threads: every experiment of the lab runs in `torch_threads`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from attention.checks import check_size

__all__ = ["torch_threads"]


@contextmanager
def torch_threads(num_threads: int | None) -> Iterator[None]:
    """Inside the `with` block, torch runs on `num_threads` intra-op threads; restored after.

    A model as small as [`TinyAttentionModel`][attention.lab.training.TinyAttentionModel] does too
    little work per operation to share it: a second thread mostly waits for the first, and on
    a busy machine a training step can take ten times longer than on one thread. Every small
    training of the site runs in it (chapters 1, 8, 14 and 16).

    Args:
        num_threads: threads inside the block, at least 1; None leaves the setting as it is.

    Raises:
        TypeError: `num_threads` is not an int.
        ValueError: `num_threads` is below 1.

    Examples:
        >>> outside = torch.get_num_threads()
        >>> with torch_threads(1):
        ...     torch.get_num_threads()
        1
        >>> torch.get_num_threads() == outside
        True
        >>> with torch_threads(None):  # leaves the setting
        ...     torch.get_num_threads() == outside
        True
    """
    if num_threads is not None:
        check_size("num_threads", num_threads)
    before = torch.get_num_threads()
    torch.set_num_threads(before if num_threads is None else num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
