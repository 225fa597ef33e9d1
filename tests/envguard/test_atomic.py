"""Atomic writes: an interrupted write never leaves a half-written or missing file."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest

from envguard.atomic import write_bytes_atomic, write_text_atomic
from envguard.errors import OutputError
from tests.wheelfactory import interruptible


def test_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "good.json"
    target.write_text("the good state\n")

    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OutputError, match="No space left on device"):
        write_text_atomic(target, "x" * 1000)
    assert target.read_text() == "the good state\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.json"]


def test_killed_writer_leaves_the_old_file_intact(tmp_path: Path) -> None:
    """A real process is SIGKILLed in the middle of writing 400 MB over the old file."""
    target = tmp_path / "good.json"
    target.write_text("the good state\n")
    code = (
        "import sys; from envguard.atomic import write_text_atomic\n"
        "print('go', flush=True)\n"
        "write_text_atomic(sys.argv[1], 'y' * (400 << 20))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(target)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"go"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        temps = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        if temps and temps[0].stat().st_size > 0:
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert target.read_text() == "the good state\n"


def test_unwritable_destination_is_an_output_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OutputError, match="cannot write"):
        write_text_atomic(blocker / "sub" / "snap.json", "{}")


def test_new_file_is_complete_and_replaces_old(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b.json"
    write_text_atomic(target, "one")
    write_text_atomic(target, "two")
    assert target.read_text() == "two"
    umask = os.umask(0o022)
    os.umask(umask)
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~umask)


# ------------------------------------------------------------------ what the path is (issue 22)

def _child(code: str, *args: str, umask: int | None = None,
           stdout: int | IO[str] = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (optionally under ``umask``)."""
    prefix = f"import os; os.umask({umask:#o})\n" if umask is not None else ""
    return subprocess.run([sys.executable, "-c", prefix + code, *args], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=60, check=False)


_WRITE = "import sys; from envguard.atomic import write_text_atomic\n" \
         "write_text_atomic(sys.argv[1], sys.argv[2])\n"


def test_a_character_device_is_written_through_not_replaced(tmp_path: Path) -> None:
    """A device node of its own (the null device, major 1 minor 3): never the real /dev/null,
    which the old code would have replaced with a regular file for everyone on this machine."""
    node = tmp_path / "null"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, AttributeError):
        pytest.skip("cannot make a device node here (not root, or no CAP_MKNOD)")
    write_text_atomic(node, "into the void\n")
    assert stat.S_ISCHR(os.lstat(node).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]


def test_a_fifo_is_written_through_to_its_reader(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    try:
        write_text_atomic(fifo, "through the pipe\n")
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
        out, _ = reader.communicate(timeout=30)
    finally:
        reader.kill()
        reader.communicate()
    assert out == b"through the pipe\n"


def test_a_fifo_nobody_reads_is_an_output_error_not_a_hang(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """An internal writer that meets a FIFO planted at its path (a compile-cache marker, a
    rank file) must not block forever: it waits FIFO_READER_WAIT_S (shortened here)."""
    import envguard.atomic

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    monkeypatch.setattr(envguard.atomic, "FIFO_READER_WAIT_S", 0.3)
    started = time.monotonic()
    with pytest.raises(OutputError, match="no process opened the FIFO for reading"):
        write_text_atomic(fifo, "nobody listens\n")
    assert time.monotonic() - started < 10
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.parametrize("link_to", ["/proc/self/fd/1", "/dev/stdout"])
def test_output_through_a_descriptor_link_reaches_stdout(tmp_path: Path, clean_cwd: Path,
                                                          link_to: str) -> None:
    """``envguard snapshot -o LINK`` where LINK points at the process's own stdout: the
    snapshot arrives on stdout and LINK is still a symlink (the old code replaced it)."""
    link = tmp_path / "out.json"
    link.symlink_to(link_to)
    proc = subprocess.run([sys.executable, "-m", "envguard", "snapshot", "-q", "--verify",
                           "none", "-o", str(link)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["schema"] == "envguard.snapshot/1"
    assert link.is_symlink() and os.readlink(link) == link_to


def test_dev_stdout_appends_to_a_redirected_file(tmp_path: Path) -> None:
    """Through a link of its own to /dev/stdout, never /dev/stdout itself: the old code,
    run as root, would have replaced the machine's /dev/stdout with a regular file."""
    link = tmp_path / "stdout"
    link.symlink_to("/dev/stdout")
    log = tmp_path / "log.txt"
    log.write_text("earlier line\n")
    with log.open("a") as fh:
        proc = _child(_WRITE, str(link), "new line\n", stdout=fh)
    assert proc.returncode == 0, proc.stderr
    assert log.read_text() == "earlier line\nnew line\n"


def test_a_symlink_to_a_file_stays_a_link_and_its_target_is_replaced(tmp_path: Path) -> None:
    real = tmp_path / "store" / "snap.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "current.json"
    link.symlink_to(Path("store") / "snap.json")
    chain = tmp_path / "latest.json"
    chain.symlink_to(link)
    write_text_atomic(chain, "new")
    assert chain.is_symlink() and link.is_symlink()
    assert real.read_text() == "new" and not real.is_symlink()
    assert sorted(p.name for p in real.parent.iterdir()) == ["snap.json"]
    dangling = tmp_path / "next.json"
    dangling.symlink_to("made-through-the-link.json")
    write_text_atomic(dangling, "made")
    assert dangling.is_symlink()
    assert (tmp_path / "made-through-the-link.json").read_text() == "made"


def test_an_existing_file_keeps_its_mode(tmp_path: Path) -> None:
    secret = tmp_path / "private.json"
    secret.write_text("old")
    secret.chmod(0o600)
    write_text_atomic(secret, "new")
    assert secret.read_text() == "new"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600


@pytest.mark.parametrize("umask", [0o077, 0o002])
def test_a_new_file_respects_the_umask(tmp_path: Path, umask: int) -> None:
    target = tmp_path / "new.json"
    proc = _child(_WRITE, str(target), "{}", umask=umask)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask


def test_a_block_device_or_socket_is_refused(tmp_path: Path) -> None:
    import socket

    sock_path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        with pytest.raises(OutputError, match=r"socket.*refusing"):
            write_text_atomic(sock_path, "x")
        assert stat.S_ISSOCK(os.lstat(sock_path).st_mode)
    block = tmp_path / "disk"
    try:
        os.mknod(block, stat.S_IFBLK | 0o600, os.makedev(7, 250))  # a loop device number
    except (PermissionError, AttributeError):
        return
    with pytest.raises(OutputError, match=r"block device.*refusing"):
        write_text_atomic(block, "x")
    assert stat.S_ISBLK(os.lstat(block).st_mode)


def test_a_folder_or_a_symlink_loop_is_an_output_error(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="is a folder"):
        write_text_atomic(tmp_path, "x")
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(OutputError, match="symbolic links"):
        write_text_atomic(tmp_path / "a", "x")


# ------------------------------------------------------------------ signals mid-write (issue 22)

_BIG_WRITE = (
    "import sys; from envguard.atomic import write_text_atomic\n"
    "print('go', flush=True)\n"
    "write_text_atomic(sys.argv[1], 'y' * (300 << 20))\n"
    "print('done', flush=True)\n"
)


def _signal_mid_write(tmp_path: Path, signum: int, code: str = _BIG_WRITE) -> tuple[int, str]:
    """Start a real child writing 300 MB over ``good.json``; send ``signum`` once its
    temporary file has data; return (exit status, stdout)."""
    target = tmp_path / "good.json"
    target.write_text("the good state\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(target)], stdout=subprocess.PIPE,
                            text=True, preexec_fn=interruptible)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "go"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        temps = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        with contextlib.suppress(FileNotFoundError):
            if temps and temps[0].stat().st_size > 0:
                break
        time.sleep(0.002)
    else:
        proc.kill()
        pytest.fail("the child never started writing")
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, out


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_mid_write_leaves_no_temporary(tmp_path: Path, signum: int) -> None:
    for _trial in range(3):
        code, _ = _signal_mid_write(tmp_path, signum)
        # The process still dies of the signal (Python re-raises an uncaught SIGINT too).
        assert code == -signum
        assert sorted(p.name for p in tmp_path.iterdir()) == ["good.json"]
        assert (tmp_path / "good.json").read_text() in ("the good state\n", "y" * (300 << 20))


def test_a_callers_own_sigterm_handler_is_kept(tmp_path: Path) -> None:
    """A program with its own SIGTERM handler (one that does not exit) sees it called, and
    the write completes: envguard replaces only the default action."""
    code = ("import signal, sys\n"
            "seen = []\n"
            "signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))\n"
            + _BIG_WRITE +
            "assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL\n"
            "print('handled', seen, flush=True)\n")
    status, out = _signal_mid_write(tmp_path, signal.SIGTERM, code)
    assert status == 0
    assert "done" in out and f"handled [{int(signal.SIGTERM)}]" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.json"]
    assert (tmp_path / "good.json").stat().st_size == 300 << 20


def test_writing_from_another_thread_installs_no_handler(tmp_path: Path) -> None:
    code = ("import signal, sys, threading\n"
            "from envguard.atomic import write_text_atomic\n"
            "seen = []\n"
            "def write():\n"
            "    seen.append(signal.getsignal(signal.SIGTERM))\n"
            "    write_text_atomic(sys.argv[1], 'from a thread')\n"
            "t = threading.Thread(target=write); t.start(); t.join()\n"
            "assert seen == [signal.SIG_DFL], seen\n"
            "assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL\n")
    proc = _child(code, str(tmp_path / "out.json"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out.json").read_text() == "from a thread"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # nor in this process


def test_fsync_before_the_rename_unless_not_durable(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The default write is durable (fsync, then rename); ``durable=False`` (memo files)
    skips only the fsync: the result is still complete and still replaced atomically.
    os.fsync is counted, not faked: it still runs."""
    calls: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    target = tmp_path / "memo.bin"
    write_bytes_atomic(target, b"one")
    assert len(calls) == 1 and target.read_bytes() == b"one"
    write_bytes_atomic(target, b"two", durable=False)
    assert len(calls) == 1 and target.read_bytes() == b"two"
    assert [p.name for p in tmp_path.iterdir()] == ["memo.bin"]


def test_a_memo_file_is_written_through_the_one_writer(tmp_path: Path) -> None:
    """envguard's memo files go through this module: private (0600), and a folder in the
    way is a message, not an exception."""
    from envguard.probe.fastpath import marshal_file

    path = tmp_path / "memo" / "records.marshal"
    assert marshal_file.save(path, ("t", 1), {"a": (1, 2)}) is None
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert marshal_file.load(path, ("t", 1)) == ({"a": (1, 2)}, None)
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    message = marshal_file.save(blocked, ("t", 1), {})
    assert message is not None and message.startswith(f"cannot write {blocked}")


def test_the_state_folder_is_made_with_a_gitignore(tmp_path: Path) -> None:
    """As `uv venv` does: `.envguard/` ignores itself, so run records never reach a commit."""
    import subprocess

    from envguard.atomic import write_text_atomic

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    write_text_atomic(tmp_path / ".envguard" / "runs" / "r.json", "{}", state_root=tmp_path)
    assert (tmp_path / ".envguard" / ".gitignore").read_text().splitlines()[-1] == "*"
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                            cwd=tmp_path, capture_output=True, text=True, check=True)
    assert status.stdout == ""
    # A folder that already exists keeps what its owner put there (no .gitignore forced).
    own = tmp_path / "other"
    (own / ".envguard").mkdir(parents=True)
    write_text_atomic(own / ".envguard" / "x.json", "{}", state_root=own)
    assert not (own / ".envguard" / ".gitignore").exists()
    # Other folders made on the way get none.
    assert not (tmp_path / ".envguard" / "runs" / ".gitignore").exists()
