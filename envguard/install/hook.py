"""``envguard shell-hook``: shell functions that send installs in an active venv through
``envguard install``.

The functions are named ``pip``, ``pip3`` and ``uv``. While ``VIRTUAL_ENV`` is set and
``ENVGUARD_HOOK`` is not ``0``, ``pip install|uninstall`` and ``uv pip
install|uninstall|sync`` run as ``envguard install --python "$VIRTUAL_ENV" -- <the
command>``; a command that names its own target (``--python``, ``-p``, ``--system``,
``--target``, ``-t``, ``--prefix``, ``--user``, ``--root``) and everything else go to the
real program untouched. Bypass for one command: ``command pip …`` or ``ENVGUARD_HOOK=0 pip
…``. The text is constant: nothing of the environment or the user goes into it, and
nothing is written anywhere; it takes effect only where the user evals it.
"""

from __future__ import annotations

SHELLS = ("bash", "zsh", "fish")
_TARGETS = ("--python", "-p", "--system", "--target", "-t", "--prefix", "--user", "--root")

_POSIX = """\
# envguard shell hook ({shell}): pip and uv pip installs in an active venv go through
# envguard install (a prediction first; refused when it would break the venv).
# Bypass for one command: command pip ...  or  ENVGUARD_HOOK=0 pip ...
_envguard_hook_routes() {{
    [ -n "${{VIRTUAL_ENV:-}}" ] && [ "${{ENVGUARD_HOOK:-1}}" != 0 ] || return 1
    local word
    for word in "$@"; do
        case "$word" in
            {targets}) return 1 ;;
        esac
    done
    return 0
}}
_envguard_hook_pip() {{
    local program="$1"; shift
    case "${{1:-}}" in
        install|uninstall)
            if _envguard_hook_routes "$@"; then
                command envguard install --python "$VIRTUAL_ENV" -- "$program" "$@"
                return
            fi ;;
    esac
    command "$program" "$@"
}}
pip() {{ _envguard_hook_pip pip "$@"; }}
pip3() {{ _envguard_hook_pip pip3 "$@"; }}
uv() {{
    if [ "${{1:-}}" = pip ]; then
        case "${{2:-}}" in
            install|uninstall|sync)
                if _envguard_hook_routes "$@"; then
                    command envguard install --python "$VIRTUAL_ENV" -- uv "$@"
                    return
                fi ;;
        esac
    fi
    command uv "$@"
}}
"""

_FISH = """\
# envguard shell hook (fish): pip and uv pip installs in an active venv go through
# envguard install (a prediction first; refused when it would break the venv).
# Bypass for one command: command pip ...  or  ENVGUARD_HOOK=0 pip ...
function _envguard_hook_routes
    set -q VIRTUAL_ENV; or return 1
    test -n "$VIRTUAL_ENV"; or return 1
    test "$ENVGUARD_HOOK" != 0; or return 1
    for word in $argv
        switch $word
            case {targets}
                return 1
        end
    end
    return 0
end
function _envguard_hook_pip
    set -l program $argv[1]
    set -e argv[1]
    if contains -- "$argv[1]" install uninstall; and _envguard_hook_routes $argv
        command envguard install --python "$VIRTUAL_ENV" -- $program $argv
    else
        command $program $argv
    end
end
function pip --wraps pip
    _envguard_hook_pip pip $argv
end
function pip3 --wraps pip3
    _envguard_hook_pip pip3 $argv
end
function uv --wraps uv
    if test "$argv[1]" = pip; and contains -- "$argv[2]" install uninstall sync
        and _envguard_hook_routes $argv
        command envguard install --python "$VIRTUAL_ENV" -- uv $argv
    else
        command uv $argv
    end
end
"""


def hook_text(shell: str) -> str:
    """The hook for ``shell`` (one of :data:`SHELLS`)."""
    if shell == "fish":
        return _FISH.format(targets=" ".join(f"'{t}' '{t}=*'" for t in _TARGETS))
    patterns = "|".join(f"{t}|{t}=*" for t in _TARGETS)
    return _POSIX.format(shell=shell, targets=patterns)
