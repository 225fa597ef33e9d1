"""The fish script of ``envguard completion``, written from :func:`command_tree`.

One ``complete`` line per sub-command, option and positional that is not a plain file,
each under the condition ``__envguard_is PATH SLOT``: the command path the words before
the cursor name, and where the cursor is (``opt``: anywhere but inside a command line
that envguard runs; ``N``: its Nth positional). ``__envguard_where`` reads the words the
way the bash and zsh scripts do (:mod:`envguard.cli.completion_shells`); the command line
of ``envguard run -- CMD`` is completed as fish would complete CMD on its own.
"""

from __future__ import annotations

from envguard.cli.completion_tree import (
    CHOICES,
    FILES,
    LAST_GOOD_OF,
    LOCK,
    LOCK_OR_FILE,
    RECORDED,
    SNAPSHOT,
    Command,
    Option,
    Values,
    aliases,
    bundled_locks,
)
from envguard.version import __version__


def _quote(text: str) -> str:
    """``text`` on one line, single-quoted for fish."""
    text = " ".join(text.split()).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


def _list(items: list[str]) -> str:
    return " ".join(_quote(i) for i in items)


def _arguments(values: Values) -> str:
    """The ``complete`` flags of a value: what it offers, and whether files come too."""
    if values.kind == CHOICES:
        return f"-f -a {_quote(' '.join(values.choices))}"
    offer = f"-a '(__envguard_values {values.kind})'"
    return f"-f {offer}" if values.kind == LOCK else offer


def _option(path: str, option: Option) -> str:
    names = []
    for name in option.names:
        if name.startswith("--"):
            names.append(f"-l {name[2:]}")
        elif len(name) == 2:
            names.append(f"-s {name[1:]}")
        else:
            names.append(f"-o {name[1:]}")
    line = f"complete -c envguard -n \"__envguard_is '{path}' opt\" {' '.join(names)}"
    if option.values is not None:
        line += " -r"
        if option.values.kind != FILES:
            line += " " + _arguments(option.values).replace("-f -a", "-x -a")
    return f"{line} -d {_quote(option.help)}"


def _where(tree: list[Command]) -> list[str]:
    valued = [f"{c.path}|{n}" for c in tree for o in c.options if o.values for n in o.names]
    subs = [f"{c.path}|{name}" for c in tree for name, _ in c.commands]
    runs = [c.path for c in tree if c.command_at is not None]
    starts = [f"{c.path}|{c.command_at}" for c in tree if c.command_at is not None]
    last = {c.path: len(c.positionals) - 1 for c in tree if not c.commands}
    clamps = [f"        case {_quote(c.path)}; test $npos -gt {last[c.path]}; and set npos "
              + (str(last[c.path]) if c.repeats else "past")
              for c in tree if c.path in last and (c.repeats or c.command_at is None)]
    return [
        "function __envguard_where --description 'the command path; the slot: a positional, "
        "value or cmd; where cmd starts'",
        "    set -l line (commandline -pc)",
        '    if test "$line" != "$__envguard_line"',
        "        set -g __envguard_line $line",
        "        set -g __envguard_at (__envguard_walk (commandline -opc))",
        "    end",
        "    printf '%s\\n' $__envguard_at",
        "end",
        "function __envguard_walk --description 'read the words before the cursor'",
        f"    set -l valued {_list(valued)}",
        f"    set -l subs {_list(subs)}",
        f"    set -l runs {_list(runs)}",
        f"    set -l starts {_list(starts)}",
        "    set -l path ''",
        "    set -l npos 0; set -l skip 0; set -l start 0; set -l i 1",
        "    for word in $argv[2..-1]",
        "        set i (math $i + 1)",
        "        if test $start -gt 0; continue; end",
        "        if test $skip = 1; set skip 0; continue; end",
        '        if test "$word" = --',
        '            contains -- "$path" $runs; and set start (math $i + 1)',
        "            continue",
        "        end",
        '        if contains -- "$path|$word" $valued; set skip 1; continue; end',
        '        if contains -- "$path|$word" $subs',
        '            set path (string trim -- "$path $word"); set npos 0; continue',
        "        end",
        "        string match -q -- '-?*' $word; and continue",
        '        if contains -- "$path|$npos" $starts; set start $i; continue; end',
        "        set npos (math $npos + 1)",
        "    end",
        "    switch $path",
        *clamps,
        "    end",
        "    set -l slot $npos",
        "    if test $start -gt 0",
        "        set slot cmd",
        "    else if test $skip = 1",
        "        set slot value",
        '    else if contains -- "$path|$npos" $starts; and not string match -q -- \'-*\' '
        "(commandline -ct)",
        "        set slot cmd; set start (math $i + 1)",
        "    end",
        "    printf '%s\\n' $path $slot $start",
        "end",
    ]


def _helpers() -> list[str]:
    bundled = " ".join(bundled_locks())
    return [
        "function __envguard_is --argument-names path slot --description 'is the cursor there'",
        "    set -l at (__envguard_where)",
        '    test "$at[1]" = "$path"; or return 1',
        '    if test "$slot" = opt; test "$at[2]" != cmd; else; test "$at[2]" = "$slot"; end',
        "end",
        "function __envguard_is_past --description 'is the cursor past the positionals'",
        "    set -l at (__envguard_where)",
        '    test "$at[2]" = past',
        "end",
        "function __envguard_is_running --description 'is the cursor in the command it runs'",
        "    set -l at (__envguard_where)",
        '    test "$at[2]" = cmd',
        "end",
        "function __envguard_command_line --description 'complete the command envguard runs'",
        "    set -l at (__envguard_where)",
        "    set -l tokens (commandline -opc)",
        "    set -l words",
        "    if test $at[3] -le (count $tokens)",
        "        set words (string escape -- $tokens[$at[3]..-1])",
        "    end",
        "    complete --do-complete=(string join ' ' -- $words (commandline -ct))",
        "end",
        "function __envguard_values --argument-names kind --description 'aliases, lock names'",
        f"    set -l locks {bundled}",
        "    for f in lockfiles/*.toml",
        "        if test -f \"$f\"; and string match -qr "
        "'^lockfiles/[A-Za-z0-9][A-Za-z0-9._+-]*\\.toml$' -- \"$f\"",
        "            set -l name (string replace -r '^lockfiles/(.*)\\.toml$' '$1' -- \"$f\")",
        "            contains -- $name $locks; or set -a locks $name",
        "        end",
        "    end",
        "    switch $kind",
        f"        case {LOCK} {LOCK_OR_FILE}",
        "            printf '%s\\n' $locks",
        f"        case {SNAPSHOT}",
        f"            printf '%s\\n' {' '.join(aliases(SNAPSHOT))}",
        f"            printf '{LAST_GOOD_OF}%s\\n' $locks",
        f"        case {RECORDED}",
        f"            printf '%s\\n' {' '.join(aliases(RECORDED))}",
        f"            printf '{LAST_GOOD_OF}%s\\n' $locks",
        "    end",
        "end",
    ]


def fish_script(tree: list[Command]) -> str:
    lines = [
        f"# fish completion for envguard {__version__}, generated from its parser by",
        "# 'envguard completion fish'. Use:",
        "# envguard completion fish > ~/.config/fish/completions/envguard.fish",
        *_where(tree),
        *_helpers(),
        "complete -c envguard -e",
        "complete -c envguard -n '__envguard_is_running' -f -a '(__envguard_command_line)'",
        "complete -c envguard -n '__envguard_is_past' -f",
    ]
    for c in tree:
        lines += [f"complete -c envguard -n \"__envguard_is '{c.path}' 0\" -f -a {_quote(n)} "
                  f"-d {_quote(h)}" for n, h in c.commands]
        lines += [_option(c.path, o) for o in c.options]
        lines += [f"complete -c envguard -n \"__envguard_is '{c.path}' {i}\" {_arguments(v)}"
                  for i, v in enumerate(c.positionals) if v.kind != FILES]
    return "\n".join([*lines, ""])
