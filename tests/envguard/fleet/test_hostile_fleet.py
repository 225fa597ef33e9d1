"""``envguard fleet snapshot``'s transport under attack: real ranks, rogue peers, 127.0.0.1.

Every rank is a real ``python -m envguard fleet snapshot`` process (RANK, WORLD_SIZE,
MASTER_ADDR=127.0.0.1, MASTER_PORT set as a launcher sets them). Rogue peers are sockets
of this test: pickles that would create a file if unpickled, garbage, a wrong key, an
exchange recorded by a relay and replayed, announced lengths past the cap, and ranks of
the job that send an unreadable snapshot, claim another world size or connect twice.
Every wait is bounded: subprocesses have timeouts and every loop a deadline.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import envguard

CODE_ROOT = Path(envguard.__file__).resolve().parents[1]
"""The envguard the subprocesses run: the one this test imported."""
TIMEOUT = 120
KEY = "fleet-test-key-0123456789abcdef"
NO_TORCH = ("import sys; from envguard.cli import main; rc = main(sys.argv[1:]); "
            "assert 'torch' not in sys.modules, 'imported torch'; sys.exit(rc)")


def _free_port_pair() -> int:
    """A MASTER_PORT whose successor (the default fleet port) is free now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if 1024 < port < 65535:
            return port - 1
    raise AssertionError("no free port")


def _env(home: Path, rank: int, world: int, master_port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ENVGUARD_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(ENVGUARD_CACHE_DIR=str(home / "cache"), XDG_CONFIG_HOME=str(home / "config"),
               PYTHONPATH=str(CODE_ROOT), COLUMNS="200", RANK=str(rank),
               WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(master_port), ENVGUARD_FLEET_KEY=KEY)
    env.update(extra)
    return env


def _rank(home: Path, rank: int, world: int, master_port: int, *args: str,
          **extra: str) -> subprocess.Popen[str]:
    work = home / f"work{rank}"
    work.mkdir(exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-c", NO_TORCH, "fleet", "snapshot", "--no-project-config", *args],
        cwd=work, env=_env(home, rank, world, master_port, **extra), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=30)
        raise AssertionError(f"hung: {out}{err}") from None
    return proc.returncode, out, err


def _listeners(port: int) -> list[str]:
    """The local addresses of every socket LISTENing on TCP ``port`` (from /proc/net)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, hexport = local.split(":")
            if int(hexport, 16) != port or state != "0A":
                continue
            if len(addr) == 8:
                found.append(socket.inet_ntop(socket.AF_INET, bytes.fromhex(addr)[::-1]))
            else:
                words = b"".join(bytes.fromhex(addr[i:i + 8])[::-1] for i in range(0, 32, 8))
                found.append(socket.inet_ntop(socket.AF_INET6, words))
    return found


def _wait_listening(proc: subprocess.Popen[str], port: int) -> list[str]:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        found = _listeners(port)
        if found:
            return found
        if proc.poll() is not None:
            raise AssertionError(f"rank 0 exited {proc.returncode}: {_finish(proc)}")
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"nothing listened on {port} within 90 s: {_finish(proc)}")


def _recv(sock: socket.socket, size: int) -> bytes:
    sock.settimeout(20)
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the peer closes (or resets) the connection within 20 s."""
    sock.settimeout(20)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except OSError:
        pass
    return True


def _context(master_port: int) -> bytes:
    from envguard.fleet.gather import launch_from_env
    from envguard.fleet.wire import endpoint

    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(master_port)}
    return endpoint(launch_from_env(env), env).context


def _claim(port: int, master_port: int, *, rank: int, world: int, length: int,
           key: str = KEY) -> int:
    """Send one CLAIM (tagged with ``key``) to rank 0; its answer's status byte."""
    from envguard.fleet.wire import CLAIM, HELLO, MAGIC, REPLY, mac

    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        magic, nonce_s = HELLO.unpack(_recv(sock, HELLO.size))
        assert magic == MAGIC
        nonce_c = os.urandom(32)
        tag = mac(key.encode(), b"claim", _context(master_port), nonce_s, nonce_c, rank, world,
                  length).digest()
        sock.sendall(CLAIM.pack(MAGIC, rank, world, length, nonce_c, tag))
        status, _ = REPLY.unpack(_recv(sock, REPLY.size))
        return int(status)


def _deliver(port: int, master_port: int, payload: bytes, *, rank: int, world: int,
             key: str = KEY) -> None:
    """A rank of the job, sending ``payload`` as its snapshot (GatherError if refused)."""
    from envguard.fleet.gather import launch_from_env
    from envguard.fleet.wire import deliver, endpoint

    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(master_port), "ENVGUARD_FLEET_PORT": str(port)}
    launch = launch_from_env(env)
    deliver(payload, launch, endpoint(launch, env), key.encode(), time.monotonic() + 30, 30)


@pytest.fixture(scope="module")
def snapshot_json(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    home = tmp_path_factory.mktemp("snap-home")
    out = home / "snap.json"
    result = subprocess.run([sys.executable, "-m", "envguard", "snapshot", "-q", "-o", str(out),
                             "--no-project-config"], capture_output=True, text=True,
                            timeout=TIMEOUT, cwd=home, env=_env(home, 0, 1, 1))
    assert result.returncode == 0, result.stderr
    return out.read_bytes()


# -- the real thing ------------------------------------------------------------------------

def test_two_real_ranks_gather_over_loopback_with_the_mask_key(tmp_path: Path) -> None:
    """No ENVGUARD_FLEET_KEY: the ranks share the user's mask key file; no torch imported;
    the port is MASTER_PORT + 1."""
    master = _free_port_pair()
    key_file = tmp_path / "config" / "envguard" / "mask.key"
    key_file.parent.mkdir(parents=True)
    key_file.write_text("a" * 64 + "\n")
    out = tmp_path / "FLEET.json"
    procs = [_rank(tmp_path, r, 2, master, "--timeout", "90", *(["-o", str(out)] if r == 0
                                                                 else []),
                   ENVGUARD_FLEET_KEY="") for r in (1, 0)]
    (c1, o1, e1), (c0, o0, e0) = map(_finish, procs)
    assert (c1, o1) == (0, ""), e1
    assert c0 == 0, o0 + e0
    assert "all 2 snapshot(s) equivalent" in o0
    doc = json.loads(out.read_text())
    assert [e["rank"] for e in doc["snapshots"]] == [0, 1]


def test_rank_0_listens_on_master_addr_only(tmp_path: Path) -> None:
    master = _free_port_pair()
    rank0 = _rank(tmp_path, 0, 2, master, "--timeout", "90")
    try:
        assert _wait_listening(rank0, master + 1) == ["127.0.0.1"]
        others = ["127.0.0.2"]  # all of 127/8 is this host: a wildcard bind would answer
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect(("192.0.2.1", 9))
                others.append(probe.getsockname()[0])
            except OSError:
                pass
        for other in others:
            if other == "127.0.0.1":
                continue
            with pytest.raises(OSError):
                socket.create_connection((other, master + 1), timeout=5).close()
    finally:
        one = _rank(tmp_path, 1, 2, master, "--timeout", "90")
        assert _finish(one)[0] == 0
    code, out, err = _finish(rank0)
    assert code == 0, out + err


# -- rogue peers ---------------------------------------------------------------------------

class _Boom:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_rogue_peers_are_refused_and_nothing_runs(tmp_path: Path) -> None:
    """Pickles, garbage, a wrong key, silent and trickling peers: none is a rank, none is
    unpickled, and the real rank still gets through long before the deadline."""
    from envguard.errors import GatherError
    from envguard.fleet.wire import CLAIM, HELLO, MAGIC

    master = _free_port_pair()
    port = master + 1
    marker = tmp_path / "PWNED"
    blob = pickle.dumps(_Boom(marker))
    started = time.monotonic()
    rank0 = _rank(tmp_path, 0, 2, master, "--timeout", "90", "--format", "json")
    _wait_listening(rank0, port)
    silent = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(5)]
    for rogue in (blob, blob * 40, MAGIC + blob.ljust(CLAIM.size, b"\0"), os.urandom(4096),
                  b"\0" * CLAIM.size, b"GET / HTTP/1.1\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
            assert _recv(sock, HELLO.size)[:8] == MAGIC
            sock.sendall(rogue)
            assert _closed_by_peer(sock), rogue[:40]
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:  # no greeting read
        sock.sendall(blob)
    with pytest.raises(GatherError, match="failed authentication"):
        _deliver(port, master, b"{}", rank=1, world=2, key="another-key-of-the-right-size")
    one = _rank(tmp_path, 1, 2, master, "--timeout", "90")
    assert _finish(one)[0] == 0
    code, out, err = _finish(rank0)
    for sock in silent:
        sock.close()
    assert code == 0, out + err
    assert time.monotonic() - started < 80
    assert [m["rank"] for m in json.loads(out)["baseline"]["members"]] == [0, 1]
    time.sleep(0.5)
    assert not marker.exists(), "a pickle was unpickled"


class _Relay:
    """127.0.0.1:port -> 127.0.0.1:target, recording what the client sent."""

    def __init__(self, target: int) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.target = target
        self.sent = bytearray()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _pipe(self, a: socket.socket, b: socket.socket, record: bool) -> None:
        try:
            while chunk := a.recv(65536):
                if record:
                    self.sent += chunk
                b.sendall(chunk)
        except OSError:
            pass
        finally:
            b.close()

    def _run(self) -> None:
        self.server.settimeout(60)
        with self.server:
            client, _ = self.server.accept()
        upstream = socket.create_connection(("127.0.0.1", self.target), timeout=60)
        back = threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True)
        back.start()
        self._pipe(client, upstream, True)
        back.join(60)


def test_a_recorded_exchange_replayed_is_refused(tmp_path: Path) -> None:
    from envguard.fleet.wire import HELLO, MAGIC, REPLY, Status

    master = _free_port_pair()
    rank0 = _rank(tmp_path, 0, 3, master, "--timeout", "90", "--format", "json")
    # rank 1's ENVGUARD_FLEET_PORT is the relay's: a per-launch variable, not a difference
    _wait_listening(rank0, master + 1)
    relay = _Relay(master + 1)
    one = _rank(tmp_path, 1, 3, master, "--timeout", "90",
                ENVGUARD_FLEET_PORT=str(relay.port))
    assert _finish(one)[0] == 0
    relay.thread.join(30)
    assert len(relay.sent) > 1000  # the claim, the snapshot and its tag
    for replay in (bytes(relay.sent), bytes(relay.sent[:200])):
        with socket.create_connection(("127.0.0.1", master + 1), timeout=20) as sock:
            assert _recv(sock, HELLO.size)[:8] == MAGIC
            sock.sendall(replay)
            status, _ = REPLY.unpack(_recv(sock, REPLY.size))
            assert status == Status.AUTH
    two = _rank(tmp_path, 2, 3, master, "--timeout", "90")
    assert _finish(two)[0] == 0
    code, out, err = _finish(rank0)  # a replay taken as rank 1 would be "connected twice"
    assert code == 0, out + err
    assert [m["rank"] for m in json.loads(out)["baseline"]["members"]] == [0, 1, 2]


class _Impostor:
    """A listener on the fleet port that speaks the protocol but holds no key: it accepts
    every claim with a made-up proof and records what each connection sends after that."""

    def __init__(self, port: int) -> None:
        self.server = socket.create_server(("127.0.0.1", port))
        self.server.settimeout(0.2)
        self.after_claim: list[bytes] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from envguard.fleet.wire import CLAIM, HELLO, MAGIC, REPLY, Status

        with self.server:
            while not self.stop.is_set():
                try:
                    conn, _ = self.server.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.sendall(HELLO.pack(MAGIC, os.urandom(32)))
                    if len(_recv(conn, CLAIM.size)) < CLAIM.size:
                        continue
                    conn.sendall(REPLY.pack(Status.OK, os.urandom(32)))
                    conn.settimeout(2)
                    extra = b""
                    try:
                        while chunk := conn.recv(65536):
                            extra += chunk
                    except OSError:
                        pass
                    self.after_claim.append(extra)


def test_a_rank_sends_nothing_to_a_listener_without_the_key(tmp_path: Path) -> None:
    master = _free_port_pair()
    impostor = _Impostor(master + 1)
    try:
        code, out, err = _finish(_rank(tmp_path, 1, 2, master, "--timeout", "4"))
    finally:
        impostor.stop.set()
        impostor.thread.join(30)
    assert code == 4, out + err
    assert "did not prove that it holds the fleet key" in err, err
    assert impostor.after_claim and all(x == b"" for x in impostor.after_claim)


# -- ranks of the job that misbehave ------------------------------------------------------

def test_bad_ranks_fail_the_command_naming_each(tmp_path: Path, snapshot_json: bytes) -> None:
    from envguard.errors import GatherError

    master = _free_port_pair()
    port = master + 1
    rank0 = _rank(tmp_path, 0, 6, master, "--timeout", "90")
    _wait_listening(rank0, port)
    bad = {1: b'{"schema": "envguard.snapshot/1", "packages": 3}', 2: b"\xff\xfe not utf-8",
           5: b"[" * 200_000}
    _deliver(port, master, snapshot_json, rank=4, world=6)
    with pytest.raises(GatherError, match="connected twice"):
        _deliver(port, master, snapshot_json, rank=4, world=6)
    with pytest.raises(GatherError, match="another WORLD_SIZE"):
        _deliver(port, master, snapshot_json, rank=3, world=7)
    for rank, payload in bad.items():  # the last one settles every rank: rank 0 reports
        with pytest.raises(GatherError, match="cannot read"):
            _deliver(port, master, payload, rank=rank, world=6)
    code, out, err = _finish(rank0)
    assert code == 4, out + err
    assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    for expected in ("rank 1 sent a snapshot rank 0 cannot read", "rank 1's snapshot",
                     "rank 2 sent a snapshot", "not UTF-8", "rank 3 claims WORLD_SIZE=7",
                     "rank 4 connected twice", "rank 5 sent a snapshot"):
        assert expected in err, err
    assert "equivalent" not in out + err


def test_a_missing_rank_and_a_wrong_key_fail_naming_them(tmp_path: Path) -> None:
    master = _free_port_pair()
    # rank 0 waits out its timeout for rank 2, whose key is wrong: long enough for rank
    # 1's snapshot on a loaded VM, no longer
    rank0 = _rank(tmp_path, 0, 3, master, "--timeout", "6")
    one = _rank(tmp_path, 1, 3, master, "--timeout", "60")
    stranger = _rank(tmp_path, 2, 3, master, "--timeout", "60",
                     ENVGUARD_FLEET_KEY="not-the-key-of-this-job-at-all")
    c2, _, e2 = _finish(stranger)
    assert c2 == 4 and "failed authentication" in e2, e2
    assert _finish(one)[0] == 0
    code, out, err = _finish(rank0)
    assert code == 4, out + err
    assert "no snapshot from rank(s) 2 within 6 s" in err, err
    assert "rank(s) 1" not in err and "1, 2" not in err
    assert "dropped and not counted as ranks" in err and "failed authentication" in err
    assert "equivalent" not in out


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_an_oversize_announcement_is_refused_before_anything_is_allocated(
        tmp_path: Path) -> None:
    from envguard.fleet.wire import MAX_PAYLOAD, Status

    master = _free_port_pair()
    port = master + 1
    rank0 = _rank(tmp_path, 0, 3, master, "--timeout", "20")
    _wait_listening(rank0, port)
    assert _claim(port, master, rank=1, world=3, length=2**63, key="x" * 20) == Status.AUTH
    assert _claim(port, master, rank=1, world=3, length=MAX_PAYLOAD + 1) == Status.SIZE
    assert _claim(port, master, rank=2, world=3, length=2**64 - 1) == Status.SIZE
    assert _peak_rss(rank0.pid) < MAX_PAYLOAD // 2
    code, out, err = _finish(rank0)
    assert code == 4, out + err
    assert f"rank 1 announced a snapshot of {MAX_PAYLOAD + 1:,} bytes" in err, err
    assert "rank 2 announced a snapshot of" in err


def test_a_bad_rank_file_fails_dir_gathering_naming_the_rank(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "rank-1.json").write_text('{"schema": "envguard.snapshot/1", "packages": 3}')
    rank0 = _rank(tmp_path, 0, 2, _free_port_pair(), "--dir", str(shared), "--timeout", "30")
    code, out, err = _finish(rank0)
    assert code == 2, out + err  # a bad input file, as everywhere; never skipped
    assert "rank 1 wrote a snapshot rank 0 cannot read" in err and "rank-1.json" in err
    assert "missing required field" in err and "equivalent" not in out


# -- in one process: garbage never counts -------------------------------------------------

def test_random_bytes_never_count_as_a_rank(snapshot_json: bytes) -> None:
    from envguard.errors import GatherError
    from envguard.fleet.gather import launch_from_env
    from envguard.fleet.listen import collect
    from envguard.fleet.wire import HELLO, MAGIC, endpoint

    master = _free_port_pair()
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(master)}
    ep = endpoint(launch_from_env(env), env)
    result: dict[str, Any] = {}

    def serve() -> None:
        try:
            result["found"] = collect(2, ep, KEY.encode(), time.monotonic() + 90, 90)
        except GatherError as exc:  # shown by the assertion below
            result["error"] = exc

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    deadline = time.monotonic() + 30
    while not _listeners(master + 1) and time.monotonic() < deadline:
        time.sleep(0.05)

    @settings(max_examples=150, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.one_of(st.binary(max_size=300),
                     st.binary(min_size=80, max_size=80).map(lambda b: MAGIC + b)))
    def send(data: bytes) -> None:
        with socket.create_connection(("127.0.0.1", master + 1), timeout=20) as sock:
            assert _recv(sock, HELLO.size)[:8] == MAGIC
            sock.sendall(data)

    send()
    _deliver(master + 1, master, snapshot_json, rank=1, world=2)
    server.join(60)
    assert "error" not in result, result
    assert sorted(result["found"]) == [1]
