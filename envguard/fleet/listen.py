"""Rank 0's side of the fleet transport (:mod:`envguard.fleet.wire` has the protocol).

Rank 0 listens on the one address MASTER_ADDR (or ``$ENVGUARD_FLEET_ADDR``) resolves to,
never on every interface unless that address says so. Connections are served together
from one :mod:`selectors` loop, so a peer that sends nothing or sends slowly holds only its
own connection: it has :data:`HANDSHAKE_S` to authenticate, and at most
:data:`MAX_PEERS` connections are open at once. A connection that fails authentication
is dropped and counted, never taken for a rank. An authenticated rank that claims
another world size, a rank already heard from, too many bytes, or that sends a snapshot
the validating reader refuses, is a problem named in the error; so is every rank not
heard from by the deadline. Nothing is unpickled: a payload is JSON text, read by
:func:`envguard.fleet.gather.parse_snapshot`.
"""

from __future__ import annotations

import contextlib
import hmac
import secrets
import selectors
import socket
import time
from collections.abc import Mapping
from typing import Any

from envguard.errors import GatherError, InputError
from envguard.fleet.gather import MAX_FLEET_BYTES, Launch, entry, parse_snapshot
from envguard.fleet.wire import (
    CLAIM,
    HELLO,
    MAGIC,
    MAX_PAYLOAD,
    NONCE_BYTES,
    REPLY,
    TAG_BYTES,
    Endpoint,
    Status,
    deliver,
    endpoint,
    fleet_key,
    mac,
)
from envguard.model import Snapshot

HANDSHAKE_S = 5.0
"""How long a new connection has to authenticate (send a CLAIM with a good tag)."""
MAX_PEERS = 256
"""Connections open at once; more are closed at once (a real rank retries)."""
POLL_S = 0.5
_NO_PROOF = bytes(TAG_BYTES)


class _Peer:
    """One open connection: what has been read of its current message."""

    __slots__ = ("buf", "deadline", "fields", "got", "nonce_s", "rank", "sock")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.nonce_s = secrets.token_bytes(NONCE_BYTES)
        self.buf = bytearray(CLAIM.size)
        self.got = 0
        self.rank: int | None = None
        """Set once the CLAIM is authenticated and admitted."""
        self.fields: tuple[bytes, bytes, bytes, int, int, int] | None = None


class _Tally:
    """What rank 0 has heard: snapshots, problems by rank, connections dropped."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.snapshots: dict[int, Snapshot] = {}
        self.problems: list[tuple[int, str]] = []
        self.heard: set[int] = set()
        """Ranks admitted or failed: a second claim is a problem."""
        self.settled: set[int] = set()
        """Ranks whose snapshot arrived, or that failed: nothing more is awaited from them."""
        self.dropped: dict[str, int] = {}
        self.total = 0

    def fail(self, rank: int, problem: str) -> None:
        self.problems.append((rank, problem))
        self.heard.add(rank)
        self.settled.add(rank)

    def arrived(self, rank: int, snapshot: Snapshot) -> None:
        self.snapshots[rank] = snapshot
        self.settled.add(rank)

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def admit(self, rank: int, world: int, length: int) -> Status:
        if world != self.world:
            self.fail(rank, f"claims WORLD_SIZE={world}; rank 0 has {self.world}")
            return Status.WORLD
        if not 0 < rank < self.world:
            self.fail(rank, f"claims RANK={rank}, which is rank 0's" if rank == 0 else
                      f"claims RANK={rank}, not below WORLD_SIZE={self.world}")
            return Status.RANK
        if rank in self.heard:
            self.fail(rank, "connected twice")
            return Status.TWICE
        if length > MAX_PAYLOAD or self.total + length > MAX_FLEET_BYTES:
            self.fail(rank, f"announced a snapshot of {length:,} bytes (the limit is "
                      f"{MAX_PAYLOAD:,}, and {MAX_FLEET_BYTES:,} for the whole fleet)")
            return Status.SIZE
        self.heard.add(rank)
        self.total += length
        return Status.OK

    def done(self) -> bool:
        return all(r in self.settled for r in range(1, self.world))

    def result(self, ep: Endpoint, timeout_s: float) -> dict[int, Snapshot]:
        missing = [str(r) for r in range(1, self.world) if r not in self.settled]
        if not self.problems and not missing:
            return self.snapshots
        parts = [f"rank {r} {p[:300]}" for r, p in self.problems[:8]]
        if len(self.problems) > 8:
            parts.append(f"{len(self.problems) - 8} more problem(s)")
        if missing:
            hint = (", a loopback address: only ranks on its host can reach it" if
                    ep.loopback() else "")
            parts.append(f"no snapshot from rank(s) {', '.join(missing[:20])}"
                         f"{' …' if len(missing) > 20 else ''} within {timeout_s:g} s "
                         f"(rank 0 listened on {ep.where()}{hint})")
        if self.dropped:
            parts.append(f"{sum(self.dropped.values())} connection(s) dropped and not counted "
                         "as ranks (" + ", ".join(f"{n} {why}" for why, n in
                                                  sorted(self.dropped.items())) + ")")
        raise GatherError("the ranks' snapshots could not all be gathered: " + "; ".join(parts))


def gather_net(snapshot: Snapshot, launch: Launch, env: Mapping[str, str],
               timeout_s: float) -> list[dict[str, Any]] | None:
    """Every rank's snapshot on rank 0 (as fleet document entries, in rank order) over the
    fleet transport; None on the other ranks, once rank 0 has accepted theirs."""
    if launch.world_size == 1:
        return [entry(snapshot, launch)]
    deadline = time.monotonic() + timeout_s
    key = fleet_key(env)
    ep = endpoint(launch, env)
    if launch.rank != 0:
        deliver(snapshot.to_json().encode("utf-8"), launch, ep, key, deadline, timeout_s)
        return None
    found = collect(launch.world_size, ep, key, deadline, timeout_s)
    found[0] = snapshot
    return [entry(found[r], Launch(rank=r, world_size=launch.world_size, local_rank=0))
            for r in range(launch.world_size)]


def listen(ep: Endpoint, world: int) -> socket.socket:
    """A non-blocking listening socket on ``ep``'s first address; GatherError if it cannot."""
    family, sockaddr = ep.addresses[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # not SO_REUSEPORT
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(sockaddr)
        sock.listen(min(world, socket.SOMAXCONN))
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise GatherError(f"rank 0 cannot listen on {ep.where()}: {exc.strerror or exc}; "
                          "set ENVGUARD_FLEET_PORT to a free port (the same on every "
                          "rank)") from None
    return sock


def collect(world: int, ep: Endpoint, key: bytes, deadline: float,
            timeout_s: float) -> dict[int, Snapshot]:
    """Ranks 1..world-1's snapshots, by rank; GatherError naming each rank not had."""
    tally = _Tally(world)
    listener = listen(ep, world)
    sel = selectors.DefaultSelector()
    try:
        sel.register(listener, selectors.EVENT_READ, None)
        while not tally.done():
            now = time.monotonic()
            if now >= deadline:
                break
            for skey, _ in sel.select(min(POLL_S, deadline - now)):
                if skey.data is None:
                    _accept(listener, sel, tally, deadline)
                else:
                    _read(skey.data, sel, tally, key, ep, deadline)
            _expire(sel, tally, time.monotonic())
    finally:
        _expire(sel, tally, float("inf"), finished=tally.done())
        sel.close()
        listener.close()
    return tally.result(ep, timeout_s)


def _peers(sel: selectors.BaseSelector) -> list[_Peer]:
    return [k.data for k in sel.get_map().values() if k.data is not None]


def _close(sel: selectors.BaseSelector, peer: _Peer, last: bytes = b"") -> None:
    if last:
        with contextlib.suppress(OSError):
            peer.sock.send(last)  # a few bytes into an empty send buffer: never blocks
    sel.unregister(peer.sock)
    peer.sock.close()


def _accept(listener: socket.socket, sel: selectors.BaseSelector, tally: _Tally,
            deadline: float) -> None:
    try:
        sock, _ = listener.accept()
    except OSError:  # gone already, or out of descriptors: the peer retries
        return
    if len(sel.get_map()) > MAX_PEERS:
        sock.close()
        tally.drop("over the limit of open connections")
        return
    sock.setblocking(False)
    peer = _Peer(sock, min(deadline, time.monotonic() + HANDSHAKE_S))
    try:
        sent = sock.send(HELLO.pack(MAGIC, peer.nonce_s))
    except OSError:
        sent = 0
    if sent != HELLO.size:
        sock.close()
        tally.drop("gone before the greeting")
        return
    sel.register(sock, selectors.EVENT_READ, peer)


def _read(peer: _Peer, sel: selectors.BaseSelector, tally: _Tally, key: bytes, ep: Endpoint,
          deadline: float) -> None:
    try:
        n = peer.sock.recv_into(memoryview(peer.buf)[peer.got:])
    except (BlockingIOError, InterruptedError):
        return
    except OSError:
        n = 0
    if n == 0:
        _close(sel, peer)
        if peer.rank is None:
            tally.drop("closed before authenticating")
        else:
            tally.fail(peer.rank, "closed the connection before its snapshot was complete")
        return
    peer.got += n
    if peer.got < len(peer.buf):
        return
    if peer.rank is None or peer.fields is None:
        _on_claim(peer, sel, tally, key, ep, deadline)
    else:
        _on_payload(peer, peer.rank, peer.fields, sel, tally, key)


def _on_claim(peer: _Peer, sel: selectors.BaseSelector, tally: _Tally, key: bytes,
              ep: Endpoint, deadline: float) -> None:
    magic, rank, world, length, nonce_c, tag = CLAIM.unpack(peer.buf)
    fields = (ep.context, peer.nonce_s, nonce_c, rank, world, length)
    if magic != MAGIC or not hmac.compare_digest(tag, mac(key, b"claim", *fields).digest()):
        _close(sel, peer, REPLY.pack(Status.AUTH, _NO_PROOF))
        tally.drop("failed authentication" if magic == MAGIC else "not envguard's protocol")
        return
    status = tally.admit(rank, world, length)
    if status != Status.OK:
        _close(sel, peer, REPLY.pack(status, _NO_PROOF))
        return
    try:
        sent = peer.sock.send(REPLY.pack(Status.OK, mac(key, b"accept", *fields).digest()))
    except OSError:
        sent = 0
    if sent != REPLY.size:
        _close(sel, peer)
        tally.fail(rank, "went away during the handshake")
        return
    peer.rank, peer.fields, peer.deadline = rank, fields, deadline
    peer.buf = bytearray(length + TAG_BYTES)  # the length is authenticated and capped
    peer.got = 0


def _on_payload(peer: _Peer, rank: int, fields: tuple[bytes, bytes, bytes, int, int, int],
                sel: selectors.BaseSelector, tally: _Tally, key: bytes) -> None:
    body = memoryview(peer.buf)[:-TAG_BYTES]
    tag = mac(key, b"payload", *fields)
    tag.update(body)
    if not hmac.compare_digest(tag.digest(), bytes(peer.buf[-TAG_BYTES:])):
        _close(sel, peer, bytes([Status.AUTH]))
        tally.fail(rank, "sent a snapshot whose tag is wrong (changed on the way?)")
        return
    try:
        tally.arrived(rank, parse_snapshot(body, f"rank {rank}'s snapshot"))
    except InputError as exc:
        _close(sel, peer, bytes([Status.INVALID]))
        tally.fail(rank, f"sent a snapshot rank 0 cannot read: {exc}")
        return
    _close(sel, peer, bytes([Status.OK]))
    peer.buf = bytearray()


def _expire(sel: selectors.BaseSelector, tally: _Tally, now: float, *,
            finished: bool = False) -> None:
    for peer in _peers(sel):
        if peer.deadline > now:
            continue
        _close(sel, peer)
        if finished:
            continue
        if peer.rank is None:
            tally.drop(f"sent nothing valid within {HANDSHAKE_S:g} s")
        else:
            tally.fail(peer.rank, "was still sending its snapshot at the deadline")
