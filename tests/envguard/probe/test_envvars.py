"""Environment variables: allowlisted, secrets masked by keyed HMAC, changes still visible."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from envguard import redact, redact_forms, redact_shapes
from envguard.model import Environment, ProbeIssue
from envguard.probe import SnapshotOptions, collect, envvars
from envguard.snapshot_file import read_snapshot
from tests.paths import DATA

HF = "hf_q8Zr7XyWsecretTOKENvalue0001"
OPENAI = "sk-proj-Zq3secretOPENAIkey9876"
PIP_URL = "https://user:hunter2@host/simple"


@pytest.mark.parametrize(("name", "secret"), [
    ("HF_TOKEN", True), ("HUGGING_FACE_HUB_TOKEN", True), ("WANDB_API_KEY", True),
    ("AWS_SECRET_ACCESS_KEY", True), ("PIP_PASSWORD", True), ("MY_APIKEY", True),
    ("OPENAI_API_KEY", True), ("UV_INDEX_CORP_PASSWORD", True), ("GITHUBTOKEN", True),
    ("HF_TOKEN2", True), ("GITHUB_TOKEN_1", True), ("DB_PASSWD", True), ("hf_token", True),
    ("AZURE_STORAGE_SAS", True), ("UV_PUBLISH_TOKEN", True), ("NCCL_AUTH_COOKIE", True),
    ("PATH", False), ("PWD", False), ("OLDPWD", False), ("LD_LIBRARY_PATH", False),
    ("CUDA_VISIBLE_DEVICES", False), ("TORCH_COMPILE_CACHE_KEY_TAG", False),
    # KEYBOARD starts with KEY but is not a key; a keyring provider names a tool, not a secret.
    ("KEYBOARD_LAYOUT", False), ("PIP_KEYRING_PROVIDER", False),
    ("TOKENIZERS_PARALLELISM", False), ("PYTORCH_CUDA_ALLOC_CONF", False),
])
def test_looks_secret(name: str, secret: bool) -> None:
    assert envvars.looks_secret(name) is secret


def _collect(env: dict[str, str], extra: tuple[str, ...] = ()) -> tuple[Environment,
                                                                        list[ProbeIssue]]:
    issues: list[ProbeIssue] = []
    return envvars.collect(env, extra, issues), issues


def test_only_allowlisted_families_are_recorded() -> None:
    env = {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "INFO",
           "HOME": "/root", "SHELL": "/bin/bash", "WANDB_API_KEY": "w", "WANDB_PROJECT": "p",
           "ENVGUARD_MASK_KEY": "the-key", "ENVGUARD_CACHE_DIR": "/c", "RANDOM": "1"}
    environment, issues = _collect(env)
    assert issues == []
    assert sorted(environment.variables) == ["CUDA_VISIBLE_DEVICES", "ENVGUARD_CACHE_DIR",
                                             "NCCL_DEBUG", "PATH"]
    assert environment.variables["NCCL_DEBUG"].value == "INFO"
    assert not environment.variables["PATH"].masked
    assert environment.mask_key_id is None  # nothing was masked, so no key was needed
    extra, _ = _collect(env, ("WANDB_*",))
    assert extra.variables["WANDB_PROJECT"].value == "p"
    assert extra.variables["WANDB_API_KEY"].masked
    assert extra.variables["WANDB_API_KEY"].value is None
    assert "ENVGUARD_MASK_KEY" not in extra.variables  # the key itself is never recorded


def test_digests_detect_changes_without_revealing_values() -> None:
    first, _ = _collect({"HF_TOKEN": HF, "HF_HUB_TOKEN": HF})
    again, _ = _collect({"HF_TOKEN": HF})
    changed, _ = _collect({"HF_TOKEN": HF + "x"})
    token = first.variables["HF_TOKEN"]
    assert token.value is None and token.masked
    assert token.digest is not None and token.digest.startswith("hmac-sha256:")
    assert HF not in token.digest
    assert again.variables["HF_TOKEN"].digest == token.digest
    assert changed.variables["HF_TOKEN"].digest != token.digest
    # The name is part of the MAC: two variables holding one token do not look alike.
    assert first.variables["HF_HUB_TOKEN"].digest != token.digest
    key = envvars.mask_key_path().read_bytes().strip()
    assert first.mask_key_id == again.mask_key_id == envvars.key_id(key)
    assert first.mask_key_id is not None and len(first.mask_key_id) == 12


def test_key_file_is_private_and_persistent(tmp_path: Path) -> None:
    old = os.umask(0)  # even with a permissive umask
    try:
        first, issues = _collect({"HF_TOKEN": HF})
    finally:
        os.umask(old)
    assert issues == []
    path = envvars.mask_key_path()
    assert path.is_relative_to(Path(os.environ["XDG_CONFIG_HOME"]))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert first.mask_key_id == envvars.key_id(path.read_bytes().strip())
    assert HF.encode() not in path.read_bytes()


def test_empty_key_file_is_replaced_not_a_one_off_key_forever() -> None:
    path = envvars.mask_key_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")
    first, issues = _collect({"HF_TOKEN": HF})
    assert issues == []
    assert path.read_bytes().strip()
    second, _ = _collect({"HF_TOKEN": HF})
    assert first.variables["HF_TOKEN"].digest == second.variables["HF_TOKEN"].digest


def test_unwritable_key_location_uses_a_one_off_key(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")  # a file where the config folder should be: fails even for root
    monkeypatch.setenv("XDG_CONFIG_HOME", str(blocker))
    environment, issues = _collect({"HF_TOKEN": HF})
    assert environment.variables["HF_TOKEN"].digest
    assert [i.section for i in issues] == ["environment"]
    assert "one-off key" in issues[0].message


def test_explicit_mask_key_makes_digests_reproducible(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def on_node(node: str, env: dict[str, str]) -> Environment:
        monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / node))  # its own key file
        return _collect(env)[0]

    a, b = on_node("a", {"HF_TOKEN": HF}), on_node("b", {"HF_TOKEN": HF})
    assert a.mask_key_id != b.mask_key_id
    assert a.variables["HF_TOKEN"].digest != b.variables["HF_TOKEN"].digest
    shared = {"HF_TOKEN": HF, "ENVGUARD_MASK_KEY": "cluster-wide-key"}
    c, d = on_node("c", shared), on_node("d", shared)
    assert c.mask_key_id == d.mask_key_id == envvars.key_id(b"cluster-wide-key")
    assert c.variables["HF_TOKEN"].digest == d.variables["HF_TOKEN"].digest
    assert not (tmp_path / "c" / "envguard" / "mask.key").exists()
    # The CLI snapshots os.environ itself.
    monkeypatch.setenv("ENVGUARD_MASK_KEY", "cluster-wide-key")
    monkeypatch.setenv("HF_TOKEN", HF)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "e"))
    e = envvars.collect(os.environ, (), [])
    assert e.variables["HF_TOKEN"].digest == c.variables["HF_TOKEN"].digest


@pytest.mark.parametrize(("value", "redacted", "leak"), [
    (PIP_URL, "https://***@host/simple", "hunter2"),
    ("https://__token__:pypi-AgEIcHlw@upload.example/simple/", "https://***@upload.example/simple/",
     "pypi-AgEIcHlw"),
    ("https://user:p@ss@host/simple", "https://***@host/simple", "ss@"),  # a raw @ in it
    ("https://ghp_abc123@github.com/x.git", "https://***@github.com/x.git", "ghp_abc123"),
    ("https://a:one@h1/s https://b:two@h2/s", "https://***@h1/s https://***@h2/s", "two"),
])
def test_url_credentials_are_redacted(value: str, redacted: str, leak: str) -> None:
    environment, _ = _collect({"PIP_INDEX_URL": value, "UV_INDEX_URL": value})
    for name in ("PIP_INDEX_URL", "UV_INDEX_URL"):
        entry = environment.variables[name]
        assert entry.value == redacted
        assert entry.masked and entry.digest
        assert leak not in (entry.value or "")


def test_url_credential_change_is_detectable() -> None:
    first, _ = _collect({"PIP_INDEX_URL": PIP_URL})
    second, _ = _collect({"PIP_INDEX_URL": PIP_URL.replace("hunter2", "hunter3")})
    plain, _ = _collect({"PIP_INDEX_URL": "https://host/simple"})
    a, b = first.variables["PIP_INDEX_URL"], second.variables["PIP_INDEX_URL"]
    assert a.value == b.value
    assert a.digest != b.digest
    assert plain.variables["PIP_INDEX_URL"].value == "https://host/simple"
    assert not plain.variables["PIP_INDEX_URL"].masked


def test_masked_values_appear_nowhere_in_the_snapshot(clean_cwd: Path) -> None:
    env = {**os.environ, "HF_TOKEN": HF, "HUGGING_FACE_HUB_TOKEN": HF, "OPENAI_API_KEY": OPENAI,
           "PIP_INDEX_URL": PIP_URL, "PIP_EXTRA_INDEX_URL": "https://u:hunter2@other/simple",
           "TORCH_SECRET_THING": OPENAI}
    (clean_cwd / "pyproject.toml").write_text('[tool.envguard]\nenv = ["OPENAI_*"]\n')
    snapshot = collect(SnapshotOptions(cwd=clean_cwd, env=env, verify="none"))
    text = snapshot.to_json()
    for secret in (HF, OPENAI, "hunter2"):
        assert secret not in text
    variables = snapshot.environment.variables
    assert {"HF_TOKEN", "OPENAI_API_KEY", "TORCH_SECRET_THING"} <= set(variables)
    assert all(variables[n].masked for n in ("HF_TOKEN", "OPENAI_API_KEY", "PIP_INDEX_URL"))
    assert snapshot.environment.mask_key_id
    assert snapshot.validate() == snapshot


def test_cli_never_prints_secrets(clean_cwd: Path) -> None:
    env = {**os.environ, "HF_TOKEN": HF, "OPENAI_API_KEY": OPENAI, "PIP_INDEX_URL": PIP_URL,
           "ENVGUARD_MASK_KEY": "k3y-that-is-also-secret"}
    (clean_cwd / "pyproject.toml").write_text('[tool.envguard]\nenv = ["OPENAI_*"]\n')
    proc = subprocess.run([sys.executable, "-m", "envguard", "snapshot", "--json", "--verify",
                           "none", "--no-cache-marker"], capture_output=True, text=True,
                          env=env, cwd=clean_cwd, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip()  # the summary was printed, and checked below
    for secret in (HF, OPENAI, "hunter2", "k3y-that-is-also-secret"):
        assert secret not in proc.stdout
        assert secret not in proc.stderr
    variables = json.loads(proc.stdout)["environment"]["variables"]
    assert variables["HF_TOKEN"] == {"value": None, "masked": True,
                                     "digest": variables["HF_TOKEN"]["digest"]}
    assert variables["OPENAI_API_KEY"]["masked"]
    assert variables["PIP_INDEX_URL"]["value"] == "https://***@host/simple"


# ---------------------------------------------------------------- envguard.redact's rules

GHP = "ghp_" + "Aa1" * 12

AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
       "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U")


@pytest.mark.parametrize("name", [
    "GH_PAT", "AZURE_DEVOPS_PAT", "GPG_PASSPHRASE", "SSH_KEY_PASSPHRASE", "JUPYTER_PRIVATE",
    "MY_SESSION", "HF_SESSIONID", "HUB_COOKIE", "WEBHOOK_SIGNATURE", "TORCH_CREDENTIAL",
    "GOOGLE_APPLICATION_CREDENTIALS", "PYTORCH_AUTH", "NVIDIA_BEARER", "SIGNING_KEY",
    "CLIENTSECRET", "SENTRY_DSN", "SLACK_WEBHOOK", "DB_PASS", "hf-token", "api_key",
])
def test_more_secret_names(name: str) -> None:
    assert envvars.looks_secret(name)
    assert redact.secret_name(name)


WANDB_KEY = "0123456789abcdef" * 2 + "01234567"  # a W&B API key: 40 hex digits
CREDENTIAL_CASES = [
    # URL userinfo with a "/" or "@" in the password, no scheme, several URLs
    ("https://deploy:pa/ss@host/simple", "https://***@host/simple"),
    ("https://user:p@ss/word@host/simple", "https://***@host/simple"),
    ("user:pw@pypi.corp.example/simple", "***@pypi.corp.example/simple"),
    ("https://pypi.org/simple user:pw@h2.example/simple",
     "https://pypi.org/simple ***@h2.example/simple"),
    ("postgres://trainer:s3cr3t@db:5432/runs", "postgres://***@db:5432/runs"),
    # tokens by shape, anywhere in a value
    (GHP, "***"),
    (f"/opt/lib:/tmp/{GHP}/lib", "/opt/lib:/tmp/***/lib"),
    ("github_pat_" + "Ab1_" * 20, "***"),
    ("hf_" + "Zx9" * 11, "***"),
    ("sk-proj-" + "Ab1-" * 12, "***"),
    ("sk-ant-api03-" + "Xy7_" * 20, "***"),
    ("xoxb-123456789012-" + "Ab1" * 8, "***"),
    ("AKIAIOSFODNN7EXAMPLE", "***"),
    (AWS_SECRET, "***"),
    (f"id=AKIAIOSFODNN7EXAMPLE,{AWS_SECRET}", "id=***,***"),
    (JWT, "***"),
    ("https://h/a?user=me&token=abc123", "https://h/a?user=me&token=***"),
    ("https://b.s3.amazonaws.com/w?X-Amz-Signature=0af3&x=1",
     "https://b.s3.amazonaws.com/w?X-Amz-Signature=***&x=1"),
    ("https://a.blob.core.windows.net/c?sv=2022&sig=Ab%2Fc",
     "https://a.blob.core.windows.net/c?sv=2022&sig=***"),
    ("https://h/x?signature=abc", "https://h/x?signature=***"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNz\n-----END OPENSSH PRIVATE KEY-----\nrest",
     "***\nrest"),
    ("Authorization: Bearer abcdefghijklmnop1234", "Authorization: Bearer ***"),
    ("password=hunter2 lr=3e-4", "password=*** lr=3e-4"),
    ("--hf-token=abc --lr=1", "--hf-token=*** --lr=1"),
    # the keys of services an ML run talks to, by their published prefixes
    ("NGC_KEY_NOTE=nvapi-" + "Ab1_x-" * 11, "NGC_KEY_NOTE=***"),
    ("r8_" + "Ab1x" * 10, "***"),
    ("gsk_" + "Ab1x" * 13, "***"),
    ("lsv2_pt_" + "0123456789abcdef" * 2 + "_0123456789", "***"),
    ("pcsk_" + "Ab1_" * 12, "***"),
    ("xai-" + "Ab1x" * 20, "***"),
    ("pplx-" + "Ab1x" * 12, "***"),
    ("https://h.cloud.databricks.com dapi" + "0123456789abcdef" * 2 + "-2",
     "https://h.cloud.databricks.com ***"),
    ("sk-" + "0123456789abcdef" * 2, "***"),  # DeepSeek: hex, no capital letter
    # a dotted property glued to Java's -D (Spark, Hadoop's S3 connector)
    ("JAVA_OPTS=-Xmx4g -Dfs.s3a.secret.key=S3c -Dlog.level=debug",
     "JAVA_OPTS=-Xmx4g -Dfs.s3a.secret.key=*** -Dlog.level=debug"),
    # a mask that opens the credential beside it: the npm token followed a letter
    ("AKIAIOSFODNN7EXAMPLEnpm_" + "ab12" * 9, "******"),
    # the key of a login command, after its options too
    ("wandb login " + WANDB_KEY, "wandb login ***"),
    (f"RUN wandb login --relogin --host https://api.wandb.ai {WANDB_KEY} && python t.py",
     "RUN wandb login --relogin --host https://api.wandb.ai *** && python t.py"),
]


@pytest.mark.parametrize(("value", "redacted"), CREDENTIAL_CASES)
def test_credentials_are_found_by_shape(value: str, redacted: str) -> None:
    assert redact.redact_text(value) == redacted
    assert redact.redact_text(redacted) == redacted  # idempotent


@pytest.mark.parametrize("value", [
    "0,1", "9.0", "8.0;9.0+PTX", "expandable_segments:True,max_split_size_mb:128",
    "/usr/local/cuda-12.8/bin:/usr/bin:/opt/hf_transfer/bin", "hf_transfer", "hf_hub_download",
    "https://pypi.org/simple", "https://download.pytorch.org/whl/cu128",
    "https://host:8080/simple", "git+https://github.com/org/repo@v1.2",
    "git@github.com:org/repo.git", "me@example.com", "file:///home/u/wheels/x.whl",
    "sk-learn-compat", "risk-management-framework-2024", "TOKENIZERS_PARALLELISM=false",
    "70d99e998b4955e0049d13a98d77ae1b14db1f45", "sha256:" + "ab" * 32,
    "sha256=ZsbibqJRN4HCDtmDYF0k3IBZ0pgu3yYtRmo1I1bZ9Fg", 'torch==2.11.0; extra == "gpu"',
    "numpy>=1.26", "ERROR=1", "a=b", "/home/u/.cache/torchinductor_u",
    "docker login registry.example.com", "login failed for user bob",
    "gcloud auth login me@example.com", "Login Succeeded",
    "xai-grok", "r8_short", "rapid dapper", "gsk_small", "sk-" + "0123456789abcdef" * 3,
])
def test_innocent_values_are_left_alone(value: str) -> None:
    assert redact.redact_text(value) == value


def test_a_login_commands_key_is_masked_in_argv_and_nothing_else_after_it() -> None:
    assert redact.redact_argv(["wandb", "login", WANDB_KEY]) == ["wandb", "login", "***"]
    assert redact.redact_argv(
        ["wandb", "login", "--relogin", "--host", "https://api.wandb.ai", WANDB_KEY]) == [
        "wandb", "login", "--relogin", "--host", "https://api.wandb.ai", "***"]
    assert redact.redact_argv(["sh", "-c", f"wandb login {WANDB_KEY}"]) == [
        "sh", "-c", "wandb login ***"]
    kept = ["docker", "login", "ghcr.io", "&&", "git", "checkout", WANDB_KEY]
    assert redact.redact_argv(kept) == kept  # another command's commit hash
    assert redact.redact_argv(["git", "checkout", WANDB_KEY]) == ["git", "checkout", WANDB_KEY]


def test_argv_is_redacted_by_flag_and_by_shape() -> None:
    argv = ["python", "train.py", "--token", "t0k", "--password=pw1", "password=pw2",
            "-p", "pw3", "--hf-token", "pw4", "--api-key", "--verbose", "-u", "bob:pw5",
            "--data", "https://u:pw6@h/d?sig=pw7", GHP, "--lr", "3e-4", "-n", "8"]
    assert redact.redact_argv(argv) == [
        "python", "train.py", "--token", "***", "--password=***", "password=***",
        "-p", "***", "--hf-token", "***", "--api-key", "--verbose", "-u", "bob:***",
        "--data", "https://***@h/d?sig=***", "***", "--lr", "3e-4", "-n", "8"]


def test_every_value_pattern_passes_the_quick_filter() -> None:
    """The fast path skips a string only when no pattern can match it."""
    for value, _ in CREDENTIAL_CASES:
        assert redact._maybe().search(value), value
        assert redact._may_hold_secret(value), value


# Pieces of every branch of the quick filter, near misses and non-ASCII case variants
# (the Kelvin sign and the long s fold to k and s), joined at random.
_FRAGMENTS = ["://", ":/", "@", "-----BEGIN", "----BEGIN", "ghp_", "gho_", "gh_", "github_pat_",
              "glpat-", "hf_", "hf", "sk-", "sk_", "rk_", "xox", "xo", "xapp-", "pypi-", "npm_",
              "AIza", "AKIA", "ASIA", "eyJ", "hooks.slack", "hooks-slack", "/t/", "t/", "/", "t",
              "?", "&", ";", "=", "==", "a=", "-=", "Bearer", "BASIC", "accountKey",
              "sharedAccess", "bearer", "\u212a", "\u017f", "account\u212aey",
              "\u017fharedaccess", "A" * 39, "Ab1+" * 10, "ab12" * 10, "0f" * 20, "Z", " ",
              "_", "-", ".", "x", "login ", "Login\t", "logi", "nvapi-", "r8_", "gsk_",
              "lsv2_", "pcsk_", "xai-", "pplx-", "dapi", "0123456789abcdef" * 2]


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(_FRAGMENTS), max_size=6).map("".join))
def test_the_cheap_checks_pass_whatever_the_quick_filter_passes(text: str) -> None:
    if redact._maybe().search(text) is not None:
        assert redact._may_hold_secret(text), text


def test_the_cheap_checks_are_not_a_pass_for_everything() -> None:
    for text in ("torch", "2.13.0+cpu", "/usr/lib/python3.11", "tokenizers", "sphinx_rtd"):
        assert not redact._may_hold_secret(text), text


def _every_pattern(text: str) -> str:
    """redact_text without any need: every pattern of every group tried on ``text``, again
    and again until a pass finds nothing more (a mask can open another credential)."""
    for _ in range(redact.MAX_PASSES):
        if not text or len(text) > redact.MAX_TEXT:
            return text
        if not (redact._may_hold_shape(text) or redact.may_hold_form(text)):
            return text
        before = text
        for _, source, flags in redact_shapes.SECRET_VALUES:
            text = re.sub(source, redact._mask_group, text, flags=flags)
        text = re.sub(redact._ASSIGNMENT, redact._mask_assignment, text)
        for _, source, mask in redact_forms.FORMS:
            text = re.sub(source, mask, text)
        if text == before:
            return text
    return redact.MASK


_FORM_PIECES = ["password", "Password", "token", "TOKEN", "auth", "Authorization", "Cookie",
                "cookie", "machine", "login", "passwd", "key", "sign", "--", "-", "-u", "--user",
                ":", "=", '"', "'", ",", " ", "\t", "\\", "x", "alice:pw", "Bearer ", "[", "{",
                "api_", "-H", "1", "hf_" + "Ab1" * 11, "https://", "u:p@h", "?sig=",
                "AKIA" + "A1" * 8, "sphinx-design ; extra == 'rtd'"]


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(_FORM_PIECES + _FRAGMENTS), max_size=8).map("".join))
@example("AKIA" + "A1" * 8 + "-u=--://")  # the key's mask puts "-u" at a word's start
@example("u:p@h;u:p@h")  # a host ending at ";"
@example("AKIA" + "A1" * 8 + "npm_" + "ab12" * 9)  # the key's mask opens the npm token
def test_each_pattern_is_tried_wherever_it_could_match(text: str) -> None:
    """The per-pattern needs skip a pattern only where it cannot match: the result is that
    of trying every pattern, also where a pattern's mask opens another's form; and masking
    the result again changes nothing (idempotent)."""
    out = redact.redact_text(text)
    assert out == _every_pattern(text), text
    assert redact.redact_text(out) == out, text


@pytest.mark.parametrize(("text", "masked"), [
    ("PIP_EXTRA_INDEX_URL=alice:s3cret@pypi.example.org;x",
     "PIP_EXTRA_INDEX_URL=***@pypi.example.org;x"),
    ("alice:s3cret@host1,bob:pw@host2", "***@host1,***@host2"),
    ("u:p@h;u:p@h", "***@h;***@h"),
    ("(alice:s3cret@host)", "***@host)"),  # the user name took the bracket: masked all the same
    ("sphinx-design ; extra == 'rtd'", "sphinx-design ; extra == 'rtd'"),
    ("user@example.com;x", "user@example.com;x"),
])
def test_a_bare_credential_before_a_separator_is_masked(text: str, masked: str) -> None:
    """``user:password@host`` in a list: the host ends at a separator too, not only at a
    slash or white space (the first of ``a:b@h1;c:d@h2`` was left whole)."""
    assert redact.redact_text(text) == masked


_FORM_CASES = ["--password S3cr3t", "-token S3cr3t", "x=-token S3cr3t", "(--token S3cr3t)",
               "--hf-token 'a b'", "X-Api-Key: S3cr3t", "Authorization: token S3cr3t",
               "Proxy-Authorization: Basic S3cr3t", "Cookie: a=1; b=2", '{"password": "S3"}',
               "password: two words", "secret = S3", "{'api_key': 'S3'}",
               '{\\"token\\": \\"S3\\"}', '["--token", "S3"]', "['-password', 'S3']",
               "machine h login u password S3", "default login u password S3",
               "--user=alice:S3", "-u alice:S3", "curl -uu:S3", "DB_PASSWORD=S3",
               "sphinx-design ; extra == 'rtd'", "keyring ; extra == \"test\""]


def test_each_pattern_is_tried_on_every_credential_case() -> None:
    for value in [v for v, _ in CREDENTIAL_CASES] + _FORM_CASES:
        assert redact.redact_text(value) == _every_pattern(value), value


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_FRAGMENTS), max_size=6).map("".join), max_size=12))
def test_the_joined_search_finds_exactly_the_strings_the_filter_passes(texts: list[str]) -> None:
    # suspects() looks through all strings at once; a hit must never span two of them.
    assert redact.suspects(texts) == {t for t in texts if t and redact._may_hold_secret(t)}


def test_a_snapshot_with_nothing_to_mask_comes_back_as_the_same_object() -> None:
    snapshot = read_snapshot(DATA / "h200-snapshot.json")
    assert redact.redact_snapshot(snapshot) is snapshot
    leaky = dataclasses.replace(snapshot, errors=[
        *snapshot.errors, ProbeIssue(section="files", message=f"token={GHP}")])
    scrubbed = redact.redact_snapshot(leaky)
    assert scrubbed.errors[-1].message == "token=***"
    assert scrubbed.packages is snapshot.packages  # untouched sections are shared


@pytest.mark.parametrize("value", [
    "TORCH_FOO=" + GHP, GHP, f"/opt/lib:/tmp/{GHP}", "user:pw@host/simple",
    "https://u:p/w@h/simple",
])
def test_a_credential_in_an_innocent_variable_is_masked_and_digested(value: str) -> None:
    first, _ = _collect({"TORCH_FOO": value, "LD_LIBRARY_PATH": value})
    second, _ = _collect({"TORCH_FOO": value.replace("Aa1", "Bb2").replace("p", "q"),
                          "LD_LIBRARY_PATH": value})
    entry = first.variables["TORCH_FOO"]
    assert entry.masked and entry.digest and entry.value is not None
    assert "***" in entry.value
    for secret in (GHP, "pw", "p/w"):
        if secret in value:
            assert secret not in entry.value
    assert second.variables["TORCH_FOO"].digest != entry.digest  # a change stays visible
    assert second.variables["LD_LIBRARY_PATH"].digest == first.variables["LD_LIBRARY_PATH"].digest


def test_innocent_variables_keep_their_values() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "TORCH_CUDA_ARCH_LIST": "9.0",
           "PATH": "/opt/hf_transfer/bin:/usr/bin", "PIP_INDEX_URL": "https://pypi.org/simple",
           "UV_EXTRA_INDEX_URL": "https://download.pytorch.org/whl/cu128 https://pypi.org/simple",
           "HF_HUB_ENABLE_HF_TRANSFER": "1", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    environment, _ = _collect(env)
    assert {k: v.value for k, v in environment.variables.items()} == env
    assert not any(v.masked for v in environment.variables.values())
    assert environment.mask_key_id is None


@pytest.mark.parametrize("unit", ["x=a:b", "a://", "sk-a-", "-_", "a:b@?a=a:b@", "=a://"])
def test_redaction_takes_linear_time_on_hostile_values(unit: str) -> None:
    """Each of these took quadratic time in a first version of the patterns (about 25 s
    for 200 kB); a snapshot file read from elsewhere may hold such strings."""
    import time

    text = unit * (200_000 // len(unit))
    started = time.perf_counter()
    redact.redact_text(text)
    assert time.perf_counter() - started < 3.0


def test_a_huge_string_that_may_hold_a_credential_is_masked_whole() -> None:
    assert redact.redact_text("https://u:p@h/" + "x" * redact.MAX_TEXT) == "***"
    plain = "1.0 " * (redact.MAX_TEXT // 4 + 1)
    assert redact.redact_text(plain) == plain  # nothing that could be a credential



class _SlowFile:
    """A file whose first write waits: the moment another process may look at the key."""

    def __init__(self, fh: Any) -> None:
        self._fh = fh

    def write(self, data: bytes) -> int:
        import time

        time.sleep(0.6)
        return int(self._fh.write(data))

    def __enter__(self) -> _SlowFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._fh.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fh, name)


def _key_in_child(config: str, slow: bool, out: Any) -> None:
    os.environ["XDG_CONFIG_HOME"] = config
    os.environ.pop("ENVGUARD_MASK_KEY", None)
    if slow:
        real = os.fdopen
        os.fdopen = lambda *a, **k: _SlowFile(real(*a, **k))  # type: ignore[assignment]
    out.put(envvars.load_mask_key([]))


def test_a_key_file_being_written_is_never_seen_half_made(tmp_path: Path) -> None:
    """Two ranks of a job make the key at once on a fresh host; the first is slow to write
    it. Both must return the key the file ends up holding."""
    import multiprocessing
    import time

    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    config = str(tmp_path / "config")
    slow = ctx.Process(target=_key_in_child, args=(config, True, out))
    slow.start()
    time.sleep(0.25)
    fast = ctx.Process(target=_key_in_child, args=(config, False, out))
    fast.start()
    keys = {out.get(timeout=30), out.get(timeout=30)}
    slow.join(timeout=30)
    fast.join(timeout=30)
    on_disk = (tmp_path / "config" / "envguard" / "mask.key").read_bytes().strip()
    assert keys == {on_disk}
    assert [p.name for p in (tmp_path / "config" / "envguard").iterdir()] == ["mask.key"]
