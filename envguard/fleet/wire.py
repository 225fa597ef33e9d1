"""The fleet's own transport: one authenticated TCP connection per rank, to rank 0.

No torch, no pickle: what crosses the network is a fixed-size binary header, a 32-byte
HMAC-SHA256 tag per message, and the snapshot's JSON text, which rank 0 reads with the
validating reader every snapshot file goes through. One connection, rank r to rank 0::

    rank 0 -> r   HELLO   magic(8) nonce_s(32)                    a fresh nonce per connection
    r -> rank 0   CLAIM   magic(8) rank(4) world(4) length(8) nonce_c(32) tag(32)
                          tag = HMAC(key, "claim" ctx nonce_s nonce_c rank world length)
    rank 0 -> r   REPLY   status(1) proof(32)
                          proof = HMAC(key, "accept" ctx nonce_s nonce_c rank world length)
    r -> rank 0   PAYLOAD the snapshot JSON (length bytes), then
                          HMAC(key, "payload" ctx nonce_s nonce_c rank world length payload)
    rank 0 -> r   ACK     status(1)

Rank 0 checks the claim's tag (:func:`hmac.compare_digest`) and the announced length
against :data:`MAX_PAYLOAD` before it allocates or reads a byte of payload; a rank checks
rank 0's proof before it sends its snapshot. The nonce of each side makes every tag good
for one connection only, so a recorded exchange cannot be replayed. ``ctx`` binds the
tags to one job: TORCHELASTIC_RUN_ID and MASTER_PORT. The key: ``$ENVGUARD_FLEET_KEY``,
else the user's mask key (:func:`envguard.probe.envvars.load_mask_key`). docs/FLEET.md
and docs/SECURITY.md say what crosses the network and who can connect.

This module holds the protocol, the key, the address and the sending side (every rank
but 0); :mod:`envguard.fleet.listen` is rank 0's side.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import socket
import struct
import time
from collections.abc import Mapping
from enum import IntEnum
from typing import Any

from envguard.errors import GatherError, InputError
from envguard.fleet.gather import Launch, env_int
from envguard.frozen import frozen
from envguard.snapshot_file import MAX_SNAPSHOT_BYTES

MAGIC = b"EGFLEET\x01"
NONCE_BYTES = 32
TAG_BYTES = 32
HELLO = struct.Struct(">8s32s")
CLAIM = struct.Struct(">8sIIQ32s32s")
REPLY = struct.Struct(">B32s")
_FIELDS = struct.Struct(">IIQ")
MAX_PAYLOAD = MAX_SNAPSHOT_BYTES
"""256 MiB: the largest snapshot a rank may announce, as for a snapshot file."""
MIN_KEY_BYTES = 16
KEY_ENV, PORT_ENV, ADDR_ENV = "ENVGUARD_FLEET_KEY", "ENVGUARD_FLEET_PORT", "ENVGUARD_FLEET_ADDR"
CONNECT_S = 5.0
"""The longest a rank waits for one connection attempt, and for rank 0's HELLO on it."""
HELLO_WAIT_S = 10.0
RETRY_MAX_S = 1.0


class Status(IntEnum):
    """Rank 0's answer to a CLAIM (REPLY) or to a PAYLOAD (ACK)."""

    OK = 0
    AUTH = 1
    WORLD = 2
    RANK = 3
    TWICE = 4
    SIZE = 5
    INVALID = 6


def status_of(value: int, unknown: Status) -> Status:
    try:
        return Status(value)
    except ValueError:
        return unknown


REFUSED = {
    Status.AUTH: "failed authentication: every rank needs the same key ($ENVGUARD_FLEET_KEY, "
                 "else the mask key: $ENVGUARD_MASK_KEY or ~/.config/envguard/mask.key) and "
                 "the same TORCHELASTIC_RUN_ID and MASTER_PORT",
    Status.WORLD: "claims another WORLD_SIZE than rank 0's",
    Status.RANK: "claims a RANK that is 0 or not below WORLD_SIZE",
    Status.TWICE: "connected twice",
    Status.SIZE: f"announced a snapshot over the {MAX_PAYLOAD >> 20} MiB limit (or over the "
                 "fleet's total)",
    Status.INVALID: "sent a snapshot rank 0 cannot read (rank 0's error names the problem)",
}


def mac(key: bytes, label: bytes, ctx: bytes, nonce_s: bytes, nonce_c: bytes, rank: int,
        world: int, length: int) -> hmac.HMAC:
    """The running HMAC-SHA256 of one message: fixed-size fields, so never ambiguous."""
    h = hmac.new(key, digestmod=hashlib.sha256)
    h.update(label.ljust(8, b"\0") + ctx + nonce_s + nonce_c + _FIELDS.pack(rank, world, length))
    return h


def fleet_key(env: Mapping[str, str]) -> bytes:
    """``$ENVGUARD_FLEET_KEY``, else the mask key; GatherError when there is none to share."""
    raw = env.get(KEY_ENV)
    if raw:
        key, source = raw.encode("utf-8", "surrogateescape"), KEY_ENV
    else:
        from envguard.model import ProbeIssue
        from envguard.probe.envvars import load_mask_key

        issues: list[ProbeIssue] = []
        key, source = load_mask_key(issues, env), "the mask key"
        if issues:
            raise GatherError(f"no key to authenticate the ranks with ({issues[0].message}); "
                              f"set {KEY_ENV} to one secret on every rank")
    if len(key) < MIN_KEY_BYTES:
        raise GatherError(f"{source} is shorter than {MIN_KEY_BYTES} bytes: too weak to "
                          f"authenticate the ranks; set {KEY_ENV} to a longer secret")
    return key


@frozen
class Endpoint:
    """Where rank 0 listens and the others connect, and the job the tags are bound to."""

    host: str
    port: int
    addresses: tuple[tuple[int, Any], ...]
    """(family, sockaddr) of every address ``host`` resolves to; rank 0 binds the first."""
    context: bytes

    def where(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def loopback(self) -> bool:
        try:
            return ipaddress.ip_address(str(self.addresses[0][1][0])).is_loopback
        except ValueError:
            return False


def endpoint(launch: Launch, env: Mapping[str, str]) -> Endpoint:
    """``$ENVGUARD_FLEET_ADDR`` or MASTER_ADDR; ``$ENVGUARD_FLEET_PORT`` or MASTER_PORT + 1."""
    name = ADDR_ENV if env.get(ADDR_ENV) else "MASTER_ADDR"
    host = env.get(ADDR_ENV) or launch.master_addr
    if not host:
        raise GatherError(f"MASTER_ADDR (or {ADDR_ENV}) is not set: rank 0's address is "
                          "unknown; run under torchrun, set it, or use --dir DIR")
    if env.get(PORT_ENV):
        port = env_int(env, PORT_ENV)
        if not 0 < port <= 65535:
            raise InputError(f"{PORT_ENV}={port} is not a TCP port (1 to 65535)")
    elif launch.master_port:
        port = launch.master_port + 1 if launch.master_port < 65535 else 65534
    else:
        raise GatherError(f"MASTER_PORT (or {PORT_ENV}) is not set: rank 0's port is unknown; "
                          "run under torchrun, set it, or use --dir DIR")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError) as exc:
        raise GatherError(f"cannot resolve {name}={host[:100]!r}: "
                          f"{getattr(exc, 'strerror', None) or exc}") from None
    addresses: list[tuple[int, Any]] = []
    for family, _, _, _, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6) and (family, sockaddr) not in addresses:
            addresses.append((family, sockaddr))
    if not addresses:
        raise GatherError(f"{name}={host[:100]!r} has no IPv4 or IPv6 address")
    job = f"envguard-fleet/1\0{env.get('TORCHELASTIC_RUN_ID', '')}\0{launch.master_port or ''}"
    return Endpoint(host=host, port=port, addresses=tuple(addresses),
                    context=hashlib.sha256(job.encode("utf-8", "surrogateescape")).digest())


# -- the sending side: every rank but 0 ---------------------------------------------------

class _Retry(Exception):
    """This attempt failed before anything of the snapshot was sent: try again."""


def recv_exact(sock: socket.socket, size: int, deadline: float) -> bytes:
    """Exactly ``size`` bytes, or OSError/EOFError; never past ``deadline``."""
    buf = bytearray(size)
    view, got = memoryview(buf), 0
    while got < size:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        sock.settimeout(left)
        n = sock.recv_into(view[got:])
        if n == 0:
            raise EOFError("connection closed")
        got += n
    return bytes(buf)


def deliver(payload: bytes, launch: Launch, ep: Endpoint, key: bytes, deadline: float,
            timeout_s: float) -> None:
    """Send this rank's snapshot to rank 0, retrying until ``deadline``; GatherError if not."""
    if len(payload) > MAX_PAYLOAD:
        raise GatherError(f"this rank's snapshot is {len(payload):,} bytes, over the "
                          f"{MAX_PAYLOAD:,}-byte limit of the fleet transport")
    last, delay = "nothing was listening", 0.05
    while True:
        for family, sockaddr in ep.addresses:
            try:
                _attempt(payload, launch, ep, key, family, sockaddr, deadline)
                return
            except _Retry as exc:
                last = str(exc)
        if time.monotonic() + delay >= deadline:
            raise GatherError(f"rank {launch.rank} could not deliver its snapshot to rank 0 "
                              f"at {ep.where()} within {timeout_s:g} s (the last attempt: "
                              f"{last})")
        time.sleep(delay)
        delay = min(delay * 2, RETRY_MAX_S)


def _attempt(payload: bytes, launch: Launch, ep: Endpoint, key: bytes, family: int,
             sockaddr: Any, deadline: float) -> None:
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.settimeout(max(0.01, min(CONNECT_S, deadline - time.monotonic())))
            sock.connect(sockaddr)
            magic, nonce_s = HELLO.unpack(recv_exact(
                sock, HELLO.size, min(deadline, time.monotonic() + HELLO_WAIT_S)))
        except (OSError, EOFError) as exc:
            raise _Retry(f"{type(exc).__name__}: {exc}") from None
        if magic != MAGIC:
            raise _Retry(f"what listens at {ep.where()} is not envguard's fleet transport")
        nonce_c = secrets.token_bytes(NONCE_BYTES)
        fields = (ep.context, nonce_s, nonce_c, launch.rank, launch.world_size, len(payload))
        try:
            sock.sendall(CLAIM.pack(MAGIC, *fields[3:], nonce_c,
                                    mac(key, b"claim", *fields).digest()))
            status, proof = REPLY.unpack(recv_exact(sock, REPLY.size, deadline))
        except (OSError, EOFError) as exc:
            raise _Retry(f"{type(exc).__name__}: {exc}") from None
        if status != Status.OK:
            raise GatherError(f"rank 0 refused rank {launch.rank}: it "
                              f"{REFUSED[status_of(status, Status.AUTH)]}")
        if not hmac.compare_digest(proof, mac(key, b"accept", *fields).digest()):
            raise _Retry(f"the listener at {ep.where()} did not prove that it holds the "
                         "fleet key (not this job's rank 0); nothing was sent to it")
        tag = mac(key, b"payload", *fields)
        tag.update(payload)
        try:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            sock.sendall(payload)
            sock.sendall(tag.digest())
            (answer,) = recv_exact(sock, 1, deadline)
        except (OSError, EOFError) as exc:  # no retry: rank 0 would count it twice
            raise GatherError(f"rank {launch.rank}: the connection to rank 0 broke while "
                              f"sending the snapshot ({type(exc).__name__}: {exc})") from None
        if answer != Status.OK:
            raise GatherError(f"rank 0 refused rank {launch.rank}'s snapshot: it "
                              f"{REFUSED[status_of(answer, Status.INVALID)]}")
