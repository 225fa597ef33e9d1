"""Inputs without bounds (issue 22, item 9): every JSON/TOML input is read from a regular file
of at most MAX_INPUT_BYTES, and the fleet's launcher variables and deadline hold.

The real CLI runs in subprocesses, under a 2 GiB address-space limit (so that a reader that
does read ``/dev/zero`` fails fast instead of eating the machine's memory) and a timeout (so
that one that blocks on a FIFO fails instead of hanging the suite).
"""

from __future__ import annotations

import json
import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from envguard.errors import GatherError, InputError
from envguard.exitcodes import ExitCode
from envguard.input_file import MAX_INPUT_BYTES, read_input, read_input_text


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def envguard(*args: str | Path, cwd: Path | None = None,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([sys.executable, "-m", "envguard", *map(str, args)],
                              capture_output=True, text=True, timeout=60, check=False,
                              cwd=cwd, env={**os.environ, **(env or {})},
                              preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired:
        pytest.fail(f"envguard {' '.join(map(str, args))} hung")


def one_line(proc: subprocess.CompletedProcess[str], code: ExitCode, *needles: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("envguard: error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("inputs")
    path = folder / "good.json"
    proc = subprocess.run([sys.executable, "-m", "envguard", "snapshot", "-q", "--verify",
                           "none", "--no-cache-marker", "-o", str(path)], capture_output=True,
                          text=True, timeout=120, check=False,
                          env={**os.environ, "ENVGUARD_CACHE_DIR": str(folder / "cache")})
    assert proc.returncode == 0, proc.stderr
    return path


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.json"
    os.mkfifo(path)
    return path


@pytest.fixture
def huge(tmp_path: Path) -> Path:
    """A sparse file one byte over the limit (no disk space used)."""
    path = tmp_path / "huge.json"
    with path.open("wb") as fh:
        fh.truncate(MAX_INPUT_BYTES + 1)
    return path


# -------------------------------------------------------------------- snapshots

@pytest.mark.parametrize("special", ["/dev/zero", "/dev/null", "fifo"])
def test_diff_reads_regular_files_only(good: Path, fifo: Path, special: str) -> None:
    other = fifo if special == "fifo" else Path(special)
    kind = "FIFO" if special == "fifo" else "character device"
    for args in ((good, other), (other, good)):
        line = one_line(envguard("diff", *args), ExitCode.USAGE, str(other), kind,
                        "not a regular file")
        assert "snapshot" in line


def test_every_snapshot_reader_refuses_a_fifo(good: Path, fifo: Path, tmp_path: Path) -> None:
    for args in (["restore", fifo, "--dry-run"],
                 ["lock", "demo", "--from", fifo, "--lock", tmp_path / "demo.toml"],
                 ["cache", "save", "x", "--from-snapshot", fifo, "--store", tmp_path / "s"],
                 ["fleet", "diff", good, fifo]):
        one_line(envguard(*args, cwd=tmp_path), ExitCode.USAGE, "FIFO")


def test_a_snapshot_over_the_limit_is_refused_before_reading(good: Path, huge: Path) -> None:
    one_line(envguard("diff", good, huge), ExitCode.USAGE, "too large",
             f"{MAX_INPUT_BYTES:,}")


# -------------------------------------------------------------------- lockfiles

@pytest.mark.parametrize("case", ["fifo", "dev-zero", "huge"])
def test_a_lockfile_that_is_not_a_bounded_regular_file(tmp_path: Path, fifo: Path, huge: Path,
                                                       case: str) -> None:
    path = {"fifo": fifo, "dev-zero": Path("/dev/zero"), "huge": huge}[case]
    needle = {"fifo": "FIFO", "dev-zero": "character device", "huge": "too large"}[case]
    for args in (["check", "--lock", path], ["run", "--lock", path, "--", "true"]):
        one_line(envguard(*args, cwd=tmp_path), ExitCode.USAGE, str(path), needle)


def test_lock_refuses_an_existing_lockfile_that_is_a_fifo(good: Path, tmp_path: Path) -> None:
    lock = tmp_path / "lockfiles" / "demo.toml"
    lock.parent.mkdir()
    os.mkfifo(lock)
    one_line(envguard("lock", "demo", "--from", good, "--lock", lock, cwd=tmp_path),
             ExitCode.USAGE, "FIFO", "lockfile")


# -------------------------------------------------------------------- fleet files

def test_fleet_diff_refuses_devices_and_fifos(good: Path, fifo: Path) -> None:
    for other in (fifo, Path("/dev/zero")):
        one_line(envguard("fleet", "diff", good, other), ExitCode.USAGE, str(other),
                 "not a regular file")


def test_a_fifo_in_place_of_a_rank_file_is_one_line(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.mkfifo(shared / "rank-1.json")
    proc = envguard("fleet", "snapshot", "--dir", shared, "--timeout", "20", "--verify", "none",
                    "--no-project-config", cwd=tmp_path, env={"RANK": "0", "WORLD_SIZE": "2"})
    one_line(proc, ExitCode.USAGE, "rank-1.json", "FIFO")


# -------------------------------------------------------------------- cache manifests

def test_a_fifo_manifest_is_an_unusable_archive_not_a_hang(tmp_path: Path) -> None:
    store = tmp_path / "store"
    (store / "broken").mkdir(parents=True)
    os.mkfifo(store / "broken" / "manifest.json")
    proc = envguard("cache", "status", "--store", store, "--format", "json")
    assert proc.returncode == ExitCode.OK, proc.stderr
    (row,) = json.loads(proc.stdout)["archives"]
    assert row["manifest"] is None and "FIFO" in row["problem"]
    restore = envguard("cache", "restore", "broken", "--store", store)
    one_line(restore, ExitCode.USAGE, "FIFO")


# -------------------------------------------------------------------- compile-cache markers

def test_a_fifo_as_the_cache_marker_neither_hangs_nor_blocks_the_snapshot(
        tmp_path: Path) -> None:
    cache = tmp_path / "inductor"
    (cache / "fxgraph").mkdir(parents=True)
    (cache / "fxgraph" / "entry").write_text("x")
    os.mkfifo(cache / ".envguard-builds.json")
    out = tmp_path / "snap.json"
    proc = envguard("snapshot", "-q", "--verify", "none", "--no-project-config", "-o", out,
                    env={"TORCHINDUCTOR_CACHE_DIR": str(cache)})
    assert proc.returncode == ExitCode.OK, proc.stderr
    errors = json.loads(out.read_text())["errors"]
    assert any("not a regular file" in e["message"] for e in errors), errors
    assert stat.S_ISFIFO(os.lstat(cache / ".envguard-builds.json").st_mode)


# -------------------------------------------------------------------- pyproject.toml

def test_a_fifo_pyproject_does_not_block_the_lock_closure(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pyproject.toml")
    code = ("import sys; from pathlib import Path\n"
            "from envguard.gate.closure import project_requires\n"
            "print(project_requires(Path(sys.argv[1]), 'demo'))\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                          text=True, timeout=30, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "None", proc.stderr


# -------------------------------------------------------------------- the reader itself

def test_read_input_bounds_and_kinds(tmp_path: Path, fifo: Path) -> None:
    small = tmp_path / "small.json"
    small.write_bytes(b"x" * 100)
    assert read_input(small, limit=100) == b"x" * 100
    with pytest.raises(InputError, match="too large for a lockfile"):
        read_input(small, what="lockfile", limit=99)
    with pytest.raises(InputError, match="is a folder, not a snapshot"):
        read_input(tmp_path, what="snapshot")
    with pytest.raises(InputError, match="no such file"):
        read_input(tmp_path / "absent")
    with pytest.raises(InputError, match="is a FIFO"):
        read_input(fifo)
    (tmp_path / "latin.json").write_bytes(b"\xff\xfe")
    with pytest.raises(InputError, match="not UTF-8"):
        read_input_text(tmp_path / "latin.json", what="snapshot")


# -------------------------------------------------------------------- launcher variables

@pytest.mark.parametrize(("env", "needle"), [
    ({"RANK": "0", "WORLD_SIZE": "100000000"}, "more than 65536"),
    ({"RANK": "0", "WORLD_SIZE": "9" * 5000}, "at most 9 digits"),
    ({"RANK": "9" * 5000, "WORLD_SIZE": "2"}, "at most 9 digits"),
    ({"RANK": "\u0663", "WORLD_SIZE": "4"}, "not a non-negative integer"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"},
     "not a TCP port"),
])
def test_launcher_variables_are_bounded(tmp_path: Path, env: dict[str, str],
                                        needle: str) -> None:
    proc = envguard("fleet", "snapshot", "--dir", tmp_path / "s", "--timeout", "2",
                    "--verify", "none", "--no-project-config", cwd=tmp_path, env=env)
    one_line(proc, ExitCode.USAGE, needle)


@pytest.mark.parametrize("timeout", ["nan", "inf", "0", "-1"])
def test_a_timeout_that_never_expires_is_refused(tmp_path: Path, timeout: str) -> None:
    proc = envguard("fleet", "snapshot", "--dir", tmp_path / "s", "--timeout", timeout,
                    "--verify", "none", "--no-project-config", cwd=tmp_path,
                    env={"RANK": "0", "WORLD_SIZE": "2"})
    one_line(proc, ExitCode.USAGE, "--timeout")


def test_the_largest_world_times_out_on_time(tmp_path: Path) -> None:
    proc = envguard("fleet", "snapshot", "--dir", tmp_path / "s", "--timeout", "1",
                    "--verify", "none", "--no-project-config", cwd=tmp_path,
                    env={"RANK": "0", "WORLD_SIZE": "65536"})
    one_line(proc, ExitCode.ENVIRONMENT_ERROR, "timed out", "rank(s) 1, 2")


def test_the_deadline_is_checked_inside_a_pass(tmp_path: Path, good: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """One pass over the ranks can outlast the timeout (a slow shared filesystem): the
    deadline is checked per rank, not per pass. The clock is the one thing faked here: it
    moves one second per reading."""
    import types

    from envguard.fleet import gather
    from envguard.model import Snapshot

    ticks = iter(range(10**9))
    fake_time = types.SimpleNamespace(monotonic=lambda: float(next(ticks)),
                                      time=lambda: 0.0, sleep=lambda s: None)
    monkeypatch.setattr(gather, "time", fake_time)
    looked_at: list[int] = []
    real_rank_file = gather.rank_file

    def counting(folder: Path, rank: int) -> Path:
        looked_at.append(rank)
        return real_rank_file(folder, rank)

    monkeypatch.setattr(gather, "rank_file", counting)
    snapshot = Snapshot.from_json(good.read_text())
    launch = gather.Launch(rank=0, world_size=65536, local_rank=0)
    with pytest.raises(GatherError, match="timed out after 5 s"):
        gather.gather_dir(snapshot, launch, tmp_path, 5.0)
    assert len(looked_at) < 20, len(looked_at)  # the old code looked at all 65,536 first


def test_the_gate_reads_only_the_integrity_issues_of_a_reference_snapshot(
        tmp_path: Path) -> None:
    from envguard.model import SCHEMA
    from envguard.snapshot_file import read_integrity_issues

    path = tmp_path / "entry.json"
    issue = {"package": "certifi", "path": "certifi/cacert.pem", "problem": "size",
             "expected": "1", "actual": "https://user:hunter2@example.com/ca"}
    # The rest of the document is neither validated nor returned.
    path.write_text(json.dumps({"schema": SCHEMA, "packages": "not a list",
                                "integrity": {"mode": "size", "issues": [issue]}}))
    [read] = read_integrity_issues(path)
    assert (read.package, read.path, read.problem) == ("certifi", "certifi/cacert.pem", "size")
    assert "hunter2" not in (read.actual or "")
    wrong_issue = {"mode": "size", "issues": [{"package": 1}]}
    for bad, said in (({"schema": SCHEMA, "integrity": wrong_issue}, "integrity.issues"),
                      ({"schema": "envguard.snapshot/99.0"}, "schema"),
                      ([1, 2], "expected an object")):
        path.write_text(json.dumps(bad))
        with pytest.raises(InputError, match=said) as caught:
            read_integrity_issues(path)
        assert str(path) in str(caught.value) and "\n" not in str(caught.value)
    path.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        read_integrity_issues(path)


def test_a_range_and_a_stream_are_read_from_regular_files_only(tmp_path: Path) -> None:
    """read_range (a slice of a large file) and open_stream (a file of any length) open as
    read_bounded does: a FIFO is refused without waiting, a link only where followed."""
    from envguard.input_file import NotReadable, open_stream, read_range

    data = tmp_path / "shard"
    data.write_bytes(bytes(range(100)))
    assert read_range(data, 10, 5) == bytes(range(10, 15))
    assert read_range(data, 98, 5) == bytes([98, 99])  # fewer at the end
    link = tmp_path / "link"
    link.symlink_to(data)
    assert read_range(link, 0, 2) == b"\x00\x01"
    with pytest.raises(NotReadable, match="symbolic link"):
        read_range(link, 0, 2, follow=False)
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    for read in (lambda: read_range(pipe, 0, 1), lambda: open_stream(pipe)):
        with pytest.raises(NotReadable, match="FIFO"):
            read()
    with open_stream(link) as fh:
        assert len(fh.read()) == 100
