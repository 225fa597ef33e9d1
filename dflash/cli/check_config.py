"""``dflash-eval --check-config``: does the drafter fit the target it will be served with?
(:mod:`dflash.serving`). Reads two configs, loads nothing: one line per difference on
stdout, and exit 5 (:attr:`~dflash.exitcodes.ExitCode.CONFIG_MISMATCH`) when there is
any; ``dflash-train`` prints the same lines after its export (:func:`lines`)."""

from __future__ import annotations

from pathlib import Path

from dflash.checkpoint.layout import CONFIG_NAME
from dflash.errors import CheckpointError
from dflash.exitcodes import ExitCode
from dflash.reading import read_json
from dflash.serving import FIELDS, NAMES, ConfigCheck, compare, drafter_fields, target_fields
from envguard.render.sanitize import escape_controls


def check(drafter: Path, target: str) -> ConfigCheck:
    """The drafter folder's ``config.json`` against the target ``--target`` names."""
    path = drafter / CONFIG_NAME
    try:
        config = read_json(path, CheckpointError, "drafter config")
    except FileNotFoundError:
        raise CheckpointError(f"cannot read {path}: No such file or directory") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} is not a JSON object")
    return compare(drafter_fields(config), target_fields(target))


def lines(result: ConfigCheck) -> list[str]:
    """What a command says of ``result``: the differences and the fields not compared,
    then the verdict."""
    compared = ", ".join(NAMES[f] for f in FIELDS if f not in result.not_recorded)
    if result.ok:
        return [f"the drafter's config matches the target's ({compared})",
                *result.lines()]
    return [*result.lines(),
            f"{len(result.differences)} difference(s) between the drafter's config and the "
            "target's: a serving engine would accept (almost) none of its drafts"]


def run(prog: str, drafter: Path, target: str) -> int:
    """The command: print :func:`lines`, return its exit code."""
    result = check(drafter, target)
    for line in lines(result):
        print(f"{prog}: {escape_controls(line)}")  # values read from config files
    return ExitCode.OK if result.ok else ExitCode.CONFIG_MISMATCH
