"""A hostile pass over redaction: more than 100 planted secret forms, every real command.

Each secret is a unique, recognisable string (``S3cr3tVal0042``, inside a token shape
where the form needs one), planted where a real environment or a hostile user puts it:
flag, header, JSON, YAML, INI and netrc forms inside innocently named variables; the
argv of ``envguard run`` (``--user=u:X``, ``-pX``, ``-H "Authorization: token X"``);
snapshot files, run records and fleet documents written by hand or by an older envguard
(nothing masked); dict keys (a token-named folder in the inductor cache section);
``--symptom``; usage errors; paths on the command line. Then the real CLI runs as
subprocesses (snapshot, diff in three formats, lock --from, run, runs, doctor,
history, fleet diff) and every stream and every file envguard wrote is searched for
every secret: zero hits. False-positive guards, the bidi/zero-width escapes and the
linear diff are tested here too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from envguard import redact
from envguard.changes import diff
from envguard.explain import explain
from envguard.explain.report import DiffReport
from envguard.model import Environment, EnvValue, Snapshot
from envguard.render import render
from tests.paths import DATA

PY = sys.executable
SOURCE = str(Path(redact.__file__).resolve().parent.parent)
"""The envguard under test, for the subprocesses too (an editable install may name another)."""
_COUNTER = iter(range(1, 10_000))


def sv() -> str:
    """The next unique secret core: ``S3cr3tVal0001``, ``S3cr3tVal0002``, …"""
    return f"S3cr3tVal{next(_COUNTER):04d}"


@dataclasses.dataclass
class Plant:
    form: str
    where: str
    secret: str
    text: str
    """What is planted: the secret inside its form."""


PLANTS: list[Plant] = []


def plant(where: str, form: str, make: Callable[[str], str], secret: str | None = None) -> str:
    s = secret or sv()
    text = make(s)
    PLANTS.append(Plant(form=form, where=where, secret=s, text=text))
    return text


def padded(prefix: str, n: int, core: str) -> str:
    """``prefix`` + ``core`` + filler to ``n`` characters after the prefix."""
    return prefix + core + "Ab3" * ((n - len(core)) // 3 + 1)


# --- environment variables of a live snapshot ---------------------------------------
SECRET_NAMED = ["HF_TOKEN", "PIP_PASSWORD", "UV_INDEX_CORP_PASSWORD", "TORCH_HUB_PAT",
                "HF_PASSPHRASE", "TRITON_SESSION", "NCCL_AUTH_COOKIE", "TORCH_SIGNATURE",
                "HF_CREDENTIALS", "PYTORCH_AUTH", "NVIDIA_BEARER", "NVIDIA_API_KEY",
                "CUDA_PRIVATE", "HF_HUB_JWT", "TORCH_DSN", "TRITON_WEBHOOK", "UV_PUBLISH_TOKEN",
                "PIP_CLIENT_SECRET"]
LIVE_ENV: dict[str, str] = {}
for _name in SECRET_NAMED:
    LIVE_ENV[_name] = plant("env, secret name", _name, lambda s: s)

_INNOCENT_FORMS: list[tuple[str, Callable[[str], str]]] = [
    ("flag pair in a value", lambda s: f"--username ci --password {s}"),
    ("flag = in a value", lambda s: f"--password={s} --verbose"),
    ("x-token flag =", lambda s: f"--x-token={s}"),
    ("hf-token flag", lambda s: f"train --hf-token {s} --lr 3e-4"),
    ("api-key flag quoted", lambda s: f'--api-key "{s} tail"'),
    ("docker login", lambda s: f"docker login -u ci --password {s} reg.example"),
    ("header X-Api-Key", lambda s: f"X-Api-Key: {s}"),
    ("header Authorization token", lambda s: f"Authorization: token {s}"),
    ("header Authorization Bearer", lambda s: f"Authorization: Bearer {s}"),
    ("header Authorization Basic", lambda s: f"Authorization: Basic {s}=="),
    ("header Proxy-Authorization", lambda s: f"Proxy-Authorization: Basic {s}"),
    ("header Cookie", lambda s: f"Cookie: sid={s}; theme=dark"),
    ("header Cookie second", lambda s: f"Cookie: theme=dark; sid={s}"),
    ("header Private-Token", lambda s: f"Private-Token: {s}"),
    ("curl header in a command", lambda s: f'curl -H "X-Auth-Token: {s}" https://h/x'),
    ("JSON password", lambda s: f'{{"password": "{s}"}}'),
    ("JSON token no space", lambda s: f'{{"user":"u","token":"{s}"}}'),
    ("JSON api_key", lambda s: f'{{"api_key": "{s}", "n": 1}}'),
    ("JSON escaped in JSON", lambda s: f'{{\\"secret\\": \\"{s}\\"}}'),
    ("python dict repr", lambda s: f"{{'access_key': '{s}'}}"),
    ("YAML password", lambda s: f"password: {s}"),
    ("YAML token in lines", lambda s: f"user: ci\ntoken: {s}\n"),
    ("INI secret =", lambda s: f"secret = {s}"),
    ("INI client_secret =", lambda s: f"[auth]\nclient_secret = {s}"),
    ("netrc one line", lambda s: f"machine h login u password {s}"),
    ("netrc lines", lambda s: f"machine pypi.corp\n  login ci\n  password {s}\n"),
    ("netrc default", lambda s: f"default login anonymous password {s}"),
    ("curl --user=", lambda s: f"--user=alice:{s}"),
    ("curl -u pair", lambda s: f"curl -u alice:{s} https://h/"),
    ("NAME=value", lambda s: f"DB_PASSWORD={s}"),
    ("url userinfo", lambda s: f"https://deploy:{s}@pypi.corp.example/simple"),
    ("url userinfo with ://", lambda s: f"https://u:pa://{s}@h.example/"),
    ("url userinfo ://-first", lambda s: f"https://u:{s}://x@h.example/"),
    ("url userinfo IPv6 host", lambda s: f"https://u:{s}@[::1]:8080/simple"),
    ("url userinfo no scheme", lambda s: f"deploy:{s}@pypi2.corp.example/simple"),
    ("anaconda long token", lambda s: f"https://conda.anaconda.org/t/{s}abcdefgh/ch"),
    ("query token", lambda s: f"https://hf.example/api?user=me&token={s}"),
    ("query sig", lambda s: f"https://a.blob.core.windows.net/c/w.pt?sv=1&sig={s}"),
    ("azure AccountKey", lambda s: f"DefaultEndpointsProtocol=https;AccountKey={s};"),
    ("bearer in text", lambda s: f"use Bearer {s}abcdef please"),
    ("ghp token in a path", lambda s: "/tmp/" + padded("ghp_", 36, s) + "/lib"),
    ("github_pat", lambda s: padded("github_pat_", 82, s)),
    ("hf_ token", lambda s: padded("hf_", 34, s)),
    ("glpat", lambda s: padded("glpat-", 20, s)),
    ("openai sk-", lambda s: padded("sk-proj-", 40, s)),
    ("slack xoxb", lambda s: "xoxb-123456789012-" + s + "abcdefgh"),
    ("pypi-", lambda s: padded("pypi-", 60, s)),
    ("npm_", lambda s: padded("npm_", 36, s)),
    ("wandb login KEY", lambda s: "wandb login --relogin " + padded("", 40, s)),
    ("NVIDIA nvapi-", lambda s: padded("nvapi-", 64, s)),
    ("Replicate r8_", lambda s: padded("r8_", 37, s)),
    ("Groq gsk_", lambda s: padded("gsk_", 52, s)),
    ("LangSmith lsv2_pt_", lambda s: padded("lsv2_pt_", 43, s)),
    ("glued after a key", lambda s: "AKIAIOSFODNN7EXAMPLE" + padded("npm_", 36, s)),
]
LIVE_ENV["TORCH_CONDA_CHANNEL"] = plant(  # a short token: the core is the whole token
    "env, innocent name", "anaconda short token",
    lambda s: f"https://conda.anaconda.org/t/{s}/channel", secret="Qz7-Kx9W")  # noqa: S106
_FAMILIES = ["TORCH", "TRITON", "HF", "PIP", "UV", "NCCL", "CUDA", "PYTORCH", "NVIDIA"]
for _i, (_form, _make) in enumerate(_INNOCENT_FORMS):
    LIVE_ENV[f"{_FAMILIES[_i % len(_FAMILIES)]}_NOTE{_i}"] = plant(
        "env, innocent name", _form, _make)

# --- argv of envguard run -----------------------------------------------------------
RUN_ARGV: list[str] = []
for _form, _words in [
    ("--token X", lambda s: ["--token", s]),
    ("--password=X", lambda s: [f"--password={s}"]),
    ("password=X", lambda s: [f"password={s}"]),
    ("-p X", lambda s: ["-p", s]),
    ("-pX (mysql)", lambda s: [f"-p{s}"]),
    ("--user=u:X", lambda s: [f"--user=alice:{s}"]),
    ("-u u:X (curl)", lambda s: ["-u", f"alice:{s}"]),
    ("-uu:X", lambda s: [f"-ualice:{s}"]),
    ("-H 'Authorization: token X'", lambda s: ["-H", f"Authorization: token {s}"]),
    ("'Authorization: token X' one word", lambda s: [f"Authorization: token {s}"]),
    ("-HAuthorization:", lambda s: [f"-HAuthorization: Bearer {s}"]),
    ("-HX-Api-Key:", lambda s: [f"-HX-Api-Key: {s}"]),
    ("--header=X-Api-Key:", lambda s: [f"--header=X-Api-Key: {s}"]),
    ("--hf-token X", lambda s: ["--hf-token", s]),
    ("url in argv", lambda s: ["--data", f"https://u:{s}@h.example/d"]),
    ("JSON in argv", lambda s: ["--config", f'{{"api_key": "{s}"}}']),
    ("-Dprop=X (Java)", lambda s: [f"-Dfs.s3a.secret.key={s}"]),
    ("login KEY (wandb)", lambda s: ["login", "--relogin", padded("", 40, s)]),
]:
    _s = sv()
    PLANTS.append(Plant(form=_form, where="run argv", secret=_s, text=" ".join(_words(_s))))
    RUN_ARGV += _words(_s)
RUN_ARGV += ["--lr", "3e-4", "--password-file", "/run/secrets/pw"]

# --- hand-written (old, unmasked) snapshot ------------------------------------------
OLD_VARS = {
    "HF_TOKEN": plant("old snapshot", "secret name, unmasked", lambda s: s),
    "WANDB_API_KEY": plant("old snapshot", "secret name, masked flag false", lambda s: s),
    "TORCH_DOCKER": plant("old snapshot", "flag form unmasked",
                          lambda s: f"--username ci --password {s}"),
    "TORCH_HDR": plant("old snapshot", "header unmasked", lambda s: f"X-Api-Key: {s}"),
    "TORCH_JSON": plant("old snapshot", "JSON unmasked", lambda s: f'{{"password": "{s}"}}'),
    "PIP_INDEX_URL": plant("old snapshot", "url unmasked", lambda s: f"https://u:{s}@h/simple"),
}
OLD_KEY = plant("old snapshot", "dict key (inductor cache entry)",
                lambda s: padded("ghp_", 36, s))
OLD_KEY2 = plant("old snapshot", "dict key with a form", lambda s: f"token={s}")
OLD_ERROR = plant("old snapshot", "error message", lambda s: f"cannot read --password {s}")
OLD_DIRECT = plant("old snapshot", "direct_url", lambda s: f"https://ci:{s}@git.example/r.git")
OLD_PATH = plant("old snapshot", "sys.path entry", lambda s: "/opt/" + padded("hf_", 34, s))

# --- hand-written run record ---------------------------------------------------------
RECORD_ARGV = [
    plant("old run record", "--user=u:X", lambda s: f"--user=alice:{s}"),
    plant("old run record", "-pX", lambda s: f"-p{s}"),
    plant("old run record", "Authorization one word", lambda s: f"Authorization: token {s}"),
    plant("old run record", "--token=X", lambda s: f"--token={s}"),
]
RECORD_LOCK = plant("old run record", "lock field", lambda s: f"train?token={s}")

# --- fleet document --------------------------------------------------------------------
FLEET_VAR = plant("fleet document", "secret name unmasked", lambda s: s)
FLEET_HOST = plant("fleet document", "host field", lambda s: "node-" + padded("ghp_", 36, s))
FLEET_FORM = plant("fleet document", "netrc in a value", lambda s: f"machine h password {s}")

# --- symptoms, usage errors, paths ---------------------------------------------------
SYMPTOMS = [
    plant("--symptom", "--token=X", lambda s: f"HTTP 401 with --token={s}"),
    plant("--symptom", "Authorization header", lambda s: f"sent Authorization: Bearer {s}x"),
    plant("--symptom", "url userinfo", lambda s: f"cannot reach https://u:{s}@idx/simple"),
    plant("--symptom", "YAML password", lambda s: f"config has password: {s}"),
]
USAGE = [
    ["diff", plant("usage error", "--token=X", lambda s: f"--token={s}"), "a", "b"],
    ["snapshot", "--password", plant("usage error", "--password X", lambda s: s)],
    ["runs", plant("usage error", "-pX", lambda s: f"-p{s}")],
    ["lock", "x", plant("usage error", "--hf-token=X", lambda s: f"--hf-token={s}")],
    ["doctor", plant("usage error", "--user=u:X", lambda s: f"--user=alice:{s}")],
]
PATH_TOKEN = plant("path on the command line", "ghp_ folder", lambda s: padded("ghp_", 36, s))

CHANGED = {"HF_TOKEN": "S3cr3tChanged01", "TORCH_NOTE0": "--password S3cr3tChanged02"}

MUST_STAY = {
    "TORCH_TRAIN_ARGS": "--lr 3e-4 --epochs 3",
    "TORCH_LAUNCH_FLAGS": "--password-file /run/secrets/pw",
    "HF_HUB_ENABLE_HF_TRANSFER": "1",
    "TORCH_PKGS": "hf_transfer tokenizers==0.15 keyring",
    "PIP_KEYRING_PROVIDER": "subprocess",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:128",
    "TORCH_EXTRA_PATH": "/opt/hf_transfer/bin:/usr/local/cuda-12.8/bin",
    "HF_TOKENIZERS_PARALLELISM": "false",
    "TORCH_DOCKER_USER": "--user 1000:1000",
    "TORCH_HOME": "/data/tokens/cache",
}


# ------------------------------------------------------------------------ the world

@dataclasses.dataclass
class World:
    root: Path
    project: Path
    inputs: Path
    home: Path
    env: dict[str, str]
    outputs: list[tuple[str, str]]
    planted: list[Path]

    def envguard(self, *args: object, codes: tuple[int, ...] = (0,),
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([PY, "-m", "envguard", *map(str, args)], cwd=self.project,
                              env=env or self.env, capture_output=True, text=True,
                              timeout=240, check=False)
        what = " ".join(map(str, args))
        self.outputs += [(f"stdout of {what}", proc.stdout), (f"stderr of {what}", proc.stderr)]
        assert proc.returncode in codes, f"{what}: {proc.returncode}\n{proc.stderr[-2000:]}"
        return proc


def _old_snapshot(good: dict[str, Any]) -> dict[str, Any]:
    """``good`` as an older envguard of this user (same mask key) or a hand would have
    left it: these secrets not masked."""
    doc = json.loads(json.dumps(good))
    variables = doc["environment"]["variables"]
    for name, value in OLD_VARS.items():
        variables[name] = {"value": value, "masked": name == "WANDB_API_KEY", "digest": None}
    inductor = next(c for c in doc["caches"] if c["kind"] == "inductor")
    inductor["entries"] = {OLD_KEY: 3, OLD_KEY2: 1, "fxgraph": 2}
    doc["errors"].append({"section": "files", "message": OLD_ERROR, "path": None})
    doc["interpreter"]["sys_path"].append(OLD_PATH)
    if doc["packages"]:
        doc["packages"][0]["direct_url"] = {"url": OLD_DIRECT, "commit_id": None,
                                            "archive_hash": None, "editable": False,
                                            "vcs": "git"}
    return doc


def _old_record(project: Path, good_digest: str) -> Path:
    runs = project / ".envguard" / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    path = runs / "20200101T000000000000Z-old.run.json"
    path.write_text(json.dumps({
        "schema": "envguard.run/2", "argv": ["python", "train.py", *RECORD_ARGV],
        "lock": RECORD_LOCK, "lockfile": None, "entry": None, "exit_code": 0,
        "signal": None, "passed": True, "forced": False, "findings": [],
        "snapshot": good_digest, "started_at": "2020-01-01T00:00:00.000Z",
        "ended_at": "2020-01-01T00:00:01.000Z"}))
    return path


def _run_everything(w: World) -> None:
    vpy = PY
    w.envguard("snapshot", "-o", "good.json", "--python", vpy, "-q")
    changed = {**w.env, **CHANGED}
    w.envguard("snapshot", "-o", "new.json", "--python", vpy, "-q", env=changed)
    token_dir = w.project / PATH_TOKEN
    token_dir.mkdir()
    w.envguard("snapshot", "-o", token_dir / "snap.json", "--python", vpy)
    good = json.loads((w.project / "good.json").read_text())
    old = w.inputs / "old.json"
    old.write_text(json.dumps(_old_snapshot(good)))
    fleet = w.inputs / "fleet.json"
    member = json.loads(json.dumps(good))
    member["environment"]["variables"]["HF_TOKEN"] = {"value": FLEET_VAR, "masked": False,
                                                       "digest": None}
    member["environment"]["variables"]["TORCH_NETRC"] = {"value": FLEET_FORM,
                                                          "masked": False, "digest": None}
    fleet.write_text(json.dumps({"schema": "envguard.fleet/1", "world_size": 2, "snapshots": [
        {"rank": 0, "host": FLEET_HOST, "snapshot": member},
        {"rank": 1, "host": "node-b", "snapshot": good}]}))
    w.planted += [old, fleet]
    for fmt in ("text", "json", "markdown"):
        w.envguard("diff", "good.json", "new.json", "--format", fmt, codes=(1,))
        w.envguard("diff", old, "new.json", "--format", fmt, "--all", codes=(1,))
        w.envguard("diff", old, "good.json", "--format", fmt, codes=(0, 1))
        w.envguard("diff", token_dir / "snap.json", "good.json", "--format", fmt, codes=(0, 1))
        for symptom in SYMPTOMS:
            w.envguard("diff", "good.json", "new.json", "--format", fmt, "--symptom", symptom,
                       codes=(1,))
    w.envguard("lock", "old-train", "--from", old)
    w.envguard("lock", "train", "--from", "good.json")
    w.envguard("run", "--lock", "lockfiles/train.toml", "--force", "--", vpy, "-c", "pass",
               *RUN_ARGV, codes=(0, 1, 3))
    w.planted.append(_old_record(w.project, "sha256-" + "0" * 64))
    for fmt in ("text", "json", "markdown"):
        proc = w.envguard("runs", "--format", fmt)
        assert proc.stdout
        w.envguard("doctor", "--python", vpy, "--format", fmt, "--symptom", SYMPTOMS[0],
                   codes=(0, 1))
        w.envguard("history", "--python", vpy, "--format", fmt, codes=(0, 1))
        w.envguard("fleet", "diff", fleet, old, "new.json", "--format", fmt, codes=(0, 1))
    for args in USAGE:
        w.envguard(*args, codes=(2,))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    root = tmp_path_factory.mktemp("hostile-secrets")
    project, inputs, home = root / "project", root / "inputs", root / "home"
    for folder in (project, inputs, home):
        folder.mkdir()
    (project / "pyproject.toml").write_text('[project]\nname = "p"\nversion = "0"\n')
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ENVGUARD_", "HF_", "TORCH", "PIP_", "UV_", "NCCL_"))}
    env.update({"ENVGUARD_CACHE_DIR": str(home / "cache"), "XDG_CONFIG_HOME": str(home / "cfg"),
                "XDG_CACHE_HOME": str(home / "xdg"), "TORCHINDUCTOR_CACHE_DIR": str(home / "ind"),
                "TRITON_CACHE_DIR": str(home / "triton"), "HOME": str(home),
                "GIT_CEILING_DIRECTORIES": str(root), "COLUMNS": "200", "PYTHONPATH": SOURCE})
    env.update(MUST_STAY)
    env.update(LIVE_ENV)
    w = World(root=root, project=project, inputs=inputs, home=home, env=env, outputs=[],
              planted=[])
    _run_everything(w)
    return w


def test_no_planted_secret_reaches_any_output(world: World) -> None:
    assert len(PLANTS) >= 100  # distinct forms, each with its own secret
    assert len({p.secret for p in PLANTS}) == len(PLANTS)
    assert all(p.secret in p.text for p in PLANTS)
    files = sorted(p for f in (world.project, world.home) for p in f.rglob("*")
                   if p.is_file() and p not in world.planted)
    names = {p.relative_to(world.root).as_posix() for p in files}
    assert {"project/good.json", "project/new.json", "project/lockfiles/old-train.toml",
            "project/lockfiles/train.toml"} <= names
    assert any(n.startswith("project/lockfiles/old-train.snapshots/") for n in names)
    assert sum(n.endswith(".run.json") for n in names) >= 1
    haystacks = [(str(p), p.read_bytes()) for p in files]
    haystacks += [(what, text.encode()) for what, text in world.outputs]
    leaks = [f"{p.secret} ({p.where}: {p.form}) in {where}"
             for p in PLANTS for where, data in haystacks if p.secret.encode() in data]
    leaks += [f"{v} in {where}" for v in CHANGED.values() for where, data in haystacks
              if v.split()[-1].encode() in data]
    assert not leaks, "\n".join(leaks[:60]) + f"\n({len(leaks)} in all)"


def test_the_search_is_not_vacuous(world: World) -> None:
    """The secrets are where the test put them, and the commands said something."""
    assert all(p.secret in (world.inputs / "old.json").read_text()
               for p in PLANTS if p.where == "old snapshot")
    record = next(p for p in world.planted if p.name.endswith(".run.json"))
    assert all(a in record.read_text() for a in RECORD_ARGV)
    outputs = "\n".join(text for _, text in world.outputs)
    assert "***" in outputs and "<masked" in outputs
    runs = [t for what, t in world.outputs if what.startswith("stdout of runs --format json")]
    assert any("-p***" in t for t in runs) and any("--user=alice:***" in t for t in runs)


def test_values_that_must_stay_are_recorded_as_they_are(world: World) -> None:
    variables = json.loads((world.project / "good.json").read_text())["environment"]["variables"]
    for name, value in MUST_STAY.items():
        assert variables[name] == {"value": value, "masked": False, "digest": None}, name
    (path,) = [p for p in (world.project / ".envguard" / "runs").glob("*.run.json")
               if p not in world.planted]
    record = json.loads(path.read_text())
    assert record["argv"][-4:] == ["--lr", "3e-4", "--password-file", "/run/secrets/pw"]


def test_an_unmasked_secret_read_from_an_old_file_is_masked_with_a_digest(
        world: World) -> None:
    proc = world.envguard("diff", world.inputs / "old.json", "good.json", "--format", "json",
                          codes=(0, 1))
    changes = {c["key"]: c for c in json.loads(proc.stdout)["changes"]
               if c["section"] == "environment"}
    # HF_TOKEN: the same raw value on both sides? No: the live one is another secret, and
    # both digests are under this user's key, so the change is seen without a value.
    assert changes["HF_TOKEN"]["old"] == "<masked>"
    assert changes["HF_TOKEN"]["new"] == "<masked, changed>"
    lock_snap = next((world.project / "lockfiles" / "old-train.snapshots").glob("*.json"))
    variables = json.loads(lock_snap.read_text())["environment"]["variables"]
    assert variables["HF_TOKEN"]["value"] is None and variables["HF_TOKEN"]["digest"]
    assert variables["TORCH_DOCKER"]["value"] == "--username ci --password ***"


def test_a_file_under_no_key_takes_this_users_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from envguard.probe.envvars import key_id
    from envguard.snapshot_file import remask

    monkeypatch.setenv("ENVGUARD_MASK_KEY", "k" * 32)
    base = Snapshot.from_json((DATA / "h200-snapshot.json")
                              .read_text())
    old = dataclasses.replace(base, environment=Environment(variables={
        "HF_TOKEN": EnvValue(value="S3cr3tRaw1")}))
    other = dataclasses.replace(base, environment=Environment(variables={
        "HF_TOKEN": EnvValue(value="S3cr3tRaw2")}))
    a, b = remask(old), remask(other)
    assert a.environment.mask_key_id == key_id(b"k" * 32)
    assert a.environment.variables["HF_TOKEN"].value is None
    changes = diff(a, b).find("environment")
    assert [(c.old, c.new) for c in changes] == [("<masked>", "<masked, changed>")]
    assert not diff(a, remask(old)).find("environment")
    foreign = dataclasses.replace(old, environment=dataclasses.replace(
        old.environment, mask_key_id="0123456789ab"))
    assert remask(foreign).environment.variables["HF_TOKEN"] == EnvValue(
        value=None, masked=True, digest=None)  # no digest compares with that file's own


def test_a_usage_error_names_the_flag_but_not_its_value(world: World) -> None:
    proc = world.envguard("diff", "--token=S3cr3tUsage9", "a", "b", codes=(2,))
    assert "--token=***" in proc.stderr and "S3cr3tUsage9" not in proc.stderr


# ------------------------------------------------------------------------ unit guards

def test_every_planted_value_form_is_masked_by_redact_text() -> None:
    leaks = []
    for plant_ in PLANTS:
        if plant_.where == "env, secret name":
            assert redact.secret_name(plant_.form)
        elif plant_.where == "env, innocent name":
            out = redact.redact_text(plant_.text)
            if plant_.secret in out:
                leaks.append(f"{plant_.form}: {out!r}")
            assert redact.redact_text(out) == out  # idempotent
    assert not leaks, "\n".join(leaks)


INNOCENT = [
    "--lr 3e-4", "--password-file /run/secrets/pw", "--token-path=/run/tok", "hf_transfer",
    "tokenizers==0.15.2", "keyring ; extra == 'keyring'", "subprocess", "/data/tokens/cache",
    "expandable_segments:True", "HF_TOKEN: <masked> → <masked, changed>", "-u 1000:1000",
    "https://pypi.org/simple", "/home/u/.cache/huggingface/token", "pattern: a*b",
    "the token expired at 12:00", "compat_key cu128", "PASSWORD_FILE=/x",
    "git+https://github.com/org/repo@v1.2", "machine learning with login pages",
]


def test_innocent_values_stay() -> None:
    changed = {v: redact.redact_text(v) for v in INNOCENT if redact.redact_text(v) != v}
    assert not changed


def test_argv_forms() -> None:
    assert redact.redact_argv(["curl", "-u", "bob:pw1", "-ubob:pw2", "--user=bob:pw3", "-ppw4",
                               "-H", "Authorization: token pw5", "-HCookie: a=pw6",
                               "--lr", "3e-4"]) == [
        "curl", "-u", "bob:***", "-ubob:***", "--user=bob:***", "-p***",
        "-H", "Authorization: token ***", "-HCookie: ***", "--lr", "3e-4"]


def test_a_flag_and_its_value_as_list_items() -> None:
    """An argv logged as a JSON or Python list: the item after a secret flag goes."""
    assert redact.redact_text('{"argv": ["train", "--hf-token", "pw10", "--lr", "3e-4"]}') \
        == '{"argv": ["train", "--hf-token", "***", "--lr", "3e-4"]}'
    assert redact.redact_text("['-password', 'pw11', '--password-file', '/run/pw']") \
        == "['-password', '***', '--password-file', '/run/pw']"
    assert redact.redact_text('["--max-tokens", "512", "tokens, more"]') \
        == '["--max-tokens", "512", "tokens, more"]'


def test_token_counts_are_not_credentials() -> None:
    """``--max-tokens`` and friends are how many text tokens, in nearly every ML command
    line: kept. A credential that happens to sit beside them still goes."""
    assert redact.redact_argv(["serve", "--max-tokens", "512", "--max-new-tokens=64",
                               "--num-tokens", "8", "--hf-token", "pw7", "--token", "pw8",
                               "MAX_HF_TOKEN=pw9"]) == [
        "serve", "--max-tokens", "512", "--max-new-tokens=64", "--num-tokens", "8",
        "--hf-token", "***", "--token", "***", "MAX_HF_TOKEN=***"]


def test_dict_keys_are_scrubbed_and_never_merged() -> None:
    a, b = padded("ghp_", 36, "S3cr3tKeyA1"), padded("ghp_", 36, "S3cr3tKeyB2")
    out = redact.redact_data({"entries": {a: 1, b: 2, "plain": 3}})
    assert out == {"entries": {"***": 1, "***#2": 2, "plain": 3}}
    same = {"entries": {"plain": 1}}
    assert redact.redact_data(same) is same


def test_remask_keeps_an_existing_digest_and_masks_by_name() -> None:
    env = Environment(variables={
        "HF_TOKEN": EnvValue(value="raw", masked=False),
        "TORCH_X": EnvValue(value="--password raw2", masked=True, digest="hmac-sha256:ab"),
        "TORCH_Y": EnvValue(value="plain")}, mask_key_id="k")
    out = redact.remask_environment(env, lambda name, value: f"d:{name}")
    assert out.variables["HF_TOKEN"] == EnvValue(value=None, masked=True, digest="d:HF_TOKEN")
    assert out.variables["TORCH_X"] == EnvValue(value="--password ***", masked=True,
                                                digest="hmac-sha256:ab")
    assert out.variables["TORCH_Y"] is env.variables["TORCH_Y"]
    assert redact.remask_environment(out) is out


# ------------------------------------------------------------------------ bidi, zero-width

INVISIBLE = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c" \
            "\u200b\u200c\u200d\u2060\ufeff"


def test_bidi_and_zero_width_characters_are_escaped_everywhere(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENVGUARD_", "TORCH"))}
    env.update({"XDG_CONFIG_HOME": str(tmp_path / "cfg"), "HOME": str(tmp_path),
                "ENVGUARD_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": SOURCE,
                "TORCH_TRICK": "safe" + INVISIBLE + "evil"})

    def run(*args: object, codes: tuple[int, ...] = (0, 1)) -> str:
        proc = subprocess.run([PY, "-m", "envguard", *map(str, args)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=240, check=False,
                              encoding="utf-8")
        assert proc.returncode in codes, proc.stderr
        return proc.stdout + proc.stderr

    run("snapshot", "-o", "a.json", "--python", PY)
    env["TORCH_TRICK"] = "other" + INVISIBLE
    run("snapshot", "-o", "b\u202egnp.json", "--python", PY)
    seen = [run("diff", "a.json", "b\u202egnp.json", "--format", fmt, "--all",
                "--symptom", "x\u202ey") for fmt in ("text", "markdown", "json")]
    seen.append(run("diff", "missing\u202e\u200b.json", "a.json", codes=(2,)))
    seen.append(run("diff", "--bogus\u2066", codes=(2,)))
    for out in seen:
        assert not set(out) & set(INVISIBLE), [c for c in out if c in INVISIBLE][:3]
    assert "\\u202e" in seen[0] and "\\u202e" in seen[1] and "\\u202e" in seen[3]


# ------------------------------------------------------------------------ linear diff

def _pair(n: int) -> tuple[Snapshot, Snapshot]:
    base = Snapshot.from_json((DATA / "h200-snapshot.json")
                              .read_text())

    def with_vars(tag: str) -> Snapshot:
        variables = {f"TORCH_X{i}": EnvValue(value=f"{tag}{i}") for i in range(n)}
        return dataclasses.replace(base, environment=Environment(variables=variables))

    return with_vars("v"), with_vars("w")


def _work(n: int, fmt: str) -> tuple[int, int]:
    """Python and C calls made, and the longest text rich split, for diff, explain and
    render of ``n`` changed variables."""
    from rich.segment import Segment

    old, new = _pair(n)
    calls = 0
    longest = 0
    original = Segment.split_and_crop_lines.__func__  # type: ignore[attr-defined]

    def spy(cls: type, segments: Any, *args: Any, **kw: Any) -> Any:
        def watch() -> Any:
            nonlocal longest
            for segment in segments:
                longest = max(longest, len(segment.text))
                yield segment
        return original(cls, watch(), *args, **kw)

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    Segment.split_and_crop_lines = classmethod(spy)  # type: ignore[method-assign,assignment]
    sys.setprofile(count)
    try:
        changes = diff(old, new)
        report = DiffReport(old_name="a", new_name="b", diff=changes,
                            findings=tuple(explain(old, new, changes, None)))
        render(report, fmt, show_all=True)
    finally:
        sys.setprofile(None)
        Segment.split_and_crop_lines = classmethod(original)  # type: ignore[method-assign,assignment]
    return calls, longest


@pytest.mark.parametrize("fmt", ["text", "markdown", "json"])
def test_the_diff_is_linear_in_the_number_of_changes(fmt: str) -> None:
    small, small_longest = _work(500, fmt)
    large, large_longest = _work(2000, fmt)
    assert large / small < 4 * 1.25, (small, large)  # 4x the changes: about 4x the calls
    assert large_longest <= max(small_longest, 2000)  # no text rich splits grows with it
