"""The identity digest: canonical, unambiguous, blind to broker-added properties."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cursorsync.core.identity import (
    DEFAULT_IDENTITY_FIELDS,
    DIGEST_SIZE,
    IDENTITY_FIELDS,
    REPL_SOURCE_POSITION_PROPERTY,
    MessageIdentity,
    entry_digest,
    message_digest,
    parse_identity_fields,
)
from cursorsync.errors import ConfigError

BASE = MessageIdentity(
    producer_name="prod-a",
    sequence_id=7,
    publish_time=1_700_000_000_000,
    event_time=1_700_000_000_123,
    partition_key="pk",
    ordering_key=b"ok",
    properties={"a": "1", "b": "2"},
    payload=b"hello",
)

CHANGED = {
    "producer_name": "prod-b",
    "sequence_id": 8,
    "publish_time": 1_700_000_000_001,
    "event_time": None,
    "partition_key": "pk2",
    "ordering_key": b"ok2",
    "properties": {"a": "1", "b": "3"},
    "payload": b"hellO",
}


def test_digest_is_16_bytes_and_stable() -> None:
    d = message_digest(BASE, IDENTITY_FIELDS)
    assert len(d) == DIGEST_SIZE
    assert d == message_digest(dataclasses.replace(BASE), IDENTITY_FIELDS)


def test_property_order_does_not_matter() -> None:
    other = dataclasses.replace(BASE, properties={"b": "2", "a": "1"})
    assert message_digest(other) == message_digest(BASE)


def test_field_list_order_does_not_matter() -> None:
    assert message_digest(BASE, ("payload", "producer_name")) == message_digest(
        BASE, ("producer_name", "payload"))


def test_replication_property_and_broker_properties_are_excluded() -> None:
    stamped = dataclasses.replace(
        BASE, properties={**BASE.properties, REPL_SOURCE_POSITION_PROPERTY: "12:34",
                          "__other_broker_prop": "x"})
    assert message_digest(stamped) == message_digest(BASE)


def test_configured_property_name_is_excluded() -> None:
    stamped = dataclasses.replace(BASE, properties={**BASE.properties, "srcpos": "1:2"})
    assert message_digest(stamped) != message_digest(BASE)
    assert message_digest(stamped, excluded_properties=("srcpos",)) == message_digest(BASE)


@pytest.mark.parametrize("name", IDENTITY_FIELDS)
def test_sensitive_to_each_included_field(name: str) -> None:
    changed = dataclasses.replace(BASE, **{name: CHANGED[name]})
    assert message_digest(changed, IDENTITY_FIELDS) != message_digest(BASE, IDENTITY_FIELDS)
    others = tuple(f for f in IDENTITY_FIELDS if f != name)
    assert message_digest(changed, others) == message_digest(BASE, others)


def test_default_fields_leave_out_sequence_id() -> None:
    assert "sequence_id" not in DEFAULT_IDENTITY_FIELDS
    changed = dataclasses.replace(BASE, sequence_id=99)
    assert message_digest(changed) == message_digest(BASE)


def test_encoding_is_unambiguous_across_boundaries() -> None:
    # Length prefixes: moving bytes between adjacent values changes the digest.
    a = MessageIdentity(producer_name="ab", partition_key="c")
    b = MessageIdentity(producer_name="a", partition_key="bc")
    assert message_digest(a) != message_digest(b)
    p1 = dataclasses.replace(BASE, properties={"ab": "c"})
    p2 = dataclasses.replace(BASE, properties={"a": "bc"})
    assert message_digest(p1) != message_digest(p2)
    # Absent differs from empty.
    assert message_digest(MessageIdentity(partition_key=None)) != message_digest(
        MessageIdentity(partition_key=""))


def test_unknown_field_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="colour"):
        parse_identity_fields("payload, colour")
    with pytest.raises(ConfigError, match="empty"):
        parse_identity_fields(" , ")
    assert parse_identity_fields("payload,producer_name") == ("producer_name", "payload")


def test_entry_digest_depends_on_order_and_size() -> None:
    d1 = message_digest(BASE)
    d2 = message_digest(dataclasses.replace(BASE, payload=b"x"))
    assert entry_digest([d1, d2]) != entry_digest([d2, d1])
    assert entry_digest([d1]) != entry_digest([d1, d1])
    assert entry_digest([d1, d2]) == entry_digest([d1, d2])
    with pytest.raises(ValueError):
        entry_digest([b"short"])


@given(st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=6), st.randoms())
def test_properties_permutation_invariance(props: dict[str, str], rnd: object) -> None:
    items = list(props.items())
    rnd.shuffle(items)  # type: ignore[attr-defined]
    a = dataclasses.replace(BASE, properties=props)
    b = dataclasses.replace(BASE, properties=dict(items))
    assert message_digest(a) == message_digest(b)


def test_identity_imports_no_pulsar_or_spark() -> None:
    import cursorsync.core.identity as ident

    src = Path(ident.__file__).read_text()
    assert "import pulsar" not in src and "pyspark" not in src


def test_digest_encoding_is_pinned() -> None:
    # Pending digests outlive a process (builder state) and must match across versions:
    # a change of encoding is a change of this value, and needs a state version bump.
    m = MessageIdentity(producer_name="bulk-0-single", publish_time=1700000000000,
                        event_time=10**12 + 5, partition_key="k5", ordering_key=None,
                        properties={"n": "12345", "__MSG_PROP_REPL_SOURCE_POSITION": "3:4"},
                        payload=b"0/12345 " + b"." * 64)
    assert message_digest(m, DEFAULT_IDENTITY_FIELDS).hex() == "93997a86bec0b61cd07ecd6c3f1206a4"
    assert entry_digest([message_digest(m)] * 2).hex() == "598ec192f67f8530674dd1c5a4769a96"


def _reference_digest(m: MessageIdentity, fields: tuple[str, ...], excluded: str) -> bytes:
    """The encoding as the module docstring states it, written plainly: the oracle of the
    planned Digester."""
    import hashlib
    import struct

    def lp(b: bytes) -> bytes:
        return struct.pack(">Q", len(b)) + b

    out = b""
    for tag, name in enumerate(IDENTITY_FIELDS, start=1):
        if name not in fields:
            continue
        out += bytes([tag])
        value = getattr(m, name)
        if name == "properties":
            kept = sorted((k.encode(), v.encode()) for k, v in value.items()
                          if not k.startswith("__") and k != excluded)
            out += b"\x01" + struct.pack(">Q", len(kept)) + b"".join(lp(k) + lp(v)
                                                                     for k, v in kept)
        elif value is None:
            out += b"\x00"
        elif isinstance(value, int):
            out += b"\x01" + struct.pack(">q", value)
        else:
            out += b"\x01" + lp(value.encode() if isinstance(value, str) else bytes(value))
    return hashlib.blake2b(out, digest_size=16, person=b"cursorsync.msg1").digest()


_opt_text = st.none() | st.text(max_size=6)
_opt_int = st.none() | st.integers(min_value=-(2**63), max_value=2**63 - 1)


@given(
    m=st.builds(MessageIdentity, producer_name=_opt_text, sequence_id=_opt_int,
                publish_time=_opt_int, event_time=_opt_int, partition_key=_opt_text,
                ordering_key=st.none() | st.binary(max_size=4),
                properties=st.dictionaries(st.sampled_from(["a", "b", "__x", "skip", "é"]),
                                           st.text(max_size=3)),
                payload=st.binary(max_size=8)),
    fields=st.sets(st.sampled_from(IDENTITY_FIELDS), min_size=1),
)
def test_digest_matches_the_plain_encoding(m: MessageIdentity, fields: set[str]) -> None:
    chosen = tuple(sorted(fields))
    assert (message_digest(m, chosen, excluded_properties=("skip",))
            == _reference_digest(m, chosen, "skip"))
