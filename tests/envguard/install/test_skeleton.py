"""The copy a prediction keeps for the next one (envguard/install/skeleton.py): brought up to
date it is exactly a new copy, whatever was done to it, and nothing in it is followed; kept
unchanged it costs no new entry; after the installer, what it wrote is moved aside. Real uv
venvs from tiny wheels, real uv runs on the copy."""

from __future__ import annotations

import json
import os
from pathlib import Path

from envguard.install.scratch import LinkGuard, metadata_clone
from envguard.install.skeleton import clone_plan, inventory, prune, realize
from tests.envguard.install.test_install import (
    envguard,
    kept_copy,
    kept_copy_is_bare,
    no_copy_left,
)
from tests.envguard.install.test_transplant import tree
from tests.wheelfactory import Venv, VenvFactory, build_wheel, run_checked


def two_packages(venvs: VenvFactory) -> Venv:
    for name in ("alpha", "beta"):
        build_wheel(venvs.wheels, name, "1.0", {f"{name}/__init__.py": "A = 1\n"},
                    scripts={f"{name}-cli": f"{name}:A"})
    env = venvs.create("env")
    venvs.uv_install(env, venvs.wheels / "alpha-1.0-py3-none-any.whl",
                     venvs.wheels / "beta-1.0-py3-none-any.whl")
    return env


def sites(env: Venv) -> list[str]:
    return [str(env.site_packages())]


def test_a_kept_copy_brought_up_to_date_is_a_new_copy_and_nothing_is_followed(
        venvs: VenvFactory, tmp_path: Path) -> None:
    env = two_packages(venvs)
    prefix = env.path.resolve()
    fresh, kept = tmp_path / "fresh", tmp_path / "kept"
    metadata_clone(prefix, kept, sites(env), LinkGuard(), with_pip=False)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("keep me", encoding="utf-8")
    site = next(kept.glob("lib/python3*/site-packages"))
    alpha = next(site.glob("alpha-1.0.dist-info"))
    (alpha / "extra").write_text("left by an installer", encoding="utf-8")
    (site / "newpkg" / "deep").mkdir(parents=True)  # a package an installer wrote
    (site / "newpkg" / "deep" / "mod.py").write_text("", encoding="utf-8")
    os.unlink(alpha / "METADATA")  # a link led elsewhere
    (alpha / "METADATA").symlink_to(outside / "victim")
    beta = next(site.glob("beta-1.0.dist-info"))
    os.rename(beta, tmp_path / "beta-moved")  # a folder replaced by a link leading out
    beta.symlink_to(outside)
    (kept / "pyvenv.cfg").write_text("home = /elsewhere\n", encoding="utf-8")
    os.rename(kept / "bin", tmp_path / "bin-moved")  # a planned folder made a link out
    (kept / "bin").symlink_to(outside)
    os.mkfifo(site / "stray.pth")
    # the venv changed too: beta uninstalled, gamma installed
    build_wheel(venvs.wheels, "gamma", "1.0", {"gamma.py": ""})
    run_checked([venvs.uv, "pip", "uninstall", "--quiet", "--python", str(env.python), "beta"],
                env=venvs._env())
    venvs.uv_install(env, venvs.wheels / "gamma-1.0-py3-none-any.whl")

    made = realize(clone_plan(prefix, kept, sites(env), with_pip=False), kept, LinkGuard())
    metadata_clone(prefix, fresh, sites(env), LinkGuard(), with_pip=False)
    assert made.kept > 0
    ours = {k: v.replace(str(kept), "ROOT") for k, v in tree(kept).items()}
    theirs = {k: v.replace(str(fresh), "ROOT") for k, v in tree(fresh).items()}
    assert ours == theirs
    assert made.made == inventory(str(kept))  # the walk's own inventory, not another
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert (outside / "victim").read_text(encoding="utf-8") == "keep me"


def test_an_unchanged_kept_copy_makes_no_entry(venvs: VenvFactory, tmp_path: Path) -> None:
    env = two_packages(venvs)
    prefix, kept = env.path.resolve(), tmp_path / "kept"
    plan = clone_plan(prefix, kept, sites(env), with_pip=False)
    realize(plan, kept, LinkGuard())
    before = inventory(str(kept))
    guard = LinkGuard()
    made = realize(clone_plan(prefix, kept, sites(env), with_pip=False), kept, guard)
    assert made.kept == len(plan)
    assert inventory(str(kept)) == before  # every entry the same inode, untouched
    assert made.made == before
    assert guard.keys, "the links kept are guarded as new ones are"


def test_what_the_installer_wrote_is_moved_aside_in_few_renames(
        venvs: VenvFactory, tmp_path: Path) -> None:
    env = two_packages(venvs)
    build_wheel(venvs.wheels, "alpha", "2.0", {"alpha/__init__.py": "A = 2\n",
                                               "alpha/sub/x.py": ""})
    prefix, kept = env.path.resolve(), tmp_path / "kept"
    metadata_clone(prefix, kept, sites(env), LinkGuard(), with_pip=False)
    made = inventory(str(kept))
    run_checked([venvs.uv, "pip", "install", "--quiet", "--python", str(env.python), "--prefix",
                 str(kept), "--no-index", "--find-links", str(venvs.wheels), "alpha==2.0"],
                env=venvs._env())
    assert not kept_copy_is_bare(kept)
    moved = prune(kept, made, tmp_path / "aside")
    assert kept_copy_is_bare(kept)
    # alpha/, alpha-2.0.dist-info/, bin/alpha-cli: one rename each, not one a file
    assert moved == 3
    assert {k: v for k, v in inventory(str(kept)).items()} == {
        k: v for k, v in made.items() if os.path.lexists(kept / k)}


def test_the_second_install_finds_the_copy_kept(venvs: VenvFactory, tmp_path: Path) -> None:
    env = two_packages(venvs)
    build_wheel(venvs.wheels, "gamma", "1.0", {"gamma.py": ""})
    cwd = tmp_path / "work"
    cwd.mkdir()
    costs = []
    for name in ("gamma", "alpha"):
        verb = ["install", "--no-index", "--find-links", str(venvs.wheels), name] \
            if name == "gamma" else ["uninstall", name]
        proc = envguard("install", "--format", "json", "--python", str(env.path), "--", "uv",
                        "pip", *verb, cwd=cwd)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["applied"]["moved"] is True
        costs.append(doc["costs"])
    assert costs[0]["kept"] == 0 and costs[1]["kept"] > 0
    assert kept_copy_is_bare(kept_copy(env.path))


def test_the_kept_copy_is_ignored_by_git_in_a_project(venvs: VenvFactory,
                                                       tmp_path: Path) -> None:
    """The copy stays beside the venv, often in a project's folder: its ``.gitignore``
    keeps it out of ``git status`` (and of the tools that honour it), and a planted
    ``.gitignore`` of other content is made again."""
    env = two_packages(venvs)
    run_checked(["git", "init", "--quiet", str(venvs.root)], env=venvs._env())
    (venvs.root / ".gitignore").write_text("env/\n", encoding="utf-8")
    build_wheel(venvs.wheels, "gamma", "1.0", {"gamma.py": ""})
    cwd = tmp_path / "work"
    cwd.mkdir()
    proc = envguard("install", "--python", str(env.path), "--", "uv", "pip", "install",
                    "--no-index", "--find-links", str(venvs.wheels), "gamma", cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kept = kept_copy(env.path)
    assert kept.is_dir()
    assert no_copy_left(env.path)  # what was moved aside is removed after envguard ends
    status = run_checked(["git", "-C", str(venvs.root), "status", "--porcelain",
                          "--untracked-files=all"], env=venvs._env())
    assert kept.name not in status.stdout, status.stdout
    (kept / ".gitignore").write_text("nothing\n", encoding="utf-8")
    realize(clone_plan(env.path.resolve(), kept, sites(env), with_pip=False), kept,
            LinkGuard())
    assert (kept / ".gitignore").read_text(encoding="utf-8").endswith("\n*\n")
