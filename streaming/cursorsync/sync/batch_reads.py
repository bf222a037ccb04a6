"""What both clusters hold of partly acked batches, for the sync's index acks
(``emission.batch_index_acks``), read through cursorsync's broker plugin.

The source's answer is the evidence: every partly acked batch, read a page of the
plugin's at a time, goes into the source cursor state the plan and its guard see. The
target's first page, when its brokers have the plugin too, says which indexes are acked
there already, so they are not sent again; without it (or past that page) a batch is sent
while it stays partly acked (the acks are idempotent). A target broker that keeps no batch
indexes would ignore index acks: nothing is planned for it, and it is said once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from cursorsync.core.batches import PartialBatch
from cursorsync.core.positions import Position
from cursorsync.errors import ConfigError
from cursorsync.pulsar.admin import AdminClient
from cursorsync.pulsar.batch_acks import (
    BatchAcks,
    BatchAcksNotFoundError,
    BatchAcksPluginAbsentError,
    fetch_batch_acks,
    fetch_every_batch,
)
from cursorsync.pulsar.topics import TopicName

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeldBatches:
    """One cursor's partly acked batches on each side."""

    #: The source's, to carry (empty: none, or the source keeps no batch indexes).
    source: tuple[PartialBatch, ...]
    #: The target's by position (None: not known, the target has no plugin).
    target: dict[Position, PartialBatch] | None
    #: The target's broker keeps batch indexes (False: index acks would be ignored there).
    target_keeps: bool = True


class BatchReads:
    """Reads both clusters' plugins for the cursors of a sync batch, concurrently."""

    def __init__(self, source: AdminClient, target: AdminClient) -> None:
        self.source = source
        self.target = target
        self._target_plugin = True
        self._said_off: set[str] = set()

    def many(self, cursors: Sequence[tuple[str, str]]) -> dict[tuple[str, str], HeldBatches]:
        """Each (topic partition, subscription)'s batches; a cursor the source no longer
        has (topic or subscription gone) is left out."""
        out: dict[tuple[str, str], HeldBatches] = {}
        by_sub: dict[str, list[str]] = {}
        for topic, sub in cursors:
            by_sub.setdefault(sub, []).append(topic)
        for sub, topics in by_sub.items():
            sources = self.source.map_concurrently(partial(self._source, sub), topics)
            wanted = [t for t, got in sources.items() if got is not None and got.batches]
            targets = (self.target.map_concurrently(partial(self._target, sub), wanted)
                       if self._target_plugin else {})
            for topic, got in sources.items():
                if got is None:
                    continue
                held = targets.get(topic)
                keeps = held is None or held.batch_index_acks
                if not keeps and topic not in self._said_off:
                    self._said_off.add(topic)
                    log.warning("%s: the target's broker keeps no batch indexes "
                                "(acknowledgmentAtBatchIndexLevelEnabled off), so partly acked "
                                "batches are not carried there", topic)
                out[topic, sub] = HeldBatches(
                    got.batches if keeps else (),
                    None if held is None else {b.position: b for b in held.batches}, keeps)
        return out

    def _source(self, subscription: str, topic: TopicName) -> BatchAcks | None:
        try:
            return fetch_every_batch(self.source, topic, subscription)
        except BatchAcksPluginAbsentError as err:
            raise ConfigError(
                f"emission.batch_index_acks needs cursorsync's broker plugin on the source "
                f"cluster {self.source.cluster}'s brokers (streaming/broker-plugin): {err}"
            ) from err
        except BatchAcksNotFoundError:
            return None

    def _target(self, subscription: str, topic: TopicName) -> BatchAcks | None:
        try:
            return fetch_batch_acks(self.target, topic, subscription)
        except BatchAcksPluginAbsentError:
            if self._target_plugin:
                log.info("the target cluster %s has no cursorsync broker plugin: partly acked "
                         "batches are sent again at every sync while they stay so",
                         self.target.cluster)
            self._target_plugin = False
            return None
        except BatchAcksNotFoundError:
            return None  # the subscription is made on the target by the first ack
