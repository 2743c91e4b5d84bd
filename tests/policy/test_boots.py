"""The pure boot rules: median and p90 (nearest rank) of boot times, and when a cold boot is
slow enough that its host is avoided (more than 3× the median of at least 5 earlier boots)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoscaler.policy.boots import BOOT_PHASES, BootStat, boot_stat, judge_boot


def test_median_and_p90():
    assert boot_stat([]) is None
    assert boot_stat([42.0]) == BootStat(42.0, 42.0, 1)
    assert boot_stat([3.0, 1.0, 2.0, 4.0]) == BootStat(2.5, 4.0, 4)
    assert boot_stat(float(s) for s in range(1, 21)) == BootStat(10.5, 18.0, 20)
    # negative and non-finite seconds are no boot
    assert boot_stat([-5.0, math.nan, math.inf, 10.0]) == BootStat(10.0, 10.0, 1)


def test_a_boot_is_slow_above_three_medians_of_five_earlier_ones():
    earlier = [100.0, 110.0, 90.0, 105.0, 95.0]  # median 100
    assert judge_boot(300.0, earlier) is None  # 3× exactly: not more
    slow = judge_boot(300.5, earlier)
    assert slow is not None and (slow.median, slow.samples, slow.factor) == (100.0, 5, 3.0)
    assert "300s" in slow.reason("gpu-vast", "RTX 4090", "4242")
    assert "host 4242" in slow.reason("gpu-vast", "RTX 4090", "4242")
    assert judge_boot(10_000.0, earlier[:4]) is None  # four earlier boots judge nothing
    assert judge_boot(10_000.0, [0.0] * 5) is None  # a median of nothing judges nothing
    assert judge_boot(math.nan, earlier) is None


@given(
    st.lists(st.floats(min_value=1, max_value=1e5), min_size=5, max_size=60),
    st.floats(min_value=0, max_value=1e6),
)
def test_slow_means_more_than_three_times_the_median(earlier, seconds):
    stat = boot_stat(earlier)
    assert stat is not None and stat.p90 >= stat.median
    verdict = judge_boot(seconds, earlier)
    assert (verdict is not None) == (seconds > 3 * stat.median)


def test_the_phases_in_the_order_they_happen():
    assert BOOT_PHASES == (
        "started",
        "registered",
        "code_fetched",
        "requirements_installed",
        "worker_up",
        "first_job",
    )


@pytest.mark.parametrize("n", [1, 9, 10, 11, 50])
def test_p90_is_a_boot_that_happened(n):
    values = [float(i) for i in range(n)]
    stat = boot_stat(values)
    assert stat is not None and stat.p90 in values and stat.samples == n
