"""What to sync and how: the topics and namespaces with their subscriptions, the evidence
that maps entries, and how acks are emitted."""

from __future__ import annotations

import re
from typing import Self, get_args

from pydantic import Field, field_validator, model_validator

from cursorsync.app.settings.base import (
    _NAMESPACE_RE,
    _PARTITION_SUFFIX_RE,
    _REPLICATOR_PREFIX,
    _TOPIC_RE,
    DEFAULT_SOURCE_POSITION_PROPERTY,
    EmissionMode,
    EvidenceStrategy,
    Holes,
    IdentityField,
    IdentityScope,
    _invalid,
    _Section,
)
from cursorsync.core.records import RewindPolicy
from cursorsync.pulsar.dispatch_probe import PROBE_SUBSCRIPTION
from cursorsync.pulsar.subscriptions import CUMULATIVE_TYPES, SubscriptionType

#: The mapping query reads each cluster on durable subscriptions named
#: ``cursorsync-mapping-<side>``; synced, they would ack what the mapping has not read.
MAPPING_SUBSCRIPTION_PREFIX = "cursorsync-mapping"


def _check_subscriptions(names: list[str]) -> list[str]:
    seen: set[str] = set()
    for name in names:
        if not name.strip():
            raise _invalid("subscription names must not be empty")
        if name.startswith((MAPPING_SUBSCRIPTION_PREFIX, PROBE_SUBSCRIPTION)):
            raise _invalid(
                f"{name!r} is one of cursorsync's own subscriptions, not one to sync "
                f"(names starting with {MAPPING_SUBSCRIPTION_PREFIX!r} or "
                f"{PROBE_SUBSCRIPTION!r} are reserved)"
            )
        if name.startswith(_REPLICATOR_PREFIX):
            raise _invalid(
                f"{name!r} is a replicator cursor, not a subscription "
                f"(names starting with {_REPLICATOR_PREFIX!r} are reserved)"
            )
        if name in seen:
            raise _invalid(f"subscription {name!r} is listed twice")
        seen.add(name)
    return names


class TopicSpec(_Section):
    """One topic and the subscriptions on it to keep in step."""

    topic: str
    subscriptions: list[str] = Field(min_length=1)

    @field_validator("topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        if value.startswith("non-persistent://"):
            raise _invalid(f"{value!r} is non-persistent: only persistent topics have cursors")
        if not _TOPIC_RE.fullmatch(value):
            raise _invalid(
                f"{value!r} is not a full topic name. Expected persistent://tenant/namespace/topic"
            )
        return value

    @field_validator("subscriptions")
    @classmethod
    def _subscriptions(cls, value: list[str]) -> list[str]:
        return _check_subscriptions(value)


class NamespaceSpec(_Section):
    """Every topic of a namespace whose local name matches ``regex`` (full match)."""

    namespace: str
    regex: str = ".*"
    subscriptions: list[str] = Field(min_length=1)

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not _NAMESPACE_RE.fullmatch(value):
            raise _invalid(f"{value!r} is not a namespace. Expected tenant/namespace")
        return value

    @field_validator("regex")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise _invalid(f"{value!r} is not a valid regular expression: {exc}") from None
        except (OverflowError, RecursionError):  # a repeat count or nesting past re's limits
            raise _invalid(f"{value!r} is not a valid regular expression: too large or "
                           "nested too deeply") from None
        return value

    @field_validator("subscriptions")
    @classmethod
    def _subscriptions(cls, value: list[str]) -> list[str]:
        return _check_subscriptions(value)

    def matches(self, topic: str) -> bool:
        """Whether a full topic name is in this namespace and its local name matches.

        A partition (``<name>-partition-<i>``) matches as its partitioned parent does.
        """
        prefix = f"persistent://{self.namespace}/"
        if not topic.startswith(prefix):
            return False
        local = _PARTITION_SUFFIX_RE.sub("", topic[len(prefix) :])
        return re.fullmatch(self.regex, local) is not None


_ALL_IDENTITY_FIELDS: tuple[IdentityField, ...] = get_args(IdentityField)
_ALL_STRATEGIES: tuple[EvidenceStrategy, ...] = get_args(EvidenceStrategy)
_DEFAULT_STRATEGIES: tuple[EvidenceStrategy, ...] = ("position-property", "identity")


class EvidenceConfig(_Section):
    """How source entries are matched to target entries, strongest strategy first."""

    strategies: list[EvidenceStrategy] = Field(
        default_factory=lambda: list(_DEFAULT_STRATEGIES), min_length=1
    )
    source_position_property: str = Field(default=DEFAULT_SOURCE_POSITION_PROPERTY, min_length=1)
    identity_fields: list[IdentityField] = Field(
        default_factory=lambda: list(_ALL_IDENTITY_FIELDS), min_length=1
    )
    alignment_window: int = Field(default=10_000, ge=1)
    #: How often each topic's replication clusters are read again (both clusters' admin
    #: APIs): evidence that does not hold on a topic's clusters stops the job within this
    #: long of its replication changing.
    topology_check_interval_s: float = Field(default=60.0, gt=0)
    #: Which entries identity evidence digests and matches. ``batched``: the source
    #: brokers stamp the position property (>= 3.0.11 / 3.3.6 / 4.0.4), which consumers
    #: see on every unbatched replica, so only batched entries need identity; the source
    #: stream then hands on only batched entries. An unbatched replica without the
    #: stamp stays unmapped (a duplicate after failover, never a loss).
    identity_scope: IdentityScope = "all"
    #: What to do with the entry ids a target reader skips: broker markers, or the chunks of a
    #: chunked message before its last one. ``verified``: ask the target's admin API (one raw-entry
    #: request per skipped id, stopping at a run's first id that is neither a marker nor a chunk it
    #: maps) and ack markers, after the entry before them, and chunks as their source chunks are
    #: acked (with ``position-property`` evidence: each replicated chunk's stamp names its source
    #: chunk; otherwise chunks are never mapped). ``probe``: read a probe subscription
    #: (``cursorsync-probe``) through each target partition and ask its cursor which ids the broker
    #: filtered out of dispatch (one internalStats request per partition and batch, not per id; ids
    #: it cannot answer are checked as with ``verified``); refused where message expiry or backlog
    #: eviction could ack on the probe. ``unacked``: ack none (the target's markDeletePosition then
    #: stops at the first marker). Nothing takes a skipped id for a marker unchecked: a chunk acked
    #: that way would lose its message after a failover.
    holes: Holes = "verified"

    @property
    def claims_holes(self) -> bool:
        """Skipped target ids may be acked, once the target's admin API says they are
        markers."""
        return self.holes != "unacked"

    @model_validator(mode="after")
    def _scope_needs_both(self) -> Self:
        if self.identity_scope == "batched" and not {"position-property", "identity"} <= set(
                self.strategies):
            raise _invalid("identity_scope batched needs both position-property and identity "
                           "in strategies (the property maps the unbatched entries)")
        return self

    @model_validator(mode="after")
    def _identity_needs_publish_time(self) -> Self:
        if "identity" in self.strategies and "publish_time" not in self.identity_fields:
            raise _invalid("identity_fields must include publish_time with identity evidence "
                           "(entries with one digest then share a publish time, which keeps "
                           "what alignment remembers of each producer small)")
        return self

    @field_validator("strategies", "identity_fields")
    @classmethod
    def _no_duplicates(cls, value: list[str]) -> list[str]:
        dupes = sorted({v for v in value if value.count(v) > 1})
        if dupes:
            raise _invalid(f"{', '.join(dupes)} listed more than once")
        return value


class EmissionConfig(_Section):
    """How acks are sent to the target subscriptions."""

    mode: EmissionMode = "cumulative-where-allowed"
    dry_run: bool = False
    subscription_type: SubscriptionType = "Shared"
    ack_batch_size: int = Field(default=1000, ge=1)
    spread_across_executors: bool = False
    rewind_policy: RewindPolicy = "halt"
    #: Cursors the driver plans for the first time per sync batch (after a start, or newly
    #: configured), at most: the others wait for the next batches, in turn. About 0.4 ms
    #: and a target request each, so a start with 100,000 partitions runs batches of a few
    #: seconds, not one of a minute or more.
    first_plans_per_batch: int = Field(default=5_000, ge=1)
    #: Carry partly acked batches: the source's acked batch indexes (read with cursorsync's
    #: broker plugin on the source's brokers) are acked by batch index on the target, whose
    #: brokers keep them only with acknowledgmentAtBatchIndexLevelEnabled on. Off: a partly
    #: acked batch stays unacked on the target, and comes whole after a failover.
    batch_index_acks: bool = False

    @model_validator(mode="after")
    def _batch_index_acks_on_the_driver(self) -> Self:
        if self.batch_index_acks and self.spread_across_executors:
            raise _invalid("batch_index_acks is carried by the driver's emitter only: it "
                           "cannot be combined with spread_across_executors")
        return self

    @property
    def cumulative(self) -> bool:
        """Whether cumulative acks will be used (the broker refuses them on Shared/Key_Shared)."""
        return (
            self.mode == "cumulative-where-allowed"
            and self.subscription_type in CUMULATIVE_TYPES
        )
