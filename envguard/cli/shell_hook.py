"""``envguard shell-hook bash|zsh|fish``: print the shell functions that route installs in an
active venv through ``envguard install`` (the text is :mod:`envguard.install.hook`'s).
Nothing is installed: the hook exists where the user evals it."""

from __future__ import annotations

import argparse
from typing import Any

from envguard.cli.output import write_stdout
from envguard.exitcodes import ExitCode
from envguard.install.hook import SHELLS


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "shell-hook", help="print shell functions that send pip/uv installs through envguard",
        description="Print functions named pip, pip3 and uv that run pip install|uninstall "
        "and uv pip install|uninstall|sync through envguard install while a venv is active "
        "(VIRTUAL_ENV). Nothing is written: bash and zsh, eval \"$(envguard shell-hook "
        "bash)\"; fish, envguard shell-hook fish | source. Bypass for one command: command "
        "pip ... or ENVGUARD_HOOK=0 pip ...",
        epilog="exit status: 0, 2 usage (envguard help install)")
    p.add_argument("shell", choices=SHELLS, help="the shell to print the functions for")
    p.set_defaults(handler=cmd_shell_hook)


def cmd_shell_hook(args: argparse.Namespace) -> int:
    from envguard.install.hook import hook_text

    write_stdout(hook_text(args.shell))
    return ExitCode.OK
