"""Which (topic, subscription) pairs to sync: named topics and namespace patterns, each with
its own subscriptions.

The configuration's ``topics`` and ``namespaces`` become one :class:`Selection`, passed to
both data sources as one JSON option, so the mapping reads exactly the topics it names
and the sync polls exactly the pairs it names: a subscription listed for one topic is
never synced on another.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from cursorsync.errors import ConfigError
from cursorsync.pulsar.admin import AdminClient
from cursorsync.pulsar.topics import TopicName

#: A subscription entry that means "every subscription of the topic".
EVERY = "*"


@dataclass(frozen=True)
class TopicRule:
    """One topic (all its partitions, or the one a ``-partition-N`` suffix names)."""

    topic: str
    subscriptions: tuple[str, ...]


@dataclass(frozen=True)
class NamespaceRule:
    """Every topic of ``namespace`` whose local name (partition suffix aside) fully matches
    ``regex``."""

    namespace: str
    regex: str
    subscriptions: tuple[str, ...]

    def matches(self, topic: TopicName) -> bool:
        return (f"{topic.tenant}/{topic.namespace}" == self.namespace
                and re.fullmatch(self.regex, topic.base.local) is not None)


@dataclass(frozen=True)
class Selection:
    """Topic rules and namespace rules; a topic's subscriptions are the union of the
    subscriptions of every rule that covers it."""

    topics: tuple[TopicRule, ...] = ()
    namespaces: tuple[NamespaceRule, ...] = ()

    def __post_init__(self) -> None:
        if not self.topics and not self.namespaces:
            raise ConfigError("the selection names no topic and no namespace")
        rules: list[TopicRule | NamespaceRule] = [*self.topics, *self.namespaces]
        for rule in rules:
            if not rule.subscriptions:
                raise ConfigError(f"{rule} names no subscription")
        for t in self.topics:
            TopicName.parse(t.topic)
        for n in self.namespaces:
            try:
                re.compile(n.regex)
            except re.error as e:
                raise ConfigError(f"namespace {n.namespace}: {n.regex!r} is not a valid "
                                  f"regex: {e}") from e

    def subscriptions_of(self, topic: str) -> tuple[str, ...]:
        """The subscriptions to sync on ``topic`` (a partition or a whole topic), sorted;
        ``("*",)`` when a rule says every one."""
        name = TopicName.parse(topic)
        subs: set[str] = set()
        for t in self.topics:
            rule = TopicName.parse(t.topic)
            if rule == name or (rule.partition < 0 and rule == name.base):
                subs.update(t.subscriptions)
        for n in self.namespaces:
            if n.matches(name):
                subs.update(n.subscriptions)
        return (EVERY,) if EVERY in subs else tuple(sorted(subs))

    def namespace_names(self) -> list[str]:
        """The namespaces (tenant/namespace) its rules cover, sorted."""
        named = {f"{t.tenant}/{t.namespace}" for t in (TopicName.parse(r.topic)
                                                       for r in self.topics)}
        return sorted(named | {n.namespace for n in self.namespaces})

    def expand(self, admin: AdminClient) -> list[TopicName]:
        """The concrete topic partitions the selection covers now (partitioned topics from
        their metadata, namespaces from their topic lists)."""
        out = set(admin.expand_topics(t.topic for t in self.topics))
        for n in self.namespaces:
            out.update(admin.expand_topics((), namespace=n.namespace, pattern=n.regex))
        return sorted(out)

    # -- as a data-source option

    def to_option(self) -> str:
        """The ``selection`` option's JSON text."""
        return json.dumps({
            "topics": [{"topic": t.topic, "subscriptions": list(t.subscriptions)}
                       for t in self.topics],
            "namespaces": [{"namespace": n.namespace, "regex": n.regex,
                            "subscriptions": list(n.subscriptions)} for n in self.namespaces],
        }, sort_keys=True)

    @classmethod
    def from_option(cls, text: str) -> Selection:
        """Parse the ``selection`` option; errors name the option."""
        try:
            data = json.loads(text)
            return cls(
                tuple(TopicRule(t["topic"], tuple(t["subscriptions"]))
                      for t in data.get("topics", ())),
                tuple(NamespaceRule(n["namespace"], n.get("regex", ".*"),
                                    tuple(n["subscriptions"]))
                      for n in data.get("namespaces", ())))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"option selection: {text!r} is not a selection ({e})") from e

    @classmethod
    def of(cls, topics: Iterable[str] = (), *, namespace: str | None = None,
           pattern: str | None = None, subscriptions: Iterable[str] = (EVERY,)) -> Selection:
        """The same subscriptions on some topics and/or one namespace pattern."""
        subs = tuple(subscriptions)
        return cls(tuple(TopicRule(t, subs) for t in topics),
                   (NamespaceRule(namespace, pattern or ".*", subs),) if namespace else ())
