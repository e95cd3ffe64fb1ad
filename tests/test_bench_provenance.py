"""Every benchmark's JSON says where its figures came from: the commit, the date, the machine and the load it
started under (``bench/_provenance.py``), so a figure quoted from a committed file can be re-run at its commit."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench._provenance import git_commit, provenance, stale_checkout_marker

ROOT = Path(__file__).resolve().parents[1]
# the page's writers, the stage list and the map: they write no figures of their own (the runs they read carry theirs)
NOT_A_MEASUREMENT = {"gpu", "gpu_plots", "gpu_report", "gpu_runs", "gpu_stages", "parking_map"}
# a call that records the provenance: the dict itself, the GPU benches' machine_info (which holds it), or the
# handoff benches' own git_commit() beside their date and machine fields (the performance page reads those names)
RECORDERS = {"provenance", "machine_info", "git_commit"}
WRITERS = {"dumps", "dump", "JsonReport", "Results"}  # json.dumps / json.dump, the handoff and GPU reports


def _called(tree: ast.AST) -> set[str]:
    """The names of every function the code calls (``f(...)`` and ``x.f(...)``); comments and strings do not count."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            names.add(func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else "")
    return names


def scripts_without_provenance() -> list[str]:
    """The benchmarks (``bench/*.py`` with a ``main``, not ``_*``) whose code writes a JSON and calls nothing that
    records the provenance."""
    missing = []
    for path in sorted((ROOT / "bench").glob("*.py")):
        if path.name.startswith("_") or path.stem in NOT_A_MEASUREMENT:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        has_main = any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)
        called = _called(tree)
        if has_main and called & WRITERS and not called & RECORDERS:
            missing.append(path.name)
    return missing


def test_every_bench_that_writes_a_json_records_its_provenance() -> None:
    assert not scripts_without_provenance(), "put bench._provenance.provenance() in these benches' JSON: " + ", ".join(
        scripts_without_provenance()
    )


def test_the_check_names_a_bench_that_leaves_it_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Red where a bench writes its JSON with no provenance: a copy of the tree with one bench's record removed."""
    bench = tmp_path / "bench"
    bench.mkdir()
    source = (ROOT / "bench" / "server_suspend.py").read_text(encoding="utf-8")
    gutted = source.replace('"provenance": prov,', "").replace("prov = provenance()", "pass")
    # a mention in a comment or a docstring is not a record
    gutted = gutted.replace('"""', '"""provenance() git_commit() ', 1) + "\n# provenance() machine_info(\n"
    (bench / "server_suspend.py").write_text(gutted, encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert scripts_without_provenance() == ["server_suspend.py"]


def test_provenance_names_the_checkout_commit_the_machine_and_its_load() -> None:
    p = provenance()
    assert set(p) - {"commit_marker"} == {
        *("commit", "uncommitted_changes", "date_utc", "host", "python", "platform", "cpus", "loadavg_start"),
    }
    assert "commit_marker" not in p or (p["uncommitted_changes"] and p["commit_marker"] != p["commit"])
    if (ROOT / ".git").exists():
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        assert p["commit"] == git_commit() == (head.stdout.strip() or None)
        assert isinstance(p["uncommitted_changes"], bool)
    else:  # a copied tree (the GPU machine's): the COMMIT file says, and nothing says whether it was changed
        marker = ROOT / "COMMIT"
        assert p["commit"] == (marker.read_text(encoding="utf-8").strip() or None if marker.exists() else None)
        assert p["uncommitted_changes"] is None
    assert len(p["loadavg_start"]) == 3 and p["cpus"] >= 1
    assert p["date_utc"].endswith("Z") and p["python"].startswith("3.")


def test_a_bench_run_writes_it(tmp_path: Path) -> None:
    """One bench run end to end (the handoff model's smoke run, a fraction of a second): its JSON holds the
    provenance, with the commit of the checkout it ran in."""
    out = tmp_path / "handoff_model.json"
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / "handoff_model.py"), "--smoke", "--out", str(out)],
        check=True,
        capture_output=True,
        cwd=ROOT,
        timeout=120,
    )
    written = json.loads(out.read_text(encoding="utf-8"))["provenance"]
    assert written["commit"] == git_commit()
    assert written["cpus"] >= 1 and len(written["loadavg_start"]) == 3


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to build a checkout")
def test_a_checkout_whose_git_lags_its_files_records_the_commit_file_beside_head(tmp_path: Path) -> None:
    """The GPU machine's copied tree once carried a ``.git`` at an older HEAD under newer files: the run recorded
    that HEAD with ``uncommitted_changes``, and only the ``COMMIT`` file named the code that ran. The marker is
    recorded then (a commit that ``.git`` does not hold), and it is the run's ``commit``; it is not recorded for a
    clean checkout, a marker naming HEAD (short or whole) or an older commit (a developer's leftover file: stale), an
    empty one, or one that is not a file. A marker naming a commit ``.git`` holds off HEAD's line is recorded beside,
    and HEAD stays the run's commit."""
    tree = tmp_path / "tree"
    tree.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]

    def commit(text: str) -> str:
        (tree / "code.py").write_text(text, encoding="utf-8")
        subprocess.run([*git, "add", "code.py"], cwd=tree, check=True)
        subprocess.run([*git, "commit", "-q", "-m", text], cwd=tree, check=True)
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True, check=True
        ).stdout.strip()

    subprocess.run([*git, "init", "-q"], cwd=tree, check=True)
    older = commit("x = 0\n")
    head = commit("x = 1\n")
    marker = tree / "COMMIT"
    marker.write_text("abc1234\n", encoding="utf-8")
    assert stale_checkout_marker(tree) is None  # clean: HEAD is the code, whatever the file says
    (tree / "code.py").write_text("x = 2\n", encoding="utf-8")  # the files move on under the lagging .git
    assert stale_checkout_marker(tree) == "abc1234" == git_commit(tree)  # the files' commit, not the lagging HEAD
    side = subprocess.run(  # a commit this .git holds that is not HEAD's ancestor: an amended or other branch's
        [*git, "commit-tree", "HEAD^{tree}", "-m", "side"], cwd=tree, capture_output=True, text=True, check=True
    ).stdout.strip()
    marker.write_text(f"{side[:7]}\n", encoding="utf-8")
    assert stale_checkout_marker(tree) == side[:7] and git_commit(tree) == head[:7]  # recorded beside; HEAD wins
    for known in (head, head[:7], older[:7]):  # HEAD, whole or short, or a commit before it: a stale leftover
        marker.write_text(f"{known}\n", encoding="utf-8")
        assert stale_checkout_marker(tree) is None, known
    marker.write_text("  \n", encoding="utf-8")
    assert stale_checkout_marker(tree) is None
    marker.unlink()
    marker.mkdir()
    assert stale_checkout_marker(tree) is None and git_commit(tree) == head[:7]
