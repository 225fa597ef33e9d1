"""``envguard cache`` output: pure functions of the store's data, no I/O. ``cache status``
in text, Markdown and JSON; the lines of ``cache save`` and ``cache restore``.

Paths, names and versions come from the environment or from a store that anyone may
have written; every one goes through :func:`clean` and into ``Text``, never markup.
"""

from __future__ import annotations

from datetime import datetime, timezone

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from envguard.cache.manifest import (
    Build,
    Manifest,
    StoredArchive,
    build_differences,
    build_label,
    short_key,
)
from envguard.cache.store import CacheState, CacheStatus, Restored
from envguard.render.markdown import md, md_table
from envguard.render.sanitize import clean, clean_path
from envguard.units import human_bytes

_STATE_STYLE = {"valid": "green", "stale": "bold yellow", "unknown": "", "empty": "yellow",
                "missing": "dim"}


def age(seconds: float | None) -> str:
    """``40 s``, ``12 min``, ``5 h``, ``3 d``; ``–`` when unknown."""
    if seconds is None:
        return "–"
    s = max(0.0, seconds)
    for limit, unit, div in ((120, "s", 1), (7200, "min", 60), (172800, "h", 3600)):
        if s < limit:
            return f"{s / div:.0f} {unit}"
    return f"{s / 86400:.0f} d"


def build_line(b: Build) -> str:
    """The build in one line: torch, triton, GPUs and the short compat key."""
    parts = [clean(build_label(b))]
    if b.triton_version:
        parts.append(f"triton {clean(b.triton_version)}")
    parts.append("GPUs " + (", ".join(clean(g) for g in b.gpus) if b.gpus else "none found"))
    parts.append(f"compat key {short_key(b.compat_key)}")
    return " · ".join(parts)


def differences(saved: Build, current: Build) -> str:
    """What separates two builds, most telling first."""
    return clean(build_differences(saved, current), 600)


def refusal(name: str, saved: Build, current: Build, *, named: bool = True) -> str:
    """One line: why a stale archive is not restored."""
    head = "" if named else "no archive in the store was saved under this build; "
    return clean(f"{head}refused to restore {name}: {differences(saved, current)}; torch "
                 "would miss every entry silently. Pass --force to restore it anyway", 1200)


def _fs(c: CacheState) -> Text:
    if c.filesystem is None:
        return Text("?", style="dim")
    return Text(clean(c.filesystem, 20), style="bold yellow" if c.tmpfs else "")


def _caches_table(st: CacheStatus) -> Table:
    table = Table(title="compile caches", title_justify="left", show_edge=False, pad_edge=False)
    for col in ("kind", "state", "files", "size", "fs", "newest"):
        table.add_column(col, justify="right" if col in ("files", "size") else "left",
                         no_wrap=True)
    table.add_column("path", overflow="fold", ratio=1)
    for c in st.caches:
        state = Text(c.state, style=_STATE_STYLE.get(c.state, ""))
        if c.state == "valid" and c.other_builds:
            state.append(f" (+{len(c.other_builds)})", style="dim")
        newest = age(st.now - c.newest_mtime) if c.newest_mtime is not None else "–"
        table.add_row(c.kind, state, f"{c.files:,}" if c.state != "missing" else "–",
                      human_bytes(c.total_bytes) if c.state != "missing" else "–",
                      _fs(c), newest, Text(clean_path(c.path, 300)))
    return table


def _notes(st: CacheStatus) -> Text:
    notes = Text(style="dim")
    for c in st.caches:
        if c.tmpfs and c.state != "missing":
            notes.append(f"{c.kind} cache is on {clean(c.filesystem)}: lost at reboot; "
                         "envguard cache save keeps a copy\n", style="yellow")
        if c.other_builds:
            what = "filled under" if c.state == "stale" else "also holds entries of"
            notes.append(f"{c.kind} cache {what}: "
                         + "; ".join(clean(b, 200) for b in c.other_builds) + "\n")
    notes.rstrip()
    return notes


def _archive_row(a: StoredArchive, now: float) -> list[RenderableType]:
    name = Text(clean(a.name, 130))
    m = a.manifest
    if m is None:
        name.append("\n" + clean(a.problem or "", 300), style="dim")
        return [name, Text("unusable", style="bold red"), "", "", ""]
    name.append(f"\n{clean(build_label(m.build))}", style="dim")
    match = Text("yes", style="green") if a.matches else Text("no", style="yellow")
    return [name, match, f"{m.files:,}", human_bytes(m.total_bytes), _created(m, now)]


def _created(m: Manifest, now: float) -> str:
    try:
        when = datetime.strptime(m.created, "%Y-%m-%dT%H:%M:%S.%fZ")
    except ValueError:
        return clean(m.created, 40)
    return f"{age(now - when.replace(tzinfo=timezone.utc).timestamp())} ago"


def text(st: CacheStatus, show_all: bool = False) -> RenderableType:
    head = Text("this environment: ", style="bold")
    head.append(build_line(st.build))
    parts: list[RenderableType] = [head, Text(), _caches_table(st)]
    notes = _notes(st)
    if notes.plain:
        parts.append(notes)
    parts.append(Text())
    store = Text(f"archives in {clean_path(st.store)}", style="bold")
    if not st.archives:
        store.append(": none (envguard cache save makes one)", style="dim")
        parts.append(store)
        return Group(*parts)
    table = Table(title=store, title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("name · build", overflow="fold", ratio=1)
    for col in ("this build", "files", "size", "saved"):
        table.add_column(col, justify="right" if col in ("files", "size") else "left",
                         no_wrap=True)
    for a in st.archives:
        table.add_row(*_archive_row(a, st.now))
    parts.append(table)
    return Group(*parts)


def saved_lines(m: Manifest, folder: str, seconds: float) -> list[str]:
    parts = ", ".join(f"{p.kind} {p.files:,} files {human_bytes(p.total_bytes)}"
                      for p in m.archives)
    lines = [f"saved {clean(m.name)} → {clean_path(folder, 300)} ({parts}; "
             f"{human_bytes(sum(p.tar_bytes for p in m.archives))} on disk) in {seconds:.1f} s",
             f"  build: {build_line(m.build)}"]
    return lines


def save_warnings(m: Manifest) -> list[str]:
    out = []
    for p in m.archives:
        if p.state_at_save == "stale":
            out.append(f"the {p.kind} cache's marker names only other builds: the archive is "
                       "labelled with this build, but its entries may not match it")
        if p.skipped:
            shown = "; ".join(clean(s, 120) for s in p.skipped[:3])
            more = f" and {len(p.skipped) - 3} more" if len(p.skipped) > 3 else ""
            out.append(f"{p.kind}: left out {len(p.skipped)} entries: {shown}{more}")
    return out


def restored_lines(name: str, done: list[Restored], seconds: float) -> list[str]:
    lines = []
    for r in done:
        lines.append(f"restored {clean(name)}: {r.kind} cache, {r.files:,} files → "
                     f"{clean_path(r.target, 300)}")
        if r.previous:
            lines.append(f"  the previous {r.kind} cache is kept at "
                         f"{clean_path(r.previous, 300)} (delete it once the restored one "
                         "works)")
    lines.append(f"done in {seconds:.1f} s")
    return lines


def markdown(st: CacheStatus, show_all: bool = False) -> str:
    b = st.build
    out = ["## envguard cache status", "",
           f"This environment: {md(build_label(b))}"
           + (f" · triton {md(b.triton_version)}" if b.triton_version else "")
           + f" · compat key `{md(short_key(b.compat_key))}`", ""]
    rows = [(md(c.kind), md(c.state), "–" if c.state == "missing" else f"{c.files:,}",
             "–" if c.state == "missing" else human_bytes(c.total_bytes),
             md(c.filesystem or "?"), f"`{md(c.path, 300)}`") for c in st.caches]
    out += md_table(("kind", "state", "files", "size", "fs", "path"), rows)
    if not st.archives:
        return "\n".join([*out, f"No archives in `{md(st.store)}` (`envguard cache save`).", ""])
    archive_rows = [(md(a.name, 130),
                     "unusable" if a.manifest is None else ("yes" if a.matches else "no"),
                     "" if a.manifest is None else f"{a.manifest.files:,}",
                     "" if a.manifest is None else human_bytes(a.manifest.total_bytes))
                    for a in st.archives]
    out += [f"Archives in `{md(st.store)}`:", ""]
    out += md_table(("name", "this build", "files", "size"), archive_rows)
    return "\n".join(out)


def json(st: CacheStatus, show_all: bool = False) -> str:
    from envguard.render import json_text

    return json_text(st.to_dict())
