"""Fuzzing the parsers of outside input: range and position text, message-id bytes,
internalStats JSON and config files. Valid input round-trips; malformed input raises the one
documented error, which names what is wrong and where."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cursorsync.app.settings import (
    ConfigValidationError,
    load_config,
    load_config_text,
)
from cursorsync.app.settings.messages import format_loc
from cursorsync.core.positions import (
    Position,
    format_range_bounds,
    parse_range_bounds,
)
from cursorsync.core.ranges import RangeSet
from cursorsync.errors import ConfigError, MalformedAdminOutputError, PositionFormatError
from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.msgid import batch_size_of, fields, first_chunk_of
from cursorsync.pulsar.stats import (
    parse_internal_stats,
    parse_json,
    parse_partitioned_internal_stats,
)
from cursorsync.pulsar.topics import TopicName
from tests.support.admin_stub import Reply, StubAdmin

FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

INT64 = st.integers(-(2**63), 2**63 - 1)
OUT_OF_INT64 = st.one_of(st.integers(max_value=-(2**63) - 1), st.integers(min_value=2**63))
WS = st.sampled_from(["", " ", "  ", "\t", "\n"])


# ------------------------------------------------------------------------ positions, ranges


def check_position_error(err: PositionFormatError, text: str) -> None:
    """The error names an offset inside the text, what was expected there, and the text."""
    assert 0 <= err.offset <= len(text), (err.offset, text)
    assert err.expected and err.expected != "a range list"
    message = str(err)
    assert f"offset {err.offset}" in message
    assert err.expected in message
    assert repr(text[err.offset:err.offset + 12]) in message


@FUZZ
@given(INT64, INT64, WS, WS, WS, WS)
def test_position_round_trip(ledger: int, entry: int, a: str, b: str, c: str, d: str) -> None:
    p = Position(ledger, entry)
    assert Position.parse(str(p)) == p
    assert Position.parse(f"{a}{ledger}{b}:{c}{entry}{d}") == p


@FUZZ
@given(st.one_of(st.text(max_size=40), st.text(alphabet="0123456789-: x\t", max_size=30)))
def test_position_random_text(text: str) -> None:
    try:
        p = Position.parse(text)
    except PositionFormatError as err:
        check_position_error(err, text)
    else:
        assert Position.parse(str(p)) == p


@FUZZ
@given(INT64, INT64, st.data())
def test_position_single_change_is_located_at_or_before_it(ledger: int, entry: int,
                                                            data: st.DataObject) -> None:
    text = str(Position(ledger, entry))
    k = data.draw(st.integers(0, len(text)), label="k")
    bad = data.draw(st.sampled_from(["x", ".", ",", "(", "]", ":", "-", ""]), label="bad")
    mutated = text[:k] + bad + text[k + 1:]
    try:
        Position.parse(mutated)
    except PositionFormatError as err:
        check_position_error(err, mutated)
        assert err.offset <= max(k, len(mutated))


@FUZZ
@given(OUT_OF_INT64, INT64, st.booleans())
def test_position_out_of_int64_names_the_id(big: int, other: int, ledger_side: bool) -> None:
    text = f"{big}:{other}" if ledger_side else f"{other}:{big}"
    with pytest.raises(PositionFormatError) as info:
        Position.parse(text)
    check_position_error(info.value, text)
    assert info.value.offset == text.index(str(big), 0 if ledger_side else len(str(other)))
    assert "64-bit" in info.value.expected


def test_position_with_thousands_of_digits_is_a_format_error() -> None:
    text = "1:" + "9" * 5000
    with pytest.raises(PositionFormatError) as info:
        Position.parse(text)
    assert info.value.offset == 2
    with pytest.raises(PositionFormatError) as info:
        parse_range_bounds(f"[(1:1..1:2],(1:{'9' * 5000}..2:1]]")
    assert info.value.offset == 15


rows_strategy = st.lists(st.tuples(INT64, INT64, INT64, INT64), max_size=12)


@st.composite
def spelled_ranges(draw: st.DrawFn) -> tuple[np.ndarray, str]:
    """Bounds and one of the spellings the parser accepts for them."""
    rows = draw(rows_strategy)
    parts = []
    for a, b, c, d in rows:
        sep = draw(st.sampled_from(["..", "‥", "…"]))
        w = [draw(WS) for _ in range(8)]
        parts.append(f"({w[0]}{a}{w[1]}:{w[2]}{b}{w[3]}{sep}{w[4]}{c}:{w[5]}{d}{w[6]}]")
    comma = draw(st.sampled_from([",", ", ", " , "]))
    text = draw(WS) + "[" + draw(WS) + comma.join(parts) + draw(WS) + "]" + draw(WS)
    return np.array(rows, dtype=np.int64).reshape(-1, 4), text


@FUZZ
@given(spelled_ranges())
def test_range_bounds_round_trip(spelled: tuple[np.ndarray, str]) -> None:
    bounds, text = spelled
    parsed = parse_range_bounds(text)
    assert parsed.dtype == np.int64 and parsed.shape == bounds.shape
    assert (parsed == bounds).all()
    canonical = format_range_bounds(parsed)
    assert (parse_range_bounds(canonical) == bounds).all()


RANGE_ALPHABET = "[]():.,-‥ 0123456789"


@FUZZ
@given(st.one_of(st.text(max_size=60), st.text(alphabet=RANGE_ALPHABET, max_size=60)))
def test_range_random_text(text: str) -> None:
    try:
        bounds = parse_range_bounds(text)
    except PositionFormatError as err:
        check_position_error(err, text)
    else:
        assert (parse_range_bounds(format_range_bounds(bounds)) == bounds).all()


@FUZZ
@given(rows_strategy.filter(bool), st.data())
def test_range_truncated_or_changed_text_is_located(rows: list[tuple[int, ...]],
                                                    data: st.DataObject) -> None:
    text = format_range_bounds(np.array(rows, dtype=np.int64))
    k = data.draw(st.integers(0, len(text) - 1), label="k")
    bad = data.draw(st.sampled_from(["", "x", "(", ")", "]", "[", ",", ";", ":", "."]),
                    label="bad")
    truncate = data.draw(st.booleans(), label="truncate")
    mutated = text[:k] if truncate else text[:k] + bad + text[k + 1:]
    try:
        parse_range_bounds(mutated)
    except PositionFormatError as err:
        check_position_error(err, mutated)
        assert not truncate or err.offset <= len(mutated)
    else:
        assert not truncate


@FUZZ
@given(rows_strategy.filter(bool), OUT_OF_INT64, st.data())
def test_range_out_of_int64_names_the_id(rows: list[tuple[int, ...]], big: int,
                                         data: st.DataObject) -> None:
    i = data.draw(st.integers(0, len(rows) - 1), label="row")
    j = data.draw(st.integers(0, 3), label="column")
    cells = [list(map(str, r)) for r in rows]
    cells[i][j] = str(big)
    text = "[" + ",".join(f"({a}:{b}..{c}:{d}]" for a, b, c, d in cells) + "]"
    with pytest.raises(PositionFormatError) as info:
        parse_range_bounds(text)
    check_position_error(info.value, text)
    assert text[info.value.offset:].startswith(str(big))


@FUZZ
@given(st.one_of(st.text(max_size=60), st.text(alphabet=RANGE_ALPHABET, max_size=60)))
def test_rangeset_parse_raises_only_value_errors(text: str) -> None:
    """What callers of RangeSet.parse catch (stats.parse_cursor): ValueError, mostly the
    PositionFormatError subclass."""
    try:
        RangeSet.parse(text)
    except PositionFormatError as err:
        check_position_error(err, text)
    except ValueError as err:
        assert re.search(r"-?\d+", str(err))


# ------------------------------------------------------------------------ message-id bytes


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def message_id_fields(ledger: int, entry: int, partition: int, batch_index: int,
                      batch_size: int | None, first_chunk: tuple[int, int] | None,
                      ) -> list[bytes]:
    """MessageIdData's fields as the client writes them, one bytes chunk each."""
    out = [varint(1 << 3) + varint(ledger), varint(2 << 3) + varint(entry),
           varint(3 << 3) + varint(partition), varint(4 << 3) + varint(batch_index)]
    if batch_size is not None:
        out.append(varint(6 << 3) + varint(batch_size))
    if first_chunk is not None:
        nested = varint(1 << 3) + varint(first_chunk[0]) + varint(2 << 3) + varint(first_chunk[1])
        out.append(varint(7 << 3 | 2) + varint(len(nested)) + nested)
    return out


class FakeId:
    """What batch_size_of and first_chunk_of use of a client MessageId."""

    def __init__(self, data: bytes, batch_index: int = 0) -> None:
        self._data = data
        self._batch_index = batch_index

    def batch_index(self) -> int:
        return self._batch_index

    def serialize(self) -> bytes:
        return self._data


U63 = st.integers(0, 2**63 - 1)
message_ids = st.tuples(U63, U63, st.integers(-1, 2**31 - 1), st.integers(-1, 2**31 - 1),
                        st.none() | st.integers(0, 2**31 - 1),
                        st.none() | st.tuples(U63, U63))


@FUZZ
@given(message_ids)
def test_message_id_round_trip(mid: tuple[Any, ...]) -> None:
    ledger, entry, partition, batch_index, batch_size, first_chunk = mid
    data = b"".join(message_id_fields(*mid))
    got = list(fields(data))
    assert got[:4] == [(1, ledger), (2, entry), (3, partition % 2**64),
                       (4, batch_index % 2**64)]
    fake = FakeId(data, batch_index)
    expected_size = 1 if batch_index < 0 else (batch_size or None)
    assert batch_size_of(fake) == expected_size
    assert first_chunk_of(fake) == first_chunk


@FUZZ
@given(U63, U63, st.integers(-1, 2**31 - 1), st.integers(-1, 2**31 - 1))
def test_message_id_of_the_client_parses(ledger: int, entry: int, partition: int,
                                         batch_index: int) -> None:
    pulsar = pytest.importorskip("pulsar")
    data = bytes(pulsar.MessageId(partition, ledger, entry, batch_index).serialize())
    got = dict(fields(data))
    assert (got[1], got[2]) == (ledger, entry)
    assert first_chunk_of(FakeId(data)) is None


def check_msgid_error(err: ValueError, data: bytes) -> None:
    match = re.search(r"at byte (\d+)", str(err))
    assert match, str(err)
    assert 0 <= int(match.group(1)) <= len(data)


@FUZZ
@given(st.binary(max_size=64))
def test_message_id_random_bytes(data: bytes) -> None:
    try:
        parsed = list(fields(data))
    except ValueError as err:
        check_msgid_error(err, data)
    else:
        assert all(isinstance(v, int | bytes) for _, v in parsed)
    for batch_index in (-1, 0, 3):
        size = batch_size_of(FakeId(data, batch_index))
        assert size is None or (isinstance(size, int) and size > 0)
    chunk = first_chunk_of(FakeId(data))
    assert chunk is None or all(isinstance(x, int) for x in chunk)


@FUZZ
@given(message_ids, st.data())
def test_message_id_truncated_inside_a_field(mid: tuple[Any, ...], data: st.DataObject) -> None:
    chunks = message_id_fields(*mid)
    whole = b"".join(chunks)
    ends = {sum(len(c) for c in chunks[:i]) for i in range(len(chunks) + 1)}
    cut = data.draw(st.integers(1, len(whole) - 1).filter(lambda n: n not in ends), label="cut")
    with pytest.raises(ValueError) as info:
        list(fields(whole[:cut]))
    check_msgid_error(info.value, whole[:cut])


def test_message_id_malformed_examples_name_the_byte() -> None:
    for data, where in [(b"\x08\x96", "at byte 1"), (b"\x08\x01\x0b", "at byte 2"),
                        (b"\x08\x01\x12\x05ab", "at byte 2"), (b"\x09\x00", "at byte 0"),
                        (b"\x08" + b"\xff" * 11, "at byte 1")]:
        with pytest.raises(ValueError, match=where):
            list(fields(data))


# ------------------------------------------------------------------------ internalStats JSON


TOPIC = TopicName.parse("persistent://acme/orders/events-partition-0")
IDS = st.integers(0, 2**62)


@st.composite
def range_text(draw: st.DrawFn) -> str:
    ledger = draw(IDS)
    starts = sorted(draw(st.sets(st.integers(-1, 10_000), max_size=5)))
    rows = [(ledger, s, ledger, s + draw(st.integers(1, 3))) for s in starts]
    return format_range_bounds(np.array(rows, dtype=np.int64).reshape(-1, 4))


@st.composite
def cursor_docs(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "markDeletePosition": str(Position(draw(IDS), draw(st.integers(-1, 2**62)))),
        "individuallyDeletedMessages": draw(range_text()),
        "messagesConsumedCounter": draw(st.integers(0, 2**62)),
    }
    if draw(st.booleans()):
        doc["readPosition"] = str(Position(draw(IDS), draw(st.integers(0, 2**62))))
    if draw(st.booleans()):
        doc["properties"] = draw(st.dictionaries(st.text(max_size=8), st.integers(0, 9),
                                                 max_size=2))
    return doc


@st.composite
def internal_stats_docs(draw: st.DrawFn) -> dict[str, Any]:
    ids = sorted(draw(st.sets(IDS, min_size=0, max_size=5)))
    ledgers = [{"ledgerId": i, "entries": draw(st.integers(0, 10**6)), "size": 0}
               for i in ids]
    if ledgers:
        ledgers[-1]["entries"] = 0
    pick_listed = bool(ids) and draw(st.booleans())
    lce_ledger = draw(st.sampled_from(ids)) if pick_listed else draw(IDS)
    names = draw(st.sets(st.sampled_from(["orders-svc", "audit", "a b", "pulsar.repl.b",
                                          "pulsar.repl.c"]), max_size=4))
    return {
        "entriesAddedCounter": draw(st.integers(0, 2**62)),
        "currentLedgerEntries": draw(st.integers(0, 10**6)),
        "lastConfirmedEntry": str(Position(lce_ledger, draw(st.integers(-1, 10**6)))),
        "state": draw(st.sampled_from(["LedgerOpened", "ClosedLedger"])),
        "ledgers": draw(st.permutations(ledgers)),
        "cursors": {n: draw(cursor_docs()) for n in sorted(names)},
    }


@FUZZ
@given(internal_stats_docs())
def test_internal_stats_from_json_have_the_fields(doc: dict[str, Any]) -> None:
    stats = parse_internal_stats(TOPIC, parse_json("internalStats", json.dumps(doc).encode()))
    lce = Position.parse(doc["lastConfirmedEntry"])
    assert stats.last_confirmed_entry == lce
    assert stats.entries_added_counter == doc["entriesAddedCounter"]
    rows = sorted((r["ledgerId"], r["entries"]) for r in doc["ledgers"])
    if rows:
        live = lce.entry + 1 if lce.ledger == rows[-1][0] else doc["currentLedgerEntries"]
        rows[-1] = (rows[-1][0], max(rows[-1][1], live))
    assert stats.ledgers.ids.tolist() == [r[0] for r in rows]
    assert stats.ledgers.entries.tolist() == [r[1] for r in rows]
    assert set(stats.subscriptions) | set(stats.replicators) == set(doc["cursors"])
    assert all(n.startswith("pulsar.repl.") for n in stats.replicators)
    for name, cs in {**stats.subscriptions, **stats.replicators}.items():
        cdoc = doc["cursors"][name]
        assert cs.state.mark_delete == Position.parse(cdoc["markDeletePosition"])
        assert cs.state.individually_deleted == RangeSet.parse(cdoc["individuallyDeletedMessages"])
        assert cs.individually_deleted_text == cdoc["individuallyDeletedMessages"]
        assert cs.messages_consumed_counter == cdoc["messagesConsumedCounter"]
        assert cs.read_position == (Position.parse(cdoc["readPosition"])
                                    if "readPosition" in cdoc else None)
        assert cs.properties == cdoc.get("properties", {})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=3),
    max_leaves=6,
)

#: Numbers a Java long field must not hold, and wrong types.
bad_numbers = st.sampled_from([-1, -(2**63) - 1, 2**63, 2**64, 10**30, 1.5, True, "7", None])


def paths(doc: Any, prefix: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    """Every key path inside a JSON document."""
    items = (doc.items() if isinstance(doc, dict)
             else enumerate(doc) if isinstance(doc, list) else ())
    for k, v in items:
        yield (*prefix, k)
        yield from paths(v, (*prefix, k))


def set_path(doc: Any, path: tuple[str | int, ...], value: Any, delete: bool = False) -> None:
    node = doc
    for part in path[:-1]:
        node = node[part]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value


def _get(doc: Any, path: tuple[str | int, ...]) -> Any:
    """The value at a key path."""
    for part in path:
        doc = doc[part]
    return doc


def render(path: tuple[str | int, ...]) -> str:
    return format_loc(path)


def check_admin_error(err: MalformedAdminOutputError, path: tuple[str | int, ...]) -> None:
    """The error names the topic and the field, down to the part of ``path`` it reads."""
    message = str(err)
    assert str(TOPIC) in message, message
    assert "\n" not in message
    prefixes = [render(path[:k]) for k in range(len(path), 0, -1)]
    assert any(p in message for p in prefixes), (path, message)


@FUZZ
@given(internal_stats_docs(), st.data())
def test_internal_stats_mutated_raise_malformed_naming_the_field(
        doc: dict[str, Any], data: st.DataObject) -> None:
    all_paths = list(paths(doc))
    assume(all_paths)
    path = data.draw(st.sampled_from(all_paths), label="path")
    action = data.draw(st.sampled_from(["type", "number", "delete"]), label="action")
    mutated = copy.deepcopy(doc)
    if action == "delete":
        set_path(mutated, path, None, delete=True)
    else:
        value = data.draw(json_values if action == "type" else bad_numbers, label="value")
        set_path(mutated, path, value)
    text = json.dumps(mutated)
    try:
        parse_internal_stats(TOPIC, parse_json("internalStats", text))
    except MalformedAdminOutputError as err:
        check_admin_error(err, path)


READ_FIELDS = {"lastConfirmedEntry", "ledgers", "ledgerId", "entries", "currentLedgerEntries",
               "entriesAddedCounter", "cursors", "markDeletePosition",
               "individuallyDeletedMessages", "readPosition", "messagesConsumedCounter",
               "properties", "state"}


@FUZZ
@given(internal_stats_docs(), st.data())
def test_internal_stats_wrong_type_in_a_read_field_is_named_exactly(
        doc: dict[str, Any], data: st.DataObject) -> None:
    lce = Position.parse(doc["lastConfirmedEntry"])
    reads_current = bool(doc["ledgers"]) and lce.ledger != max(
        r["ledgerId"] for r in doc["ledgers"])
    read = [p for p in paths(doc) if p[-1] in READ_FIELDS and not (
        len(p) == 2 and p[0] == "cursors") and (reads_current or p != ("currentLedgerEntries",))]
    assume(read)
    path = data.draw(st.sampled_from(read), label="path")
    value = data.draw(st.sampled_from([[], {}, 1.5, True, [1], {"a": 1}, "x:y", 2**64]),
                      label="value")
    current = _get(doc, path)
    assume(type(value) is not type(current) and not (value == {} and path[-1] == "properties"))
    mutated = copy.deepcopy(doc)
    set_path(mutated, path, value)
    with pytest.raises(MalformedAdminOutputError) as info:
        parse_internal_stats(TOPIC, mutated)
    assert render(path) in str(info.value), (path, str(info.value))


@FUZZ
@given(st.one_of(st.binary(max_size=80), st.text(max_size=80).map(str.encode),
                 json_values.map(lambda v: json.dumps(v).encode())))
def test_internal_stats_random_bodies(body: bytes) -> None:
    try:
        doc = parse_json("internalStats of t", body)
    except MalformedAdminOutputError as err:
        assert "internalStats of t" in str(err)
        return
    try:
        parse_internal_stats(TOPIC, doc)
    except MalformedAdminOutputError as err:
        assert str(TOPIC) in str(err)


def test_deeply_nested_json_is_malformed_not_a_recursion_error() -> None:
    with pytest.raises(MalformedAdminOutputError, match="internalStats of t"):
        parse_json("internalStats of t", b"[" * 100_000)


@FUZZ
@given(st.dictionaries(st.text(max_size=30), json_values, max_size=3),
       st.one_of(json_values, st.fixed_dictionaries({"partitions": json_values})))
def test_partitioned_internal_stats_random_shapes(parts: dict[str, Any], meta: Any) -> None:
    base = "persistent://acme/orders/events"
    try:
        parse_partitioned_internal_stats(base, {"metadata": meta, "partitions": parts})
    except MalformedAdminOutputError as err:
        assert base in str(err) or any(k and k in str(err) for k in parts), str(err)


@pytest.fixture(scope="module")
def stub() -> Iterator[StubAdmin]:
    s = StubAdmin().start()
    yield s
    s.stop()


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=60),
                 internal_stats_docs().map(lambda d: json.dumps(d)[:-3].encode()),
                 json_values.map(lambda v: json.dumps(v).encode())))
def test_admin_client_turns_malformed_bodies_into_one_error(stub: StubAdmin, body: bytes) -> None:
    stub.set(TOPIC.admin_path("internalStats"), Reply(200, raw=body))
    with AdminClient(AdminSettings.from_urls(stub.url, attempts=1)) as client:
        try:
            client.internal_stats(TOPIC)
        except MalformedAdminOutputError as err:
            assert str(TOPIC) in str(err)


# ------------------------------------------------------------------------ config files

MINIMAL: dict[str, Any] = {
    "clusters": {
        "source": {"name": "A", "service_url": "pulsar://127.0.0.1:6650",
                   "admin_url": "http://127.0.0.1:8080"},
        "target": {"name": "B", "service_url": "pulsar://127.0.0.1:6651",
                   "admin_url": "http://127.0.0.1:8081"},
    },
    "topics": [{"topic": "persistent://t/ns/orders", "subscriptions": ["billing", "audit"]}],
    "emission": {"mode": "individual"},
    "tables": {"path": "/tmp/cursorsync/tables"},
    "spark": {"checkpoint_dir": "/tmp/cursorsync/checkpoints", "trigger_interval_s": 5.0},
}

#: Text PyYAML writes and reads back unchanged (it folds NEL and the Unicode line breaks).
yaml_chars = st.characters(exclude_categories=["Cs"],
                           exclude_characters="\x85\u2028\u2029\ufeff")
names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=12)
hosts = st.from_regex(r"[a-z][a-z0-9.-]{0,15}", fullmatch=True)


@st.composite
def valid_configs(draw: st.DrawFn) -> dict[str, Any]:
    source, target = draw(st.lists(names, min_size=2, max_size=2, unique=True))
    topics = draw(st.lists(names, min_size=1, max_size=3, unique=True))
    return {
        "clusters": {
            role: {"name": name,
                   "service_url": f"{draw(st.sampled_from(['pulsar', 'pulsar+ssl']))}://"
                                  f"{draw(hosts)}:{draw(st.integers(1, 65535))}",
                   "admin_url": f"{draw(st.sampled_from(['http', 'https']))}://{draw(hosts)}",
                   "max_concurrency": draw(st.integers(1, 1024)),
                   "request_timeout_s": draw(st.floats(0.001, 1e6)),
                   }
            for role, name in (("source", source), ("target", target))
        },
        "topics": [{"topic": f"persistent://t/ns/{t}",
                    "subscriptions": draw(st.lists(
                        names.filter(lambda n: not n.startswith(("cursorsync-mapping",
                                                                 "pulsar.repl."))),
                        min_size=1, max_size=3, unique=True))}
                   for t in topics],
        "tables": {"path": draw(st.text(yaml_chars, min_size=1, max_size=20).filter(
            lambda s: "$" not in s))},
        "spark": {"checkpoint_dir": "/tmp/c", "trigger_interval_s": draw(st.floats(0.01, 1e4))},
    }


@FUZZ
@given(valid_configs())
def test_config_round_trip(data: dict[str, Any]) -> None:
    cfg = load_config_text(yaml.safe_dump(data, allow_unicode=True), source="c.yaml")
    for role in ("source", "target"):
        got = getattr(cfg.clusters, role)
        want = data["clusters"][role]
        assert (got.name, got.service_url, got.max_concurrency, got.request_timeout_s) == (
            want["name"], want["service_url"], want["max_concurrency"],
            want["request_timeout_s"])
        assert got.admin_url == want["admin_url"].rstrip("/")
    assert [(t.topic, t.subscriptions) for t in cfg.topics] == [
        (t["topic"], t["subscriptions"]) for t in data["topics"]]
    assert cfg.tables.path == data["tables"]["path"]
    assert cfg.spark.trigger_interval_s == data["spark"]["trigger_interval_s"]


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(yaml_chars, max_size=10)
    | st.sampled_from(["${CURSORSYNC_FUZZ_UNSET}", "embedded", "-1"]),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(yaml_chars, max_size=6), inner, max_size=3),
    max_leaves=5,
)
yaml_keys = st.one_of(st.text(yaml_chars, max_size=10), st.integers(), st.booleans(), st.none())


def check_config_error(err: ConfigError, path: tuple[str | int, ...] | None) -> list[str]:
    """The error names the file; a validation error names each problem's key path and line.
    Returns the problem lines."""
    message = str(err)
    assert "c.yaml" in message, message
    if not isinstance(err, ConfigValidationError):
        return []
    assert err.problems
    for problem in err.problems:
        assert re.search(r" \(line \d+\)$", problem), problem
    if path is None:
        return list(err.problems)
    named = re.compile("|".join(re.escape(render(path[:k])) + r"[:.\[]"
                                for k in range(len(path), 0, -1)) or "$^")
    assert any(named.match(p) or p.startswith("(top level):")
               for p in err.problems), (path, err.problems)
    return list(err.problems)


@FUZZ
@given(st.data())
def test_config_mutated_raises_config_error_naming_the_key(data: st.DataObject) -> None:
    doc = copy.deepcopy(MINIMAL)
    path = data.draw(st.sampled_from(list(paths(doc))), label="path")
    action = data.draw(st.sampled_from(["type", "delete", "unknown", "nest"]), label="action")
    unknown: tuple[str | int, ...] | None = None
    if action == "type":
        set_path(doc, path, data.draw(yaml_values, label="value"))
    elif action == "delete":
        set_path(doc, path, None, delete=True)
    elif action == "nest":
        current = _get(doc, path)
        set_path(doc, path, data.draw(st.sampled_from([[current], {"x": current}]), label="nest"))
    else:
        mappings = [()] + [p for p in paths(doc) if isinstance(_get(doc, p), dict)]
        where = data.draw(st.sampled_from(mappings), label="mapping")
        key = data.draw(yaml_keys.filter(lambda k: k not in _get(doc, where)), label="key")
        _get(doc, where)[key] = data.draw(yaml_values, label="value")
        path = (*where, key) if isinstance(key, str) else (*where, str(key))
        unknown = path if isinstance(key, str) and key else None
    text = yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)
    try:
        load_config_text(text, source="c.yaml")
    except ConfigError as err:
        problems = check_config_error(err, path)
        if unknown is not None:
            assert any(re.match(re.escape(render(unknown)) + r"[:.\[]", p)
                       for p in problems), (unknown, problems)
    else:
        assert action != "unknown" or unknown is None


YAML_ALPHABET = "abc:-[]{},&*!|>'\"%@`?# \n\t0123456789.$"


@FUZZ
@given(st.one_of(st.text(max_size=80), st.text(alphabet=YAML_ALPHABET, max_size=80)))
def test_config_random_text(text: str) -> None:
    try:
        load_config_text(text, source="c.yaml")
    except ConfigError as err:
        check_config_error(err, None)


def test_config_unhashable_and_non_string_keys() -> None:
    for text, expected in [("? [a]\n: b\n", r"^c\.yaml:1:3: bad YAML: .*unhashable"),
                           ("{[a]: b}\n", r"^c\.yaml:1:2: bad YAML: .*unhashable"),
                           ("clusters: {? {a: 1} : b}\n", r"^c\.yaml:1:14: bad YAML: "),
                           ("a: &x [*x]\n", r"^c\.yaml:1:\d+: bad YAML: .*recursive")]:
        with pytest.raises(ConfigError, match=expected):
            load_config_text(text, source="c.yaml")
    with pytest.raises(ConfigValidationError) as info:
        load_config_text("1: 2\n", source="c.yaml")
    assert "(top level): key 1 is not a string; keys are names (line 1)" in info.value.problems


@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=60))
def test_config_file_of_random_bytes(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(raw)
    try:
        load_config(path)
    except ConfigError as err:
        assert str(path) in str(err)
        check_config_error(err, None)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            assert f"byte {exc.start}" in str(err)
