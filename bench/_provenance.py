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


def git_commit(root: Path | None = None) -> str | None:
    """The commit the bench runs at: git's HEAD in a checkout (a ``COMMIT`` file left there goes stale with the next
    commit), the ``COMMIT`` file in a copied tree without ``.git`` (the GPU machine's); None if neither says."""
    root = root or ROOT
    head = _git(root, "rev-parse", "--short", "HEAD")
    if head:
        return head
    marker = root / "COMMIT"
    if marker.exists():
        return marker.read_text(encoding="utf-8").strip() or None
    return None


def uncommitted_changes(root: Path | None = None) -> bool | None:
    """Whether the checkout's tracked files differ from its HEAD (the run's code is then not exactly the commit's);
    None without git (a copied tree: its ``COMMIT`` file is all it says)."""
    status = _git(root or ROOT, "status", "--porcelain", "--untracked-files=no")
    return None if status is None else bool(status)


def stale_checkout_marker(root: Path | None = None) -> str | None:
    """The ``COMMIT`` file's commit where a checkout's HEAD names another and its tracked files differ from HEAD:
    a copied tree whose ``.git`` lags its files (the GPU machine's did on 2026-12-05: HEAD ``73940c4`` under the
    files of ``a77d687``), so the marker, written by whoever sent the tree, is what the run's code is. None
    otherwise (a clean checkout, no marker, or one naming HEAD)."""
    root = root or ROOT
    marker = root / "COMMIT"
    head = _git(root, "rev-parse", "--short", "HEAD")
    if not head or not marker.exists() or not uncommitted_changes(root):
        return None
    named = marker.read_text(encoding="utf-8").strip()
    return named if named and named != head else None


def provenance() -> dict[str, Any]:
    """The run's commit (:func:`git_commit`) and whether tracked files differed from it (with the ``COMMIT`` file's
    commit where the checkout's ``.git`` lags its files: :func:`stale_checkout_marker`), UTC start time, host,
    Python, platform, CPU count and the 1-, 5- and 15-minute load averages at the call: call it when the run starts
    and put the dict in the JSON."""
    return {
        "commit": git_commit(),
        "uncommitted_changes": uncommitted_changes(),
        **({"commit_marker": m} if (m := stale_checkout_marker()) else {}),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }
