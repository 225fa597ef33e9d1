"""``envguard completion bash|zsh``: a shell completion script made from the parser itself.

The argparse tree is walked once (:func:`command_tree`): every command path (``""``,
``snapshot``, ``cache save`` ...) with its sub-commands, its options (which take a value,
with which choices) and the choices of its positional argument. The scripts are static
tables over those paths plus a small loop that finds the command path in the words
before the cursor, so a new option shows up in completion without anyone touching this
file. No dependency: neither shell needs anything beyond its own completion system.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from envguard.cli.output import write_stdout
from envguard.exitcodes import ExitCode
from envguard.frozen import frozen
from envguard.version import __version__

SHELLS = ("bash", "zsh")
_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$|^--?[A-Za-z0-9][A-Za-z0-9._-]*$")
"""What may appear unquoted in a generated script (command, option and choice names)."""


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "completion", help="print a bash or zsh completion script",
        description="Print a completion script generated from envguard's own parser: "
        "commands, options and their choices. bash: add eval \"$(envguard completion bash)\" "
        "to ~/.bashrc. zsh: add eval \"$(envguard completion zsh)\" to ~/.zshrc after "
        "compinit, or save the output as _envguard in a folder of $fpath.")
    p.add_argument("shell", choices=SHELLS, help="the shell to complete for")
    p.set_defaults(handler=cmd_completion)


def cmd_completion(args: argparse.Namespace) -> int:
    tree = command_tree(args.root_parser)
    write_stdout(bash_script(tree) if args.shell == "bash" else zsh_script(tree))
    return ExitCode.OK


# ------------------------------------------------------------------------- the tree

@frozen(kw_only=False)
class Option:
    names: tuple[str, ...]
    help: str
    takes_value: bool
    choices: tuple[str, ...] = ()


@frozen(kw_only=False)
class Command:
    path: str
    """The sub-command words, space-separated; ``""`` for envguard itself."""
    commands: tuple[tuple[str, str], ...]
    """(name, help) of its sub-commands."""
    options: tuple[Option, ...]
    positional_choices: tuple[str, ...] = ()
    takes_command: bool = False
    """Its positional is a command line of its own (``envguard run -- CMD ...``)."""


def _choices(action: argparse.Action) -> tuple[str, ...]:
    return tuple(str(c) for c in action.choices or () if _TOKEN.match(str(c)))


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
    positional: tuple[str, ...] = ()
    takes_command = False
    below: list[Command] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, child in action.choices.items():
                if _TOKEN.match(name):
                    commands.append((name, helps.get(name, "")))
                    below += command_tree(child, f"{path} {name}".strip())
        elif action.help == argparse.SUPPRESS:
            continue
        elif action.option_strings:
            names = tuple(n for n in action.option_strings if _TOKEN.match(n))
            if names:
                options.append(Option(names, _help(parser, action), action.nargs != 0,
                                      _choices(action)))
        elif action.nargs == argparse.REMAINDER:
            takes_command = True
        else:
            positional = positional or _choices(action)
    return [Command(path, tuple(commands), tuple(options), positional, takes_command), *below]


# ------------------------------------------------------------------------- bash

def _words(items: list[str] | tuple[str, ...]) -> str:
    return " ".join(items)


def _path_loop(first_index: str, count: str, word: str, tree: list[Command]) -> list[str]:
    """Shell code (bash and zsh alike) setting ``cmdpath`` from the words before the cursor:
    option values are skipped, a sub-command word extends the path; after ``--`` of a
    command that runs a command line (or at its first word that is not an option),
    ``after`` counts the words of that line: 1 at its command, more at its arguments."""
    valued = sorted(f'"{c.path}|{n}"' for c in tree for o in c.options if o.takes_value
                    for n in o.names)
    subs = sorted(f'"{c.path}|{name}"' for c in tree for name, _ in c.commands)
    runs = sorted(f'"{c.path}"' for c in tree if c.takes_command)
    starts = sorted(f'"{c.path}|"[!-]*' for c in tree if c.takes_command)
    return [
        f"    for ((i = {first_index}; i < {count}; i++)); do",
        f"        word={word}",
        "        if (( after > 0 )); then after=$((after + 1)); continue; fi",
        "        if (( skip )); then skip=0; continue; fi",
        f"        if [[ $word == -- ]]; then case \"$cmdpath\" in {'|'.join(runs) or '__none'}) "
        "after=1 ;; esac; continue; fi",
        "        case \"$cmdpath|$word\" in",
        f"            {'|'.join(valued) or '__none'}) skip=1 ;;",
        f"            {'|'.join(subs) or '__none'}) cmdpath=\"${{cmdpath:+$cmdpath }}$word\" ;;",
        f"            {'|'.join(starts) or '__none'}) after=2 ;;",
        "        esac",
        "    done",
        f"    case \"$cmdpath\" in {'|'.join(runs) or '__none'}) if (( after == 0 )) && "
        "[[ $cur != -* ]]; then after=1; fi ;; esac",
    ]


def bash_script(tree: list[Command]) -> str:
    lines = [
        f"# bash completion for envguard {__version__}, generated from its parser by",
        "# 'envguard completion bash'. Use: eval \"$(envguard completion bash)\"",
        "_envguard() {",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"',
        '    local cmdpath="" word="" i skip=0 after=0',
        *_path_loop("1", "COMP_CWORD", '"${COMP_WORDS[i]}"', tree),
        "    if (( after == 1 )); then COMPREPLY=($(compgen -c -- \"$cur\")); return; fi",
        "    if (( after > 1 )); then COMPREPLY=($(compgen -f -- \"$cur\")); return; fi",
        '    case "$cmdpath|$prev" in',
    ]
    for c in tree:
        for o in c.options:
            if o.takes_value:
                pattern = "|".join(f'"{c.path}|{n}"' for n in o.names)
                action = (f'COMPREPLY=($(compgen -W "{_words(o.choices)}" -- "$cur"))'
                          if o.choices else 'COMPREPLY=($(compgen -f -- "$cur"))')
                lines.append(f"        {pattern}) {action}; return ;;")
    lines += ["    esac", '    local commands="" options="" values=""', '    case "$cmdpath" in']
    for c in tree:
        options = [n for o in c.options for n in o.names]
        lines.append(f'        "{c.path}") commands="{_words([n for n, _ in c.commands])}"; '
                     f'options="{_words(options)}"; values="{_words(c.positional_choices)}" ;;')
    lines += [
        "    esac",
        '    if [[ $cur == -* ]]; then',
        '        COMPREPLY=($(compgen -W "$options" -- "$cur"))',
        '    elif [[ -n $commands || -n $values ]]; then',
        '        COMPREPLY=($(compgen -W "$commands $values" -- "$cur"))',
        "    else",
        '        COMPREPLY=($(compgen -f -- "$cur"))',
        "    fi",
        "}",
        "complete -o filenames -F _envguard envguard",
        "",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------------- zsh

def _zsh_item(name: str, text: str) -> str:
    """One ``name:description`` of _describe, single-quoted for zsh."""
    text = " ".join(text.split()).replace("'", "'\\''")
    return f"'{name}:{text}'"


def zsh_script(tree: list[Command]) -> str:
    lines = [
        "#compdef envguard",
        f"# zsh completion for envguard {__version__}, generated from its parser by",
        "# 'envguard completion zsh'. Use: eval \"$(envguard completion zsh)\" after compinit,",
        "# or save it as _envguard in a folder of $fpath.",
        "_envguard() {",
        '    local cmdpath="" word="" cur="${words[CURRENT]}" prev="${words[CURRENT-1]}"',
        "    local -i i skip=0 after=0",
        "    local -a commands options values",
        *_path_loop("2", "CURRENT", '"${words[i]}"', tree),
        "    if (( after == 1 )); then _command_names -e; return; fi",
        "    if (( after > 1 )); then _files; return; fi",
        '    case "$cmdpath|$prev" in',
    ]
    for c in tree:
        for o in c.options:
            if o.takes_value:
                pattern = "|".join(f'"{c.path}|{n}"' for n in o.names)
                action = f"compadd -- {_words(o.choices)}" if o.choices else "_files"
                lines.append(f"        {pattern}) {action}; return ;;")
    lines += ["    esac", '    case "$cmdpath" in']
    for c in tree:
        cmds = " ".join(_zsh_item(n, h) for n, h in c.commands)
        opts = " ".join(_zsh_item(n, o.help) for o in c.options for n in o.names)
        lines.append(f'        "{c.path}") commands=({cmds}); options=({opts}); '
                     f"values=({_words(c.positional_choices)}) ;;")
    lines += [
        "    esac",
        "    if [[ $cur == -* ]]; then",
        "        _describe -t options option options",
        "    elif (( ${#commands} )); then",
        "        _describe -t commands command commands",
        "    elif (( ${#values} )); then",
        "        compadd -- $values",
        "    else",
        "        _files",
        "    fi",
        "}",
        'if [[ "${zsh_eval_context[-1]}" == loadautofunc ]]; then',
        '    _envguard "$@"',
        "else",
        "    compdef _envguard envguard",
        "fi",
        "",
    ]
    return "\n".join(lines)
