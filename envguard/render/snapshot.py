"""``envguard snapshot``'s compact summary on stderr: a pure function of the snapshot (the
snapshot itself is the file it writes; no other format)."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from envguard.model import Snapshot
from envguard.redact import redact_text
from envguard.render.sanitize import clean, clean_path
from envguard.units import human_bytes


def _torch_line(s: Snapshot) -> Text:
    t = s.torch
    if not t.present:
        return Text("not installed", style="dim")
    parts = [clean(t.version or "unknown version")]
    parts.append(f"git {clean(t.git_version[:12])}" if t.git_version else "git unknown")
    parts.append(f"CUDA {clean(t.cuda)}" if t.cuda else ("HIP " + clean(t.hip) if t.hip else "CPU"))
    if t.triton_version:
        parts.append(f"triton {clean(t.triton_version)}")
    if t.cuda_wheel_family:
        parts.append(f"wheels {clean(t.cuda_wheel_family)}")
    return Text(" · ".join(parts))


def _integrity_line(s: Snapshot) -> Text:
    i = s.integrity
    if i.mode == "none":
        return Text("not checked (--verify none)", style="dim")
    head = f"{i.checked_files:,} files, {human_bytes(i.checked_bytes)} ({i.mode})"
    if i.checked_by_folder:
        head += f" + {i.checked_by_folder:,} headers by folder"
    if not i.issues:
        return Text(f"{head}: all match RECORD", style="green")
    packages = sorted({x.package for x in i.issues})
    shown = ", ".join(clean(p) for p in packages[:5]) + (" …" if len(packages) > 5 else "")
    text = Text(f"{head}: ")
    text.append(f"{len(i.issues)} differ from RECORD in {shown}", style="bold yellow")
    cached = sum(1 for x in i.issues if x.shared_with)
    linked = sum(1 for x in i.issues if x.links) - cached
    if cached or linked:
        text.append(" (" + ", ".join(
            ([f"{cached} shared with uv's cache by hard link"] if cached else [])
            + ([f"{linked} hard-linked elsewhere"] if linked else [])) + ")", style="yellow")
    return text


def _caches_line(s: Snapshot) -> Text:
    text = Text()
    for n, c in enumerate(s.caches):
        if n:
            text.append("; ")
        state = human_bytes(c.total_bytes) if c.exists else "absent"
        style = "" if c.exists and c.files else "yellow" if c.kind == "inductor" else "dim"
        fs = f" on {clean(c.filesystem)}" if c.filesystem in ("tmpfs", "ramfs") else ""
        text.append(f"{c.kind} {state}{fs}", style=style)
    return text


def _gpu_line(s: Snapshot) -> Text:
    sysinfo = s.system
    if sysinfo.gpu_probe != "ok" or not sysinfo.gpus:
        return Text("none found" if sysinfo.gpu_probe == "absent" else "nvidia-smi failed",
                    style="dim")
    names: dict[str, int] = {}
    for gpu in sysinfo.gpus:
        names[gpu.name] = names.get(gpu.name, 0) + 1
    body = ", ".join(f"{n}× {clean(name)}" for name, n in names.items())
    return Text(f"{body} · driver {clean(sysinfo.driver_version or '?')}")


def snapshot_summary(s: Snapshot, destination: str | None) -> RenderableType:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("python", Text(f"{clean(s.interpreter.version)} "
                                 f"{clean_path(s.interpreter.executable)}"))
    table.add_row("torch", _torch_line(s))
    editable = sum(1 for p in s.packages if p.editable)
    table.add_row("packages", Text(f"{len(s.packages)} distributions"
                                   + (f", {editable} editable" if editable else "")))
    table.add_row("integrity", _integrity_line(s))
    table.add_row("caches", _caches_line(s))
    table.add_row("gpu", _gpu_line(s))
    tracked = s.files.files
    if tracked or s.files.git:
        missing = sum(1 for f in tracked if not f.exists)
        git = s.files.git
        git_text = ""
        if git is not None:
            git_text = f" · git {clean((git.commit or 'no commit')[:12])}"
            git_text += f" ({len(git.dirty)} dirty)" if git.dirty else " (clean)"
        table.add_row("files", Text(f"{len(tracked)} tracked" + (f", {missing} missing"
                                                                  if missing else "") + git_text))
    if s.deep is not None:
        deep = s.deep
        table.add_row("deep", Text(f"cuda available: {deep.cuda_available}" if deep.ok
                                   else clean(deep.error or "failed"),
                                   style="" if deep.ok else "bold red"))
    if s.errors:
        err = Text(f"{len(s.errors)} recorded", style="yellow")
        for issue in s.errors[:5]:
            where = f" ({clean_path(issue.path)})" if issue.path else ""
            err.append(f"\n{clean(issue.section)}: {clean(issue.message, 200)}{where}", style="dim")
        if len(s.errors) > 5:
            err.append(f"\n… {len(s.errors) - 5} more in the snapshot's 'errors'", style="dim")
        table.add_row("errors", err)
    footer = Text(f"snapshot taken in {s.duration_s:.2f} s", style="dim")
    if destination:
        footer.append(f" → {clean_path(redact_text(destination))}", style="dim")
    return Group(table, footer)
