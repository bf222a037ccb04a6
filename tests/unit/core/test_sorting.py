"""The lock-keeping searches and sorts give NumPy's answers, on both sides of their size
limits, for int64 and for the object arrays wide keys use."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from cursorsync.core import sorting

values = st.integers(-50, 50)
# Around the limits: small enough for the lock-keeping path, and past it.
lengths = st.sampled_from([0, 1, 2, 7, sorting.SORT_ELEMENTS, sorting.SORT_ELEMENTS + 1, 300])


@st.composite
def sorted_arrays(draw: st.DrawFn) -> np.ndarray:
    n = draw(lengths)
    return np.sort(np.array(draw(st.lists(values, min_size=n, max_size=n)), dtype=np.int64))


@given(sorted_arrays(), st.lists(values, max_size=30), st.sampled_from(["left", "right"]),
       st.booleans())
def test_searchsorted_finds_numpys_places(a: np.ndarray, v: list[int], side: str,
                                         wide: bool) -> None:
    probe = np.array(v, dtype=np.int64)
    if wide:
        a, probe = a.astype(object), probe.astype(object)
    got = sorting.searchsorted(a, probe, side=side)  # type: ignore[arg-type]
    want = np.searchsorted(a, probe, side=side)  # type: ignore[call-overload]
    assert got.dtype == want.dtype and got.tolist() == want.tolist()
    for x in v:
        one = sorting.searchsorted(a, x, side=side)  # type: ignore[arg-type]
        assert np.ndim(one) == 0 and int(one) == int(np.searchsorted(a, x, side=side))


def test_searchsorted_compares_with_values_beyond_int64() -> None:
    a = np.array([1, 5, 9], dtype=np.int64)
    assert int(sorting.searchsorted(a, 1 << 70)) == 3
    assert int(sorting.searchsorted(a, -(1 << 70), side="right")) == 0


@given(st.integers(0, 3 * sorting.SORT_ELEMENTS).flatmap(
    lambda n: st.lists(st.integers(-5, 5), min_size=n, max_size=n)))
def test_argsort_is_numpys_stable_order(v: list[int]) -> None:
    a = np.array(v, dtype=np.int64)
    assert sorting.argsort(a).tolist() == np.argsort(a, kind="stable").tolist()
    assert sorting.argsort(a).dtype == np.intp


@given(st.integers(0, 3 * sorting.SORT_ELEMENTS).flatmap(
    lambda n: st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
                       min_size=n, max_size=n)))
def test_lexsort_is_numpys_order(rows: list[tuple[int, int, int]]) -> None:
    cols = [np.array([r[i] for r in rows], dtype=np.int64) for i in range(3)]
    got = sorting.lexsort(cols)
    assert got.dtype == np.intp and got.tolist() == np.lexsort(cols).tolist()


@given(st.integers(0, 3 * sorting.SORT_ELEMENTS).flatmap(
    lambda n: st.lists(st.integers(-9, 9), min_size=n, max_size=n)))
def test_unique_is_numpys(v: list[int]) -> None:
    a = np.array(v, dtype=np.int64)
    got = sorting.unique(a)
    assert got.dtype == a.dtype and got.tolist() == np.unique(a).tolist()


@given(st.lists(st.binary(max_size=3), max_size=12), st.lists(st.binary(max_size=3), max_size=5),
       st.sampled_from(["left", "right"]))
def test_searchsorted_finds_numpys_places_among_byte_strings(
        a: list[bytes], v: list[bytes], side: str) -> None:
    keys = np.sort(np.array(a, dtype="S4"))
    probe = np.array(v, dtype="S4")
    assert (sorting.searchsorted(keys, probe, side=side).tolist()  # type: ignore[arg-type]
            == np.searchsorted(keys, probe, side=side).tolist())  # type: ignore[call-overload]
    for x in v:
        assert (int(sorting.searchsorted(keys, x, side=side))  # type: ignore[arg-type]
                == int(np.searchsorted(keys, x, side=side)))  # type: ignore[call-overload]
