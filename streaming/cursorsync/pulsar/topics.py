"""Pulsar topic names: parsing, partition suffixes and admin REST paths."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import quote

from cursorsync.errors import ConfigError

PARTITION_SUFFIX = "-partition-"
_PARTITION_RE = re.compile(r"^(.*)-partition-(\d+)$")
_SEGMENT_RE = re.compile(r"^[^/\s]+$")


@dataclass(frozen=True, order=True)
class TopicName:
    """A persistent topic: tenant/namespace/local name; the local name may end in -partition-i."""

    tenant: str
    namespace: str
    local: str

    @classmethod
    def parse(cls, text: str) -> TopicName:
        """Accept ``persistent://t/ns/x``, ``t/ns/x`` or a short ``x`` (public/default).

        Raises ConfigError naming the text for anything else (non-persistent
        topics have no cursors to synchronise).
        """
        raw = text.strip()
        rest = raw
        if "://" in raw:
            scheme, rest = raw.split("://", 1)
            if scheme != "persistent":
                raise ConfigError(
                    f"topic {text!r}: only persistent:// topics are supported, got {scheme}://"
                )
        parts = rest.split("/")
        if len(parts) == 1 and "://" not in raw:
            parts = ["public", "default", parts[0]]
        if len(parts) != 3 or not all(_SEGMENT_RE.match(p) for p in parts):
            raise ConfigError(
                f"topic {text!r} is not a topic name; expected persistent://tenant/namespace/topic"
            )
        return cls(parts[0], parts[1], parts[2])

    @property
    def partition(self) -> int:
        """The partition index from a ``-partition-i`` suffix, or -1."""
        m = _PARTITION_RE.match(self.local)
        return int(m.group(2)) if m else -1

    @property
    def base(self) -> TopicName:
        """The partitioned topic this partition belongs to (itself when not a partition)."""
        m = _PARTITION_RE.match(self.local)
        return TopicName(self.tenant, self.namespace, m.group(1)) if m else self

    def with_partition(self, index: int) -> TopicName:
        return TopicName(self.tenant, self.namespace, f"{self.local}{PARTITION_SUFFIX}{index}")

    def admin_path(self, suffix: str = "") -> str:
        """``/admin/v2/persistent/{tenant}/{namespace}/{topic}[/suffix]``, each part URL-encoded."""
        segs = [quote(p, safe="") for p in (self.tenant, self.namespace, self.local)]
        path = "/admin/v2/persistent/" + "/".join(segs)
        return f"{path}/{suffix}" if suffix else path

    def __str__(self) -> str:
        return f"persistent://{self.tenant}/{self.namespace}/{self.local}"


def parse_namespace(text: str) -> tuple[str, str]:
    """``tenant/namespace`` -> (tenant, namespace); ConfigError otherwise."""
    parts = text.strip().split("/")
    if len(parts) != 2 or not all(_SEGMENT_RE.match(p) for p in parts):
        raise ConfigError(f"namespace {text!r} is not tenant/namespace")
    return parts[0], parts[1]


def namespaces_of(topics: Iterable[str]) -> list[str]:
    """The ``tenant/namespace`` of each topic name, each once, in order."""
    return sorted({f"{t.tenant}/{t.namespace}" for t in map(TopicName.parse, topics)})


def namespace_admin_path(namespace: str, suffix: str = "") -> str:
    tenant, ns = parse_namespace(namespace)
    path = f"/admin/v2/persistent/{quote(tenant, safe='')}/{quote(ns, safe='')}"
    return f"{path}/{suffix}" if suffix else path
