"""What is produced on a partition and when each message is acked on A, before any event."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cursorsync.core.keys import I64
from cursorsync_devtools.sim._topics import (
    REPLICATED,
    UNREPLICATED_EXCLUDED,
    UNREPLICATED_INBOUND,
)
from cursorsync_devtools.sim._workload import Workload

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class SourceMessages:
    """Every message produced on A, in position order: the per-message truth."""

    entry: I64  #: index of its entry in the source log
    batch_index: I64  #: -1 for an unbatched entry
    ack_ms: F64  #: when the consumer acked it on A (inf: not within the simulation)


@dataclass(frozen=True)
class Production:
    """What A's producers and B's local producers write, before any event happens."""

    data_ms: I64
    data_msgs: I64
    data_batched: npt.NDArray[np.bool_]
    data_reason: npt.NDArray[np.int8]
    foreign_ms: I64
    foreign_msgs: I64

    @property
    def end_ms(self) -> int:
        return int(self.data_ms[-1]) if len(self.data_ms) else 0


def produce(w: Workload, messages: int, rng: np.random.Generator) -> Production:
    """Draw entries until ``messages`` messages are written: batch sizes, times, skip reasons."""
    lo, hi = w.batch_size
    mean = 1 + w.batch_probability * ((lo + hi) / 2 - 1)
    n = int(messages / mean * 1.3) + 16
    batched = rng.random(n) < w.batch_probability
    sizes = np.where(batched, rng.integers(lo, hi + 1, n), 1)
    while sizes.sum() < messages:  # unlucky draw: extend
        more_b = rng.random(n) < w.batch_probability
        batched = np.concatenate((batched, more_b))
        sizes = np.concatenate((sizes, np.where(more_b, rng.integers(lo, hi + 1, n), 1)))
    total = np.cumsum(sizes)
    k = int(np.searchsorted(total, messages, side="left")) + 1
    batched, sizes = batched[:k], sizes[:k].copy()
    sizes[-1] -= int(total[k - 1]) - messages
    gaps = np.maximum(1, np.rint(rng.exponential(w.entry_interval_ms, k))).astype(np.int64)
    times = np.cumsum(gaps)
    u = rng.random(k)
    reason = np.where(u < w.unreplicated_rate,
                      rng.integers(UNREPLICATED_INBOUND, UNREPLICATED_EXCLUDED + 2, k),
                      REPLICATED).astype(np.int8)
    end = int(times[-1])
    nf = int(rng.poisson(w.foreign_rate_per_s * end / 1000.0))
    fms = np.sort(rng.integers(1, end + 1, nf)).astype(np.int64)
    fmsgs = rng.integers(1, hi + 1, nf).astype(np.int64)
    return Production(times, sizes.astype(np.int64), batched, reason, fms, fmsgs)


def consume(w: Workload, prod: Production, rng: np.random.Generator) -> SourceMessages:
    """Per-message ack times on A; ``entry`` holds the data-entry index (remapped later)."""
    sizes = prod.data_msgs
    m = int(sizes.sum())
    entry = np.repeat(np.arange(len(sizes)), sizes)
    starts = np.cumsum(sizes) - sizes
    offset = np.arange(m) - starts[entry]
    batch_index = np.where(prod.data_batched[entry], offset, -1)
    recv = prod.data_ms[entry].astype(np.float64) + w.consumer_delay_ms
    ack = recv + rng.uniform(0.0, w.out_of_order_window_ms, m)
    life = w.hole_lifetime_ms * rng.uniform(0.5, 1.5, m)
    hole = rng.random(m) < w.hole_probability
    # Partial batches: a proper, non-empty subset of a batch's messages stays unacked long.
    partial_entry = (prod.data_batched & (sizes >= 2)
                     & (rng.random(len(sizes)) < w.partial_batch_probability))
    keep_k = rng.integers(1, np.maximum(sizes, 2))  # acked promptly: 1..size-1 messages
    delayed = partial_entry[entry] & (offset >= keep_k[entry])
    late = hole | delayed
    ack = np.where(late, recv + life, ack)
    if w.cumulative_ack_probability > 0:
        cum = rng.random(m) < w.cumulative_ack_probability
        c = np.where(cum, ack, np.inf)
        ack = np.minimum(ack, np.minimum.accumulate(c[::-1])[::-1])
    return SourceMessages(entry.astype(np.int64), batch_index.astype(np.int64), ack)
