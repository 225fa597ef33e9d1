"""``envguard completion bash|zsh|fish``: a shell completion script made from the parser.

The argparse tree is walked once (:func:`envguard.cli.completion_tree.command_tree`):
every command path with its sub-commands, options, positionals and what completes their
values (choices, files, snapshots and their aliases, lock names). The scripts are static
tables over it (:mod:`envguard.cli.completion_shells` writes bash's and zsh's,
:mod:`envguard.cli.completion_fish` fish's), so a new option shows up in completion
without anyone touching these files. No dependency: each shell needs nothing beyond its
own completion system, and nothing runs envguard while it completes.
"""

from __future__ import annotations

import argparse
from typing import Any

from envguard.cli.output import write_stdout
from envguard.exitcodes import ExitCode

SHELLS = ("bash", "zsh", "fish")


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "completion", help="print a bash, zsh or fish completion script",
        description="Print a completion script generated from envguard's own parser: "
        "commands, options and their choices, the aliases of snapshot arguments "
        "(@last-good, @latest, @now, @run:N, @last-good:LOCK) and lock names (those of "
        "./lockfiles when you press TAB, and the bundled ones). bash: add "
        "eval \"$(envguard completion bash)\" to ~/.bashrc. zsh: add "
        "eval \"$(envguard completion zsh)\" to ~/.zshrc after compinit, or save the "
        "output as _envguard in a folder of $fpath. fish: envguard completion fish > "
        "~/.config/fish/completions/envguard.fish")
    p.add_argument("shell", choices=SHELLS, help="the shell to complete for")
    p.set_defaults(handler=cmd_completion)


def cmd_completion(args: argparse.Namespace) -> int:
    from envguard.cli.completion_fish import fish_script
    from envguard.cli.completion_shells import bash_script, zsh_script
    from envguard.cli.completion_tree import command_tree

    writers = {"bash": bash_script, "zsh": zsh_script, "fish": fish_script}
    write_stdout(writers[args.shell](command_tree(args.root_parser)))
    return ExitCode.OK
