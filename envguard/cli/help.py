"""``envguard help [TOPIC]``: the manual, shipped with envguard.

The pages are the project's own ``docs/*.md``, copied into the wheel as ``envguard/docs/``
(``pyproject.toml``, ``force-include``), so a tool install is self-sufficient: every
``--help`` that says "envguard help TOPIC" can be followed without the repository. In a
checkout the pages are read from ``docs/`` itself. :data:`TOPICS` is the one table of
topics: each command's name leads to the page that explains it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from envguard.cli.output import write_stdout
from envguard.errors import InputError
from envguard.exitcodes import ExitCode

TOPICS: dict[str, tuple[str, str]] = {
    # topic: (page, what it explains)
    "cli": ("CLI.md", "every command, its options, aliases and exit codes"),
    "snapshot": ("SNAPSHOT.md", "what a snapshot records, field by field"),
    "diff": ("DIFF.md", "how two snapshots are compared, the rules, the JSON schema"),
    "doctor": ("DOCTOR.md", "checks of one environment without a baseline; --fix"),
    "history": ("HISTORY.md", "what the disk says happened to an environment, and when"),
    "lock": ("LOCK.md", "lockfiles, check, run, the run records and @last-good"),
    "check": ("LOCK.md", "see lock"),
    "run": ("LOCK.md", "see lock"),
    "runs": ("LOCK.md", "see lock"),
    "restore": ("RESTORE.md", "rebuilding a recorded package set exactly, and the proof"),
    "bisect": ("BISECT.md", "finding the change that broke a command"),
    "install": ("INSTALL.md", "predicting an install exactly to the build; revisions, undo"),
    "revisions": ("INSTALL.md", "see install"),
    "undo": ("INSTALL.md", "see install"),
    "shell-hook": ("INSTALL.md", "see install"),
    "cache": ("CACHE.md", "compile caches: status, save, restore, provenance"),
    "fleet": ("FLEET.md", "snapshots of many ranks or hosts, and their outliers"),
    "completion": ("CLI.md", "see cli"),
    "conda": ("CONDA.md", "conda and pixi environments"),
    "security": ("SECURITY.md", "what is masked, where, and what envguard never runs"),
    "api": ("API.md", "the Python API"),
    "knowledge": ("KNOWLEDGE.md", "the known breaks between versions envguard recognises"),
    "dflash": ("DFLASH.md", "the bundled DFlash drafter trainer"),
    "incident": ("INCIDENT.md", "the breakage envguard was built for"),
    "compile-race": ("COMPILE-RACE.md", "torch.compile's tracing race, and its fix"),
}


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "help", help="read the manual: a topic, or the list of topics",
        description="Print a page of envguard's manual (the same text as its docs/ folder, "
        "shipped with it). With no TOPIC: the topics. Every command's name is a topic.",
        epilog="exit status: 0 shown, 2 unknown topic")
    p.add_argument("topic", nargs="?", metavar="TOPIC", choices=sorted(TOPICS),
                   help="a command's name, or one of: " + ", ".join(
                       t for t in TOPICS if t not in _COMMAND_TOPICS))
    p.set_defaults(handler=cmd_help)


_COMMAND_TOPICS = ("snapshot", "diff", "doctor", "history", "lock", "check", "run", "runs",
                   "restore", "bisect", "cache", "fleet", "install", "revisions", "undo",
                   "shell-hook", "completion")


def pages_folder() -> Path | None:
    """``envguard/docs/`` of an installed wheel, else ``docs/`` of a checkout, else None."""
    package = Path(__file__).resolve().parents[1]
    for folder in (package / "docs", package.parent / "docs"):
        if (folder / "CLI.md").is_file():
            return folder
    return None


def page_text(topic: str) -> str:
    """The page of ``topic``; InputError when it is not shipped with this install."""
    from envguard.input_file import read_input_text

    page = TOPICS[topic][0]
    folder = pages_folder()
    if folder is None:
        raise InputError(f"the manual is not installed with this envguard ({page} is "
                         "missing); reinstall it from a wheel or a checkout")
    return read_input_text(folder / page, what="manual page", follow=False)


def topic_list() -> str:
    width = max(map(len, TOPICS))
    lines = ["envguard help TOPIC  (every command's name is a topic)", ""]
    lines += [f"  {name:<{width}}  {about}" for name, (_, about) in TOPICS.items()
              if not about.startswith("see ")]
    return "\n".join(lines) + "\n"


def cmd_help(args: argparse.Namespace) -> int:
    if args.topic is None:
        write_stdout(topic_list())
        return ExitCode.OK
    text = page_text(args.topic)
    if sys.stdout.isatty() and not os.environ.get("NO_COLOR"):
        from rich.console import Console
        from rich.markdown import Markdown

        console = Console()
        with console.pager(styles=True):
            console.print(Markdown(text))
    else:
        write_stdout(text if text.endswith("\n") else text + "\n")
    return ExitCode.OK
