"""Hostile values and the scalar strategies built on them (durations, counts, names, crons,
URLs), each mixing good values with hostile ones.

Apart from the generators of whole inputs (`files`, `clicases`) because both draw on them.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tests.fuzz.harness import oddly_written

# ------------------------------------------------------------------------------ values

HUGE_INTS = [10**20, 10**400, -(10**30), 2**63, 10**18]
HOSTILE_STRINGS = [
    "",
    " ",
    "\t",
    "a b",
    "jobs ",
    "a\nb",
    "a\x00b",
    "a\x01b",
    "\u200b",
    "é",
    "x" * 150,
    "x" * 5000,
    "1" + "0" * 400,
    "{{",
    "*",
    "&a",
    "!!python/object:os.system",
    "\ud7ff",
]
HOSTILE_FLOATS = [1e308, -1e308, float("inf"), float("nan"), -0.0, 1e-300, 5e-324]
GOOD_DURATIONS = ["30s", "5m", "1h30m", 90, "2h", "1d", 600, "10m"]
HOSTILE_DURATIONS = [
    "0.0000001s",
    "99999999999999999999d",
    "1" + "0" * 400 + "s",
    -1,
    0,
    "5 minutes",
    "1h1h",
    "9" * 50,
    10**400,
    1e308,
]
GOOD_CRONS = ["0 8 * * 1-5", "*/15 * * * *", "30 7 * * 1-5", "0 0 L * *", "0 18 * * *"]
HOSTILE_CRONS = [
    "0 0 31 2 *",
    "0 0 30 2 *",
    "0 0 31 4 *",
    "0 0 29 2 *",
    "0 8 * * *\n",
    " 0 8 * * *",
    "0\t8 * * *",
    "61 * * * *",
    "0 0 8 * * *",
    "",
    "9" * 5000,
    "*/0 * * * *",
    "@daily",
    "0 0 1 1 0#5",
    "1-99999999999999999999 * * * *",
]
GOOD_URLS = [
    "redis://127.0.0.1:6379/0",
    "redis://:pw@127.0.0.1:6379/15",
    "amqp://guest:guest@127.0.0.1:5672//",
    "sqla+sqlite:///x.db",
    "http://prometheus:9090",
]
HOSTILE_URLS = [
    "redis://h:abc/0",
    "redis://h:99999/0",
    "redis://[::1/0",
    "not a url",
    "redis://:p@ss@h:0/0",
    "http://",
    "redis://h:-1/0",
    "redis://" + "h" * 3000,
    "redis://h:6379/0\n",
    "://",
    "redis://u:secret-pw@h:65536/0",
]
NAMES = ["jobs", "gpu", "inference", "a.b-c_d", "q:1@x/y"]


def hostile_scalar() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from(HOSTILE_STRINGS),
        st.sampled_from(HUGE_INTS),
        st.sampled_from(HOSTILE_FLOATS),
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        st.text(max_size=20),
        st.sampled_from([[], {}, [1, [2, [3]]], {"a": {"b": {}}}]),
    )


def sometimes(
    rare: st.SearchStrategy[Any], usual: st.SearchStrategy[Any], one_in: int
) -> st.SearchStrategy[Any]:
    """`rare` about once in `one_in` draws. (Hypothesis favours the ends of an integer range,
    so the rare branch is a value from the middle.)"""
    return st.integers(0, one_in - 1).flatmap(lambda i: rare if i == one_in // 2 else usual)


def mix(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly good values (7 in 8), sometimes hostile ones."""
    return sometimes(hostile_scalar(), good, 8)


def durations() -> st.SearchStrategy[Any]:
    odd = st.sampled_from([str(d) for d in GOOD_DURATIONS]).flatmap(oddly_written)
    return sometimes(
        st.sampled_from(HOSTILE_DURATIONS) | odd, mix(st.sampled_from(GOOD_DURATIONS)), 8
    )


def counts(low: int, high: int) -> st.SearchStrategy[Any]:
    """A whole number of the block (machines, a threshold, a priority): mostly fine, sometimes
    hostile, sometimes written with another script's digit or a blank in it."""
    odd = st.integers(low, high).map(str).flatmap(oddly_written)
    return sometimes(odd, mix(st.integers(low, high)), 8)


def names() -> st.SearchStrategy[Any]:
    hostile = st.one_of(st.sampled_from(HOSTILE_STRINGS), st.text(max_size=12), st.integers(-5, 5))
    return sometimes(hostile, st.sampled_from(NAMES), 6)


def crons() -> st.SearchStrategy[Any]:
    hostile = st.sampled_from(HOSTILE_CRONS) | st.text(max_size=20)
    return sometimes(hostile, st.sampled_from(GOOD_CRONS), 4)


def urls() -> st.SearchStrategy[Any]:
    odd = st.sampled_from(GOOD_URLS).flatmap(oddly_written)  # a port or a database number
    hostile = st.sampled_from(HOSTILE_URLS) | st.text(max_size=30) | odd
    return sometimes(hostile, st.sampled_from(GOOD_URLS), 4)
