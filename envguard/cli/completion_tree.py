"""What ``envguard completion`` completes, read from the parser: :func:`command_tree`.

Every command path (``""``, ``snapshot``, ``cache save`` ...) with its sub-commands, its
options (which take a value, and what completes that value) and its positionals, in
order. What completes a value is its choices when argparse has some, else its
:data:`VALUES` kind (a snapshot, a lock), else file names. The shell writers
(:mod:`envguard.cli.completion_shells`, :mod:`envguard.cli.completion_fish`) turn the tree
into static tables; the lock names in ``./lockfiles`` are globbed by the shell itself
when it completes, so completion never runs envguard.

Nothing read becomes code: a command, option, choice or lock name that is not a plain
token (:data:`TOKEN`) is left out of the script.
"""

from __future__ import annotations

import argparse
import re

from envguard.cli.options import NOW
from envguard.frozen import frozen
from envguard.runs.refs import ALIASES, LAST_GOOD_OF

__all__ = ["LAST_GOOD_OF", "Command", "Option", "Values", "aliases", "bundled_locks",
           "command_tree"]

TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$|^--?[A-Za-z0-9][A-Za-z0-9._-]*$")
"""What may appear unquoted in a generated script (command, option and choice names)."""
LOCK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
"""A lock name that may be offered; the shells check the names they glob the same way."""

FILES, CHOICES = "files", "choices"
SNAPSHOT = "snapshot"
"""A snapshot file or an alias, ``@now`` included (diff, bisect: :func:`load_pair`)."""
RECORDED = "recorded"
"""A snapshot file or the alias of a recorded one: ``@now`` is not offered
(:func:`envguard.cli.options.recorded_path`)."""
LOCK = "lock"
"""A lock's name: ``lockfiles/NAME.toml`` here, or a bundled lock."""
LOCK_OR_FILE = "lock-or-file"
"""``--lock``: a lock's name or a lockfile's path."""

VALUES: dict[tuple[str, str], str] = {
    # (command path, dest of the argument): what completes its value.
    ("diff", "old"): SNAPSHOT,
    ("diff", "new"): SNAPSHOT,
    ("bisect", "good"): SNAPSHOT,
    ("bisect", "bad"): SNAPSHOT,
    ("restore", "good"): RECORDED,
    ("fleet diff", "inputs"): RECORDED,
    ("fleet diff", "baseline"): RECORDED,
    ("cache save", "from_snapshot"): RECORDED,
    ("lock", "name"): LOCK,
    ("check", "name"): LOCK,
    ("check", "lock"): LOCK_OR_FILE,
    ("run", "lock"): LOCK_OR_FILE,
}
"""The one table of arguments whose values are snapshots or locks."""

RUNS_OFFERED = 3
"""``@run:1`` .. ``@run:3`` are offered (any N is accepted)."""


@frozen(kw_only=False)
class Values:
    """What completes a value: ``kind`` (:data:`FILES`, :data:`CHOICES` or a kind of
    :data:`VALUES`), and the choices."""

    kind: str = FILES
    choices: tuple[str, ...] = ()


@frozen(kw_only=False)
class Option:
    names: tuple[str, ...]
    help: str
    values: Values | None
    """None for a flag (it takes no value)."""


@frozen(kw_only=False)
class Command:
    path: str
    """The sub-command words, space-separated; ``""`` for envguard itself."""
    commands: tuple[tuple[str, str], ...]
    """(name, help) of its sub-commands."""
    options: tuple[Option, ...]
    positionals: tuple[Values, ...] = ()
    repeats: bool = False
    """The last positional takes any number of words (``nargs="+"``, ``"*"``)."""
    command_at: int | None = None
    """The positional where a command line of its own begins (``envguard run -- CMD``:
    0; ``bisect GOOD BAD -- CMD``: 2); None when it takes none."""


def _values(path: str, action: argparse.Action) -> Values:
    choices = tuple(str(c) for c in action.choices or ())
    if choices:
        return Values(CHOICES, tuple(c for c in choices if TOKEN.match(c)))
    return Values(VALUES.get((path, action.dest), FILES))


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help text as --help shows it (``%(default)s`` and the like filled in)."""
    try:
        return str(parser._get_formatter()._expand_help(action))
    except (TypeError, ValueError, KeyError):
        return str(action.help or "")


def command_tree(parser: argparse.ArgumentParser, path: str = "") -> list[Command]:
    """Every command path of ``parser``, depth first, the root first."""
    commands: list[tuple[str, str]] = []
    options: list[Option] = []
    positionals: list[Values] = []
    repeats = False
    command_at = None
    below: list[Command] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, child in action.choices.items():
                if TOKEN.match(name):
                    commands.append((name, helps.get(name, "")))
                    below += command_tree(child, f"{path} {name}".strip())
        elif action.help == argparse.SUPPRESS:
            continue
        elif action.option_strings:
            names = tuple(n for n in action.option_strings if TOKEN.match(n))
            if names:
                values = _values(path, action) if action.nargs != 0 else None
                options.append(Option(names, _help(parser, action), values))
        elif action.nargs == argparse.REMAINDER:
            command_at = len(positionals)
        elif not repeats:
            positionals.append(_values(path, action))
            repeats = action.nargs in ("+", "*")
    return [Command(path, tuple(commands), tuple(options), tuple(positionals), repeats,
                    command_at), *below]


def aliases(kind: str) -> tuple[str, ...]:
    """The aliases offered for a :data:`SNAPSHOT` or :data:`RECORDED` value, from
    :data:`envguard.runs.refs.ALIASES` (``@run:N`` as a few numbers; ``@last-good:LOCK``
    is offered per lock name by the shell)."""
    offered: list[str] = []
    for alias in ALIASES:
        if alias.endswith(":N"):
            offered += [f"{alias[:-1]}{n}" for n in range(1, RUNS_OFFERED + 1)]
        elif re.fullmatch(r"@[a-z-]+", alias) and not (kind == RECORDED and alias == NOW):
            offered.append(alias)
    return tuple(offered)


def bundled_locks() -> tuple[str, ...]:
    """The locks shipped with envguard (``dflash-train``), offered wherever a lock is."""
    from envguard.gate.lookup import bundled_lock_dirs

    names = {p.stem for d in bundled_lock_dirs() if d.is_dir() for p in d.glob("*.toml")
             if p.is_file()}
    return tuple(sorted(n for n in names if LOCK_NAME.match(n)))
