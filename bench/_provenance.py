"""Where a benchmark's figures came from, recorded in its JSON: the commit, the date, the machine and its load
(not a benchmark itself: ``run_all`` skips files starting with ``_``).

A figure is evidence only with the commit it ran on and the load it ran under (a 2-core machine's ratios move
with its load), so every bench that writes a JSON puts :func:`provenance` in it, taken when the run starts."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _git(root: Path, *args: str) -> str | None:
    """``git ARGS`` run in ``root``, its output stripped; None where the tree has no ``.git`` or git fails."""
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _marker(root: Path) -> str | None:
    """The ``COMMIT`` file's commit (written by whoever sent a copied tree), or None where there is none readable."""
    try:
        return (root / "COMMIT").read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def git_commit(root: Path | None = None) -> str | None:
    """The commit the bench runs at: git's HEAD in a checkout (a ``COMMIT`` file left there goes stale with the next
    commit), the ``COMMIT`` file in a copied tree without ``.git``, or where the checkout's ``.git`` lags its files
    and does not hold that commit at all (the GPU machine's copy did so on 2026-12-05 and again on 2026-12-06, when a
    handoff run recorded HEAD ``aec3187`` under the files of ``2b672ff``; a developer's leftover file naming an
    amended or another branch's commit is stale, and HEAD wins); None if neither says."""
    return _commit_and_marker(root or ROOT, None)[0]


def _commit_and_marker(root: Path, dirty: bool | None) -> tuple[str | None, str | None]:
    """:func:`git_commit` and :func:`stale_checkout_marker` from one read of the checkout (``dirty``:
    :func:`uncommitted_changes` when the caller has read it already)."""
    head = _git(root, "rev-parse", "--short", "HEAD")
    if head is None:
        return _marker(root), None
    marker = stale_checkout_marker(root, dirty=dirty)
    if marker is not None and _git(root, "cat-file", "-e", f"{marker}^{{commit}}") is None:
        return marker, marker
    return head, marker


def uncommitted_changes(root: Path | None = None) -> bool | None:
    """Whether the checkout's tracked files differ from its HEAD (the run's code is then not exactly the commit's);
    None without git (a copied tree: its ``COMMIT`` file is all it says)."""
    status = _git(root or ROOT, "status", "--porcelain", "--untracked-files=no")
    return None if status is None else bool(status)


def stale_checkout_marker(root: Path | None = None, *, dirty: bool | None = None) -> str | None:
    """The ``COMMIT`` file's commit where a checkout's ``.git`` lags its files: the tracked files differ from HEAD
    and the marker names a commit this ``.git`` does not hold as HEAD or an ancestor of it. The GPU machine's copied
    tree did so on 2026-12-05 (HEAD ``73940c4`` under the files of ``a77d687``): the marker is then what the run's
    code is. None otherwise: a clean checkout, no marker, or one naming HEAD or an older commit (a marker left in
    a developer's checkout goes stale; it is not recorded). ``dirty``: :func:`uncommitted_changes` when the caller
    has read it already."""
    root = root or ROOT
    named = _marker(root)
    if not named or not (uncommitted_changes(root) if dirty is None else dirty):
        return None
    known = _git(root, "merge-base", "--is-ancestor", named, "HEAD")  # "" when it is HEAD or before it
    return None if known is not None else named


def provenance() -> dict[str, Any]:
    """The run's commit (:func:`git_commit`) and whether tracked files differed from it (with the ``COMMIT`` file's
    commit where the checkout's ``.git`` lags its files: :func:`stale_checkout_marker`), UTC start time, host,
    Python, platform, CPU count and the 1-, 5- and 15-minute load averages at the call: call it when the run starts
    and put the dict in the JSON."""
    dirty = uncommitted_changes()
    commit, marker = _commit_and_marker(ROOT, dirty)
    return {
        "commit": commit,
        "uncommitted_changes": dirty,
        **({"commit_marker": marker} if marker else {}),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }
