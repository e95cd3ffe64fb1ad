"""Wall-clock metrics: consumed samples against elapsed seconds, JSON lines and TensorBoard.

Async steps are uneven (they stall waiting for the replay buffer), so throughput is logged against
elapsed wall-clock time, not against the step number: every record carries ``elapsed_s`` and TensorBoard
scalars are written with ``walltime`` so its "relative" axis shows wall-clock.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from colo_fsm.errors import ConfigError
from colo_fsm.machine.trace import split_lines, write_line


class MetricsLogger:
    """Append metrics as JSON lines (and TensorBoard scalars when ``tensorboard=True``).

    ``consumed_samples`` is the total restored on resume; ``train/samples_per_s`` counts only this process's
    samples. ``train/consumed_samples`` is written against elapsed wall-clock seconds (``x=elapsed_s``) as well as
    against the step, so uneven async steps show their real throughput.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        tensorboard: bool = True,
        clock: Any = time.time,
        consumed_samples: int = 0,
        elapsed_offset_s: float = 0.0,
    ) -> None:
        if isinstance(elapsed_offset_s, bool) or not isinstance(elapsed_offset_s, int | float) or elapsed_offset_s < 0:
            raise ConfigError("elapsed_offset_s", elapsed_offset_s, "a non-negative number of seconds")
        if isinstance(consumed_samples, bool) or not isinstance(consumed_samples, int) or consumed_samples < 0:
            raise ConfigError("consumed_samples", consumed_samples, "a non-negative integer")
        self.elapsed_offset_s = float(elapsed_offset_s)  # wall-clock seconds of earlier runs (resume)
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._clock = clock
        self.consumed_samples = consumed_samples  # running total, restored from a checkpoint on resume
        self._consumed_at_start = consumed_samples
        self._lock = threading.Lock()
        self._tb: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
        self.t0 = clock()

    def elapsed_s(self) -> float:
        """Wall-clock seconds of the run: earlier runs' (``elapsed_offset_s``) plus this process's."""
        return self.elapsed_offset_s + self._clock() - self.t0

    def log(self, step: int, metrics: Mapping[str, float], *, consumed_samples: int = 0) -> dict[str, Any]:
        """Record one step's metrics; ``consumed_samples`` is added to the running total."""
        if isinstance(consumed_samples, bool) or not isinstance(consumed_samples, int) or consumed_samples < 0:
            raise ConfigError("consumed_samples", consumed_samples, "a non-negative integer")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ConfigError("step", step, "a non-negative integer")
        if not isinstance(metrics, Mapping):
            raise ConfigError("metrics", metrics, "a mapping of metric name to number")
        for k, v in metrics.items():
            if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(float(v)):
                raise ConfigError(f"metrics[{k!r}]", v, "a finite number")
        with self._lock:
            self.consumed_samples += consumed_samples
            now = self._clock()
            run_s = now - self.t0  # this process
            elapsed = self.elapsed_offset_s + run_s
            record: dict[str, Any] = {
                "step": step,
                "elapsed_s": round(elapsed, 6),
                "wall_time": now,
                "train/consumed_samples": self.consumed_samples,
                # throughput of this process: samples restored from a checkpoint do not count
                "train/samples_per_s": (self.consumed_samples - self._consumed_at_start) / run_s if run_s > 0 else 0.0,
            }
            record.update({k: float(v) for k, v in metrics.items()})
            if self._fd is not None:  # one write per whole line: a SIGKILL leaves no torn last line
                write_line(self._fd, json.dumps(record))
            if self._tb is not None:
                for k, v in record.items():
                    if k in ("step", "wall_time", "elapsed_s"):
                        continue
                    self._tb.add_scalar(k, float(v), global_step=step, walltime=now)
                # consumed samples against elapsed seconds: the x axis is wall-clock, in whole milliseconds
                self._tb.add_scalar(
                    "train/consumed_samples_vs_elapsed_ms",
                    self.consumed_samples,
                    global_step=int(elapsed * 1000),
                    walltime=now,
                )
            return record

    def close(self) -> None:
        """Flush and close the files."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            if self._tb is not None:
                self._tb.close()
                self._tb = None


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Read a ``metrics.jsonl`` file back (a torn last line, from a killed writer, is left out with a warning)."""
    text = Path(path).read_text(encoding="utf-8")
    return [json.loads(line) for line in split_lines(text, path) if line.strip()]


__all__ = ["MetricsLogger", "read_metrics"]
