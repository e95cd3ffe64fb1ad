"""The GPU machine's wheel folders (``scripts/wheel_folders.sh``, which ``scripts/gpu_wheelhouse.sh`` sources): a
library too large for one folder travels in two pieces, and the two installers put it back whole, whatever order
and however often a session's calls run them, a call cut short included. Run here on small files; the real folders
need a registry to build and a GPU machine to use."""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FUNCTIONS = ROOT / "scripts" / "wheel_folders.sh"
LIB = "pkg/_mlir_libs/big_library.so"
PIECE = 60_000  # bytes: the library below compresses to about 100 KB, two pieces

pytestmark = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("bash", "xz", "split", "tar")),
    reason="needs bash, xz, split and tar",
)


def _bash(*args: str, site: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``bash args...``, with the installers' site folder set to ``site`` where given."""
    env = {**os.environ, **({"COLO_FSM_SITE": str(site)} if site is not None else {})}
    return subprocess.run(["bash", *args], capture_output=True, text=True, env=env, timeout=120)


def _functions(script: str) -> subprocess.CompletedProcess[str]:
    """``script`` run with the wheel folders' functions sourced."""
    return _bash("-c", f"set -euo pipefail; source {FUNCTIONS}; {script}")


def _wheel(path: Path, module: str) -> None:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{module}/__init__.py", f"NAME = {module!r}\n")


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, bytes]:
    """Two wheel folders as the wheelhouse makes them, from a tree holding one large library (random bytes: xz does
    not shrink them) and one small file, with a wheel in each folder. Returns the folders' parent and the library."""
    tree, dest = tmp_path / "tree", tmp_path / "wheels"
    (tree / LIB).parent.mkdir(parents=True)
    library = os.urandom(100_000)
    (tree / LIB).write_bytes(library)
    (tree / "pkg" / "other.py").write_text("OTHER = 1\n")
    for part, module in (("part1", "first_wheel"), ("part2", "second_wheel")):
        (dest / part).mkdir(parents=True)
        _wheel(dest / part / f"{module}-1.0-py3-none-any.whl", module)
    done = _functions(f"pack_library {tree} {LIB} {dest} {PIECE} && write_installers {dest} {LIB}")
    assert done.returncode == 0, done.stderr
    return dest, library


def _install(dest: Path, part: str, site: Path) -> subprocess.CompletedProcess[str]:
    return _bash(str(dest / part / "install.sh"), site=site)


def test_the_library_travels_in_two_pieces_and_the_rest_of_its_tree_with_the_second(folders, tmp_path):
    dest, library = folders
    first, second = dest / "part1" / "lib.xz.00", dest / "part2" / "lib.xz.01"
    assert first.stat().st_size == PIECE and 0 < second.stat().st_size <= PIECE
    assert (dest / "part2" / "rest.tar.xz").exists()
    assert not (tmp_path / "tree" / LIB).exists()  # taken out of the tree, so the rest's archive does not hold it


def test_part1_then_part2_puts_the_library_back_whole_with_every_wheel(folders, tmp_path):
    dest, library = folders
    site = tmp_path / "site"
    assert _install(dest, "part1", site).returncode == 0
    done = _install(dest, "part2", site)
    assert done.returncode == 0, done.stderr
    assert (site / LIB).read_bytes() == library
    assert (site / "pkg" / "other.py").read_text() == "OTHER = 1\n"
    assert (site / "first_wheel" / "__init__.py").exists() and (site / "second_wheel" / "__init__.py").exists()
    assert not (site / ".lib.xz.00").exists()  # the piece part1 left is dropped once the library is whole
    assert not (site / f"{LIB}.partial").exists()


def test_part2_says_cold_without_part1_and_returns_at_once_where_it_ran_before(folders, tmp_path):
    dest, library = folders
    site = tmp_path / "site"
    cold = _install(dest, "part2", site)
    assert cold.returncode == 3 and "COLD" in cold.stdout
    assert _install(dest, "part1", site).returncode == 0
    assert _install(dest, "part2", site).returncode == 0
    again = _install(dest, "part2", site)  # a later call on the same warm machine
    assert again.returncode == 0 and "already" in again.stdout
    assert (site / LIB).read_bytes() == library


def test_a_part2_call_cut_short_after_the_join_leaves_a_rerun_that_completes_the_library(folders, tmp_path):
    """The call dies after joining the library but before it is done (here: a wheel that is not a zip file). The
    next call, with the folder mended, must still find part1's piece and leave the library whole, not empty it."""
    dest, library = folders
    site = tmp_path / "site"
    assert _install(dest, "part1", site).returncode == 0
    broken = dest / "part2" / "zz_broken-1.0-py3-none-any.whl"
    broken.write_bytes(b"not a zip file")
    assert _install(dest, "part2", site).returncode != 0
    broken.unlink()
    done = _install(dest, "part2", site)
    assert done.returncode == 0, done.stderr
    assert (site / LIB).read_bytes() == library


def test_an_archive_that_is_not_two_pieces_is_refused_by_name(tmp_path):
    tree, dest = tmp_path / "tree", tmp_path / "wheels"
    (tree / LIB).parent.mkdir(parents=True)
    (tree / LIB).write_bytes(os.urandom(100_000))
    for part in ("part1", "part2"):
        (dest / part).mkdir(parents=True)
    for piece in (20_000, 200_000):  # five pieces, then one
        done = _functions(f"pack_library {tree} {LIB} {dest} {piece}")
        assert done.returncode == 1
        assert "big_library.so" in done.stderr and "not two pieces" in done.stderr and str(piece) in done.stderr
        assert (tree / LIB).exists() and not list((dest / "part1").iterdir())  # nothing moved, nothing lost
