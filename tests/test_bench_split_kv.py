"""The split-KV benchmark's harness: every configuration timed, each against its own base.

No time is asserted (the numbers belong to the machine): what is tested is the table.
"""

from __future__ import annotations

import pytest

from attention_bench import split_kv


def test_quick_run_prints_every_configuration_against_one_pass(
    capsys: pytest.CaptureFixture[str],
) -> None:
    shape = {**split_kv.SHAPE, "num_keys": 32, "num_heads": 2}
    times = split_kv.split_kv_times(shape, threads=(1,), budget_s=0.0)
    assert set(times[1]) == {(1, 1)} | {(n, w) for n in split_kv.SPLITS[1:] for w in (1, 2)}
    assert all(seconds > 0 for seconds in times[1].values())
    lines = split_kv.report(times).splitlines()
    assert len(lines) == 1 + len(times[1]) and lines[1].endswith("1.00x")
