"""The CPU demo serving over HTTP, as the server benchmarks drive it: a subprocess of ``colo-fsm demo --serve``, its
base URL, its training step times, its resident memory and its ``/metrics`` scraped with Prometheus' own parser."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CONTEXT = 32  # the demo model's max_sequence_length


def rss_bytes(pid: int) -> int | None:
    """The resident set size of process ``pid`` (Linux ``/proc``), None where it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds process ``pid`` used so far (Linux ``/proc``), None where it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(root: str, client: Any = None) -> dict[str, list[tuple[dict[str, str], float]]]:
    """One scrape of ``root/metrics``, parsed by prometheus-client's parser: ``{sample name: [(labels, value)]}``."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = (client or httpx).get(root + "/metrics", timeout=30).text
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def total(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    """The sum of sample ``name`` over the series whose labels include ``labels``."""
    return sum(v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items()))


class Demo:
    """``colo-fsm demo --serve`` on the CPU, one rank, training until stopped."""

    def __init__(self, run_dir: Path, threads: int, extra: tuple[str, ...] = ()) -> None:
        args = ["--run-dir", str(run_dir), "--steps", "1000000", "--serve", "--no-tensorboard"]
        args += ["--validate-every", "1000000", "--checkpoint-every", "1000000", "--threads", str(threads), *extra]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
        self.err = (run_dir.parent / "stderr.txt").open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "colo_fsm.demo", *args],
            stdout=subprocess.PIPE,
            stderr=self.err,
            text=True,
            cwd=ROOT,
            env=env,
        )
        self.metrics = run_dir / "metrics.jsonl"
        self.stderr_path = run_dir.parent / "stderr.txt"

    def url(self, timeout: float = 180) -> str:
        """The first data-parallel server's base URL (``.../v1``), once the demo printed it."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        for line in self.proc.stdout:
            if line.startswith("dp_openai_server_base_urls="):
                threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # keep the pipe drained
                return str(json.loads(line.split("=", 1)[1])[0])
            if time.monotonic() > deadline:
                break
        raise RuntimeError(f"the demo printed no base URL: {self.stderr_path.read_text()[-2000:]}")

    def step_times(self) -> list[float]:
        """Wall-clock time of every training step logged so far (``metrics.jsonl``)."""
        if not self.metrics.is_file():
            return []
        out = []
        for line in self.metrics.read_text().splitlines():
            try:
                out.append(float(json.loads(line)["wall_time"]))
            except (ValueError, KeyError):
                continue  # a torn last line
        return out

    def warm_up(self, steps: int = 5, timeout: float = 180) -> None:
        """Wait until ``steps`` training steps ran (the run is training, its first steps' start-up cost paid)."""
        deadline = time.monotonic() + timeout
        while len(self.step_times()) < steps:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the demo did not train: {self.stderr_path.read_text()[-2000:]}")
            time.sleep(0.2)

    def rss(self) -> int | None:
        """The demo process's resident memory in bytes."""
        return rss_bytes(self.proc.pid)

    def stop(self) -> int:
        """SIGTERM, wait (then kill); the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.err.close()
        return int(self.proc.returncode)


def steps_in(steps: list[float], spans: list[tuple[float, float]]) -> tuple[int, float]:
    """Training steps logged inside ``spans`` and the spans' total seconds."""
    n = sum(sum(1 for s in steps if a <= s < b) for a, b in spans)
    return n, sum(b - a for a, b in spans)


def machine() -> dict[str, Any]:
    """The machine a figure came from, and its load right now."""
    import platform

    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_avg": os.getloadavg(),
    }
