"""Binary searches and sorts that keep the interpreter lock on small arrays.

NumPy lets go of the GIL in every ``searchsorted``, ``argsort``, ``lexsort`` and
``unique``, whatever the size. In the driver the sync and the mapping builder share one
interpreter: a thread that lets go has to wait for the other's switch interval (5 ms)
before it runs again, so a call that takes 2 µs alone takes 50-250 µs beside a busy
thread, and a plan makes dozens (docs/performance.md). On small arrays these functions
give the same answers with operations that keep the lock: broadcast comparisons (NumPy
keeps the lock for loops of up to 500 elements) and Python's stable sort. Larger arrays
go to NumPy, whose work there is worth the release.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, overload

import numpy as np
import numpy.typing as npt

#: The most comparisons a search makes at once and keeps the lock (NumPy's loops keep it
#: up to 500 elements).
SEARCH_ELEMENTS = 500
#: The longest array sorted by Python's sort (about 10 µs at this length).
SORT_ELEMENTS = 64


Side = Literal["left", "right"]


@overload
def searchsorted(a: npt.NDArray[Any], v: int | bytes | np.generic,
                 side: Side = "left") -> np.intp: ...
@overload
def searchsorted(a: npt.NDArray[Any], v: npt.NDArray[Any],
                 side: Side = "left") -> npt.NDArray[np.intp]: ...
def searchsorted(a: npt.NDArray[Any], v: Any, side: Side = "left") -> Any:
    """``np.searchsorted(a, v, side)`` for sorted ``a``: where each value of ``v`` (an array
    or a scalar) would go, before equal values (``left``) or after them (``right``)."""
    if np.ndim(v) == 0:
        if len(a) > SEARCH_ELEMENTS:
            return np.searchsorted(a, v, side=side)
        below = a < v if side == "left" else a <= v
        return np.intp(np.count_nonzero(below))
    v = np.asarray(v)
    if len(a) * v.size > SEARCH_ELEMENTS or v.ndim != 1:
        return np.searchsorted(a, v, side=side)
    below = a[None, :] < v[:, None] if side == "left" else a[None, :] <= v[:, None]
    return below.sum(axis=1, dtype=np.intp)


def argsort(a: npt.NDArray[Any]) -> npt.NDArray[np.intp]:
    """``np.argsort(a, kind="stable")`` of a one-dimensional array."""
    if len(a) > SORT_ELEMENTS:
        return np.argsort(a, kind="stable")
    values = a.tolist()
    return np.array(sorted(range(len(values)), key=values.__getitem__), dtype=np.intp)


def lexsort(keys: Sequence[npt.NDArray[Any]]) -> npt.NDArray[np.intp]:
    """``np.lexsort(keys)``: the order by the last key, then the one before it, and so on;
    ties in every key keep their order."""
    n = len(keys[0]) if len(keys) else 0
    if n > SORT_ELEMENTS:
        return np.lexsort(keys)
    rows = list(zip(*(k.tolist() for k in reversed(keys)), strict=True))
    return np.array(sorted(range(n), key=rows.__getitem__), dtype=np.intp)


def unique(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``np.unique(a)`` of a one-dimensional array: its distinct values, sorted."""
    if len(a) > SORT_ELEMENTS:
        return np.unique(a)
    return np.array(sorted(set(a.tolist())), dtype=a.dtype)
