"""A TCP proxy in front of a broker that records the acks clients send through it.

This is how the target cluster's admin API learns the acks of clients the
sandbox does not own (the sync emitter uses a plain pulsar-client consumer):
it reads them off the wire. Pulsar binary protocol frames are
``[totalSize u32][commandSize u32][BaseCommand protobuf][payload...]``; the
proxy forwards every byte unchanged except lookup answers, and decodes just
enough protobuf to learn:

- ``SUBSCRIBE`` (BaseCommand field 4): consumer_id -> (topic, subscription);
- ``ACK`` (field 10): ack_type (0 individual, 1 cumulative) and each
  MessageIdData (ledgerId 1, entryId 2, batch_index 4, ack_set 5, batch_size 6).
  An ``ack_set`` (batch-index ack, PIP-54) is a bitset of the indexes still
  unacked; each cleared bit below batch_size is recorded as an index ack;
- ``LOOKUP_RESPONSE`` (field 24): brokerServiceUrl (field 1) is rewritten to
  the proxy's own URL so that clients keep talking through it.

Recorded acks are what the client SENT: the cursor a real broker would hold.
pulsar-lite itself drops acks of entries it never dispatched on the
subscription, so its own state can lag behind what the proxy reports.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
from collections.abc import Callable

from cursorsync.pulsar.msgid import read_varint
from cursorsync.sandbox.brokers import LOOPBACK

log = logging.getLogger(__name__)

#: (topic, subscription, ledger, entry, batch_index, cumulative)
AckCallback = Callable[[str, str, int, int, int, bool], None]

_SUBSCRIBE, _ACK, _LOOKUP_RESPONSE = 4, 10, 24


# ----------------------------------------------------------- protobuf wire format


def _encode_varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _fields(buf: bytes) -> list[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field; varints as int, the rest as bytes."""
    out: list[tuple[int, int, int | bytes]] = []
    i = 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        num, wt = key >> 3, key & 7
        val: int | bytes
        if wt == 0:
            val, i = read_varint(buf, i)
        elif wt == 1:
            val, i = buf[i : i + 8], i + 8
        elif wt == 2:
            n, i = read_varint(buf, i)
            val, i = buf[i : i + n], i + n
        elif wt == 5:
            val, i = buf[i : i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wt} in field {num}")
        out.append((num, wt, val))
    return out


def _encode_fields(fields: list[tuple[int, int, int | bytes]]) -> bytes:
    out = bytearray()
    for num, wt, val in fields:
        out += _encode_varint(num << 3 | wt)
        if wt == 0:
            assert isinstance(val, int)
            out += _encode_varint(val)
        elif wt == 2:
            assert isinstance(val, bytes)
            out += _encode_varint(len(val)) + val
        else:
            assert isinstance(val, bytes)
            out += val
    return bytes(out)


def _signed(n: int) -> int:
    return n - (1 << 64) if n >= 1 << 63 else n


def decode_acks(command: bytes) -> tuple[int, bool, list[tuple[int, int, int]]] | None:
    """From a BaseCommand: (consumer_id, cumulative, [(ledger, entry, batch_index)]) for ACK."""
    sub = next((v for n, w, v in _fields(command) if n == _ACK and w == 2), None)
    if not isinstance(sub, bytes):
        return None
    consumer_id, cumulative, ids = 0, False, []
    for n, _w, v in _fields(sub):
        if n == 1 and isinstance(v, int):
            consumer_id = v
        elif n == 2 and isinstance(v, int):
            cumulative = v == 1
        elif n == 3 and isinstance(v, bytes):
            ids.extend(_message_id_acks(v, cumulative))
    return consumer_id, cumulative, ids


def _message_id_acks(data: bytes, cumulative: bool) -> list[tuple[int, int, int]]:
    ledger = entry = 0
    batch_index, batch_size = -1, -1
    words: list[int] = []
    for n, w, v in _fields(data):
        if n == 1 and isinstance(v, int):
            ledger = _signed(v)
        elif n == 2 and isinstance(v, int):
            entry = _signed(v)
        elif n == 4 and isinstance(v, int):
            batch_index = _signed(v)
        elif n == 5 and w == 0 and isinstance(v, int):
            words.append(v)
        elif n == 5 and w == 2 and isinstance(v, bytes):  # packed
            i = 0
            while i < len(v):
                word, i = read_varint(v, i)
                words.append(word)
        elif n == 6 and isinstance(v, int):
            batch_size = v
    if not words:
        return [(ledger, entry, batch_index)]
    width = batch_size if batch_size > 0 else 64 * len(words)
    cleared = [i for i in range(width) if not (words[i // 64] >> (i % 64)) & 1]
    if cumulative:
        return [(ledger, entry, max(cleared))] if cleared else [(ledger, entry - 1, -1)]
    return [(ledger, entry, i) for i in cleared]


def decode_subscribe(command: bytes) -> tuple[int, str, str, bool] | None:
    """From a BaseCommand: (consumer_id, topic, subscription, durable) for SUBSCRIBE.

    ``durable`` is CommandSubscribe field 8 (default true); readers subscribe
    non-durably, and their cursors are not subscriptions.
    """
    sub = next((v for n, w, v in _fields(command) if n == _SUBSCRIBE and w == 2), None)
    if not isinstance(sub, bytes):
        return None
    topic = subscription = ""
    consumer_id = -1
    durable = True
    for n, _w, v in _fields(sub):
        if n == 1 and isinstance(v, bytes):
            topic = v.decode()
        elif n == 2 and isinstance(v, bytes):
            subscription = v.decode()
        elif n == 4 and isinstance(v, int):
            consumer_id = v
        elif n == 8 and isinstance(v, int):
            durable = bool(v)
    return consumer_id, topic, subscription, durable


def rewrite_lookup(command: bytes, service_url: str) -> bytes | None:
    """A LOOKUP_RESPONSE BaseCommand with brokerServiceUrl replaced; None for other commands."""
    fields = _fields(command)
    out: list[tuple[int, int, int | bytes]] = []
    changed = False
    for n, w, v in fields:
        if n == _LOOKUP_RESPONSE and w == 2 and isinstance(v, bytes):
            inner = [
                (m, x, service_url.encode() if m == 1 else y) for m, x, y in _fields(v)
            ]
            out.append((n, w, _encode_fields(inner)))
            changed = True
        else:
            out.append((n, w, v))
    return _encode_fields(out) if changed else None


# ------------------------------------------------------------------------- proxy


class AckSniffingProxy:
    """Listens on a free loopback port and forwards to the broker, recording acks."""

    def __init__(self, broker_port: int, on_ack: AckCallback) -> None:
        self.broker_port = broker_port
        self.on_ack = on_ack
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((LOOPBACK, 0))
        self._sock.listen(64)
        self._sock.settimeout(0.2)  # accept() wakes up to notice stop()
        self.port = int(self._sock.getsockname()[1])
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.errors: list[BaseException] = []

    @property
    def service_url(self) -> str:
        return f"pulsar://{LOOPBACK}:{self.port}"

    def start(self) -> AckSniffingProxy:
        self._thread = threading.Thread(target=self._accept, name="ack-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._sock.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            with contextlib.suppress(OSError):  # already closed by the peer
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # listening socket closed by stop()
            client.settimeout(None)
            try:
                upstream = socket.create_connection((LOOPBACK, self.broker_port))
            except OSError as exc:
                log.error("ack proxy cannot reach broker port %d: %s", self.broker_port, exc)
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            consumers: dict[int, tuple[str, str] | None] = {}
            for src, dst, outbound in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(
                    target=self._pump, args=(src, dst, outbound, consumers), daemon=True
                ).start()

    def _pump(
        self,
        src: socket.socket,
        dst: socket.socket,
        outbound: bool,
        consumers: dict[int, tuple[str, str] | None],
    ) -> None:
        buf = b""
        try:
            while True:
                chunk = src.recv(65536)
                if not chunk:
                    break
                buf += chunk
                out = bytearray()
                while len(buf) >= 4:
                    total = struct.unpack(">I", buf[:4])[0]
                    if len(buf) < 4 + total:
                        break
                    frame, buf = buf[: 4 + total], buf[4 + total :]
                    out += self._inspect(frame, outbound, consumers)
                if out:
                    dst.sendall(out)
        except OSError:
            pass  # a side closed the connection: close the other one below
        except Exception as exc:  # a decoding bug must not go unnoticed
            log.exception("ack proxy failed on a frame")
            self.errors.append(exc)
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):  # already shut down
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def _inspect(
        self, frame: bytes, outbound: bool, consumers: dict[int, tuple[str, str] | None]
    ) -> bytes:
        cmd_size = struct.unpack(">I", frame[4:8])[0]
        command, rest = frame[8 : 8 + cmd_size], frame[8 + cmd_size :]
        if outbound:
            sub = decode_subscribe(command)
            if sub is not None:
                # A reader's non-durable cursor is not a subscription: its acks are not kept.
                consumers[sub[0]] = (sub[1], sub[2]) if sub[3] else None
            acks = decode_acks(command)
            if acks is not None:
                consumer_id, cumulative, ids = acks
                if consumer_id not in consumers:
                    log.warning("ack from unknown consumer %d ignored", consumer_id)
                    return frame
                where = consumers[consumer_id]
                if where is not None:
                    for ledger, entry, batch_index in ids:
                        self.on_ack(where[0], where[1], ledger, entry, batch_index, cumulative)
            return frame
        rewritten = rewrite_lookup(command, self.service_url)
        if rewritten is None:
            return frame
        body = struct.pack(">I", len(rewritten)) + rewritten + rest
        return struct.pack(">I", len(body)) + body
