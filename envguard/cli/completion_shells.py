"""The bash and zsh scripts of ``envguard completion``, written from :func:`command_tree`.

Both are static tables over the command paths plus one loop, shared by the two shells
(:func:`_path_loop`), that reads the words before the cursor: the command path, the
positional the cursor is at, whether it is an option's value, or inside the command line
of ``envguard run -- CMD``. Snapshot and lock values (:data:`VALUES`) are completed by
``_envguard_values``, which globs ``lockfiles/*.toml`` when the shell completes and
offers only the names that are plain tokens (never expanded, never run).
"""

from __future__ import annotations

from collections.abc import Iterable

from envguard.cli.completion_tree import (
    CHOICES,
    FILES,
    LAST_GOOD_OF,
    LOCK,
    LOCK_OR_FILE,
    RECORDED,
    SNAPSHOT,
    Command,
    Values,
    aliases,
    bundled_locks,
)
from envguard.version import __version__

_NAME_OK = "$name == [A-Za-z0-9]* && $name != *[!A-Za-z0-9._+-]*"
"""The shells' test that a globbed lock name is a plain token (:data:`LOCK_NAME`)."""


def _alternatives(patterns: Iterable[str]) -> str:
    return "|".join(patterns) or "__none"


def _grouped(pairs: Iterable[tuple[str, str]], indent: str) -> list[str]:
    """``case`` branches, the patterns that share an action joined into one."""
    by_action: dict[str, list[str]] = {}
    for pattern, action in pairs:
        by_action.setdefault(action, []).append(pattern)
    return [f"{indent}{'|'.join(p)}) {a} ;;" for a, p in by_action.items()]


def _call(values: Values) -> str:
    return " ".join(("_envguard_values", values.kind, *values.choices))


def _value_cases(tree: list[Command]) -> list[tuple[str, str]]:
    """(``"path|--option"``, call) of the options whose values are not plain files."""
    return [(f'"{c.path}|{n}"', _call(o.values)) for c in tree for o in c.options
            if o.values and o.values.kind != FILES for n in o.names]


def _positional_cases(tree: list[Command]) -> list[tuple[str, str]]:
    """(``"path|index"``, call) of every positional; past the last one of a command that
    takes a fixed number, nothing (``:``)."""
    simple = [c for c in tree if not c.commands]
    cases = [(f'"{c.path}|{i}"', _call(v)) for c in simple for i, v in enumerate(c.positionals)]
    return cases + [(f'"{c.path}|"*', ":") for c in simple
                    if not c.repeats and c.command_at is None]


def _path_loop(first: str, last: str, tree: list[Command]) -> list[str]:
    """Shell code (bash and zsh alike) reading ``words[first..last-1]``: ``cmdpath``, the
    command path; ``npos``, the positional the cursor is at; ``skip`` (1) with ``valued``
    (``path|--option``) when the cursor is that option's value; ``after``, the words of a
    command line being run (1 at its command, more at its arguments)."""
    valued = _alternatives(f'"{c.path}|{n}"' for c in tree for o in c.options if o.values
                           for n in o.names)
    subs = _alternatives(f'"{c.path}|{name}"' for c in tree for name, _ in c.commands)
    runs = _alternatives(f'"{c.path}"' for c in tree if c.command_at is not None)
    starts = _alternatives(f'"{c.path}|{c.command_at}"' for c in tree
                           if c.command_at is not None)
    clamps = [(f'"{c.path}"', f"if (( npos > {len(c.positionals) - 1} )); then "
               f"npos={len(c.positionals) - 1}; fi") for c in tree if c.repeats]
    return [
        f"    for ((i = {first}; i < {last}; i++)); do",
        '        word="${words[i]}"',
        "        if (( after > 0 )); then after=$((after + 1)); continue; fi",
        '        if (( skip )); then skip=0; valued=""; continue; fi',
        f'        if [[ $word == -- ]]; then case "$cmdpath" in {runs}) after=1 ;; esac; '
        "continue; fi",
        '        case "$cmdpath|$word" in',
        f'            {valued}) skip=1; valued="$cmdpath|$word"; continue ;;',
        f'            {subs}) cmdpath="${{cmdpath:+$cmdpath }}$word"; npos=0; continue ;;',
        "        esac",
        "        if [[ $word == -?* ]]; then continue; fi",
        f'        case "$cmdpath|$npos" in {starts}) after=2; continue ;; esac',
        "        npos=$((npos + 1))",
        "    done",
        '    case "$cmdpath" in',
        *_grouped(clamps, "        "),
        "    esac",
        "    if (( after == 0 && skip == 0 )) && [[ $cur != -* ]]; then",
        f'        case "$cmdpath|$npos" in {starts}) after=1 ;; esac',
        "    fi",
    ]


def _offers(kind: str, per_lock: str) -> str:
    """The words a snapshot value offers: the aliases, then ``per_lock`` (the shell's
    expansion of @last-good:NAME for each lock name)."""
    return " ".join([*aliases(kind), per_lock])


# ------------------------------------------------------------------------- bash

def _bash_values() -> list[str]:
    bundled = bundled_locks()
    per_lock = f'"${{locks[@]/#/{LAST_GOOD_OF}}}"'
    return [
        "_envguard_offer() {  # the words given that begin with $cur, none of them expanded",
        "    local w",
        '    for w; do if [[ $w == "$cur"* ]]; then COMPREPLY+=("$w"); fi; done',
        "}",
        "_envguard_files() {  # file names, quoted by readline as file names",
        "    compopt -o filenames 2>/dev/null",
        '    local f; while IFS= read -r f; do COMPREPLY+=("$f"); done < <(compgen -f -- "$cur")',
        "}",
        "_envguard_refs() {  # the words given, and file names unless $cur begins with @",
        '    _envguard_offer "$@"; if [[ $cur != @* ]]; then _envguard_files; fi',
        "}",
        "_envguard_commands() {",
        '    local f; while IFS= read -r f; do COMPREPLY+=("$f"); done < <(compgen -c -- "$cur")',
        "}",
        "_envguard_values() {  # a value of kind $1 (choices, files, a snapshot, a lock)",
        f'    local kind="$1" f name; local -a locks=({" ".join(bundled)})',
        "    shift",
        '    case "$kind" in',
        f"        {LOCK}|{LOCK_OR_FILE}|{SNAPSHOT}|{RECORDED})",
        "            while IFS= read -r f; do",
        '                name="${f#lockfiles/}"; name="${name%.toml}"',
        f'                case "$name" in {_alternatives(bundled)}) continue ;; esac',
        f'                if [[ $f == "lockfiles/$name.toml" && -f $f && {_NAME_OK} ]]; then',
        '                    locks+=("$name")',
        "                fi",
        "            done < <(compgen -G 'lockfiles/*.toml') ;;",
        "    esac",
        '    case "$kind" in',
        f'        {CHOICES}) _envguard_offer "$@" ;;',
        f'        {LOCK}) _envguard_offer "${{locks[@]}}" ;;',
        f'        {LOCK_OR_FILE}) _envguard_offer "${{locks[@]}}"; _envguard_files ;;',
        f"        {SNAPSHOT}) _envguard_refs {_offers(SNAPSHOT, per_lock)} ;;",
        f"        {RECORDED}) _envguard_refs {_offers(RECORDED, per_lock)} ;;",
        "        *) _envguard_files ;;",
        "    esac",
        "}",
    ]


def bash_script(tree: list[Command]) -> str:
    lines = [
        f"# bash completion for envguard {__version__}, generated from its parser by",
        "# 'envguard completion bash'. Use: eval \"$(envguard completion bash)\"",
        *_bash_values(),
        "_envguard() {",
        "    # bash splits words at the characters of COMP_WORDBREAKS (@ : = ...): what was",
        "    # typed with no blank between is joined again, one word as envguard gets it.",
        '    local -a words=(); local line="${COMP_LINE:0:COMP_POINT}" word i n=-1',
        "    for ((i = 0; i <= COMP_CWORD; i++)); do",
        '        word="${COMP_WORDS[i]}"',
        "        if (( n < 0 )) || [[ -z $COMP_LINE || $line == [[:blank:]]* ]]; then",
        '            n=$((n + 1)); words[n]=""',
        "        fi",
        '        line="${line#"${line%%[![:blank:]]*}"}"; line="${line#"$word"}"',
        '        words[n]+="$word"',
        "    done",
        '    local cur="${words[n]}" cmdpath="" valued="" pre skip=0 after=0 npos=0',
        *_path_loop("1", "n", tree),
        "    if (( after == 0 && skip == 0 )) && [[ $cur == --*=* ]]; then",
        '        skip=1; valued="$cmdpath|${cur%%=*}"; cur="${cur#*=}"',
        "    fi",
        "    # readline replaces the text after the last word break (@ and $ stay in it):",
        "    # the replies leave out what is before",
        '    pre="$cur"',
        '    while [[ -n $pre && ( $COMP_WORDBREAKS != *"${pre: -1}"* || ${pre: -1} == [@$] ) ]]',
        '    do pre="${pre%?}"; done',
        "    COMPREPLY=()",
        "    if (( after == 1 )); then _envguard_commands",
        "    elif (( after > 1 )); then _envguard_files",
        "    elif (( skip )); then",
        '        case "$valued" in',
        *_grouped(_value_cases(tree), "            "),
        "            *) _envguard_files ;;",
        "        esac",
        "    elif [[ $cur == -* ]]; then",
        '        case "$cmdpath" in',
        *_grouped(((f'"{c.path}"', " ".join(["_envguard_offer", *(n for o in c.options
                    for n in o.names)])) for c in tree if c.options), "            "),
        "        esac",
        "    else",
        '        case "$cmdpath|$npos" in',
        *_grouped(((f'"{c.path}|"*', " ".join(["_envguard_offer", *(n for n, _ in c.commands)]))
                   for c in tree if c.commands), "            "),
        *_grouped(_positional_cases(tree), "            "),
        "            *) _envguard_files ;;",
        "        esac",
        "    fi",
        '    if [[ -n $pre ]]; then COMPREPLY=("${COMPREPLY[@]#"$pre"}"); fi',
        "}",
        "complete -F _envguard envguard",
        "",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------------- zsh

def _zsh_item(name: str, text: str) -> str:
    """One ``name:description`` of _describe, single-quoted for zsh."""
    text = " ".join(text.split()).replace("'", "'\\''")
    return f"'{name}:{text}'"


def _zsh_values() -> list[str]:
    bundled = bundled_locks()
    per_lock = f"${{locks/#/{LAST_GOOD_OF}}}"
    return [
        "_envguard_values() {  # a value of kind $1 (choices, files, a snapshot, a lock)",
        "    emulate -L zsh",
        "    local kind=$1 f name",
        f"    local -a locks; locks=({' '.join(bundled)})",
        "    shift",
        "    case $kind in",
        f"        ({LOCK}|{LOCK_OR_FILE}|{SNAPSHOT}|{RECORDED})",
        "            for f in lockfiles/*.toml(N.); do",
        "                name=${${f#lockfiles/}%.toml}",
        f"                case $name in ({_alternatives(bundled)}) continue ;; esac",
        f"                if [[ {_NAME_OK} ]]; then locks+=($name); fi",
        "            done ;;",
        "    esac",
        "    case $kind in",
        f'        ({CHOICES}) compadd -- "$@" ;;',
        f"        ({LOCK}) compadd -- $locks ;;",
        f"        ({LOCK_OR_FILE}) compadd -- $locks; _files ;;",
        f"        ({SNAPSHOT}) compadd -- {_offers(SNAPSHOT, per_lock)}; _files ;;",
        f"        ({RECORDED}) compadd -- {_offers(RECORDED, per_lock)}; _files ;;",
        "        (*) _files ;;",
        "    esac",
        "}",
    ]


def zsh_script(tree: list[Command]) -> str:
    lines = [
        "#compdef envguard",
        f"# zsh completion for envguard {__version__}, generated from its parser by",
        "# 'envguard completion zsh'. Use: eval \"$(envguard completion zsh)\" after compinit,",
        "# or save it as _envguard in a folder of $fpath.",
        *_zsh_values(),
        "_envguard() {",
        '    local cmdpath="" word="" valued="" cur="${words[CURRENT]}"',
        "    local -i i skip=0 after=0 npos=0",
        "    local -a commands options",
        *_path_loop("2", "CURRENT", tree),
        "    if (( after == 1 )); then _command_names -e; return; fi",
        "    if (( after > 1 )); then _files; return; fi",
        "    if (( skip )); then",
        '        case "$valued" in',
        *_grouped(_value_cases(tree), "            "),
        "            *) _files ;;",
        "        esac",
        "        return",
        "    fi",
        '    case "$cmdpath" in',
    ]
    for c in tree:
        cmds = " ".join(_zsh_item(n, h) for n, h in c.commands)
        opts = " ".join(_zsh_item(n, o.help) for o in c.options for n in o.names)
        lines.append(f'        "{c.path}") commands=({cmds}); options=({opts}) ;;')
    lines += [
        "    esac",
        "    if [[ $cur == -* ]]; then",
        "        _describe -t options option options",
        "    elif (( ${#commands} )); then",
        "        _describe -t commands command commands",
        "    else",
        '        case "$cmdpath|$npos" in',
        *_grouped(_positional_cases(tree), "            "),
        "            *) _files ;;",
        "        esac",
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
