"""What every settings module shares: the literal types, the URL marker, the section base."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticCustomError

from cursorsync.core.identity import REPL_SOURCE_POSITION_PROPERTY

#: The URL marker meaning "the embedded test bed fills this in at runtime".
EMBEDDED = "embedded"

#: The config ``cursorsync-dev demo`` uses: package data (conf/embedded.yaml in the source tree).
EMBEDDED_CONFIG_PATH = Path(__file__).with_name("embedded.yaml")

#: The property recent brokers stamp on replicated entries ("ledgerId:entryId" of the source).
DEFAULT_SOURCE_POSITION_PROPERTY = REPL_SOURCE_POSITION_PROPERTY

EvidenceStrategy = Literal["position-property", "identity", "snapshot"]
IdentityScope = Literal["all", "batched"]
Holes = Literal["verified", "probe", "unacked"]
IdentityField = Literal[
    "producer_name",
    "publish_time",
    "event_time",
    "partition_key",
    "ordering_key",
    "properties",
    "payload",
]
EmissionMode = Literal["cumulative-where-allowed", "individual"]
TableBackend = Literal["delta-rs", "delta-spark"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]

#: A key path inside the config: section and field names, list indexes.
Loc = tuple[str | int, ...]


_TOPIC_RE = re.compile(r"persistent://[^/\s]+/[^/\s]+/[^/\s]+")
_NAMESPACE_RE = re.compile(r"[^/\s]+/[^/\s]+")
_SERVICE_SCHEMES = ("pulsar://", "pulsar+ssl://")
_ADMIN_SCHEMES = ("http://", "https://")
_REPLICATOR_PREFIX = "pulsar.repl."
_PARTITION_SUFFIX_RE = re.compile(r"-partition-\d+$")


def _invalid(message: str) -> PydanticCustomError:
    """A validation error whose message is shown to the user verbatim."""
    return PydanticCustomError("cursorsync", message)


class _Section(BaseModel):
    """Base of every section: immutable, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)
