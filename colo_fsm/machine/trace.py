"""The transition trace: one record per transition, written as JSON lines."""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from colo_fsm.errors import ConfigError, TraceFileError
from colo_fsm.log import get_logger

log = get_logger(__name__)


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs about 2 us per record, per transition
class TraceRecord:
    """One transition: where it went, on which rank, at which weight version, and when (a record of what
    happened: read it, do not change it).

    ``step`` is the number of training steps completed when the transition finished (so a ``train`` record
    already counts its own step). ``t_start`` is when the trigger fired, ``t_enter`` when the machine entered ``dest`` (its actions run
    after that), ``t_end`` when the last action returned; all are ``time.time()`` seconds.
    """

    seq: int
    rank: int
    trigger: str
    source: str
    dest: str
    step: int
    weight_version: int
    t_start: float
    t_enter: float
    t_end: float
    ok: bool = True
    error: str | None = None
    actions: dict[str, float] = field(default_factory=dict)  # action -> seconds
    engine_state: str | None = None  # the engine's own state after the transition, when it reports one

    @property
    def duration_s(self) -> float:
        """Seconds from trigger to the end of the last action."""
        return self.t_end - self.t_start

    def to_json(self) -> str:
        """One JSON line."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TraceRecord:
        """Rebuild a record from its JSON form; unknown keys are ignored."""
        known = {f: data[f] for f in cls.__dataclass_fields__ if f in data}
        return cls(**known)


class Trace:
    """An append-only, thread-safe list of :class:`TraceRecord`, optionally mirrored to a JSON-lines file.

    Each record goes to the file in one ``write`` of a whole line (``O_APPEND``), so a crash, even a SIGKILL,
    loses no transition that completed and leaves no torn last line.
    """

    def __init__(self, path: str | Path | None = None, *, keep: bool = True) -> None:
        if path is not None and not isinstance(path, str | Path):
            raise ConfigError("trace_path", path, "a file path (str or pathlib.Path) or None")
        self._records: list[TraceRecord] = []
        self._keep = keep
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._subscribers: list[Callable[[TraceRecord], None]] = []
        self.path = Path(path) if path is not None else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def subscribe(self, callback: Callable[[TraceRecord], None]) -> None:
        """Call ``callback(record)`` after every appended record (progress displays, metrics, gates).

        Callbacks run on the thread that ran the transition; one that raises is logged and does not affect
        the lifecycle.
        """
        self._subscribers.append(callback)

    def append(self, record: TraceRecord) -> None:
        """Add one record (and write it through to the file, if any), then notify subscribers."""
        with self._lock:
            if self._keep:
                self._records.append(record)
            if self._fd is not None:
                write_line(self._fd, record.to_json())
        for callback in self._subscribers:
            try:
                callback(record)
            except Exception:
                log.exception("trace subscriber %r failed on record %d", callback, record.seq)

    @property
    def records(self) -> list[TraceRecord]:
        """A copy of the records kept in memory."""
        with self._lock:
            return list(self._records)

    def __iter__(self) -> Iterator[TraceRecord]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self._records)

    def write_jsonl(self, path: str | Path) -> Path:
        """Write every kept record to ``path`` (atomically: a temp file renamed into place)."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text("".join(r.to_json() + "\n" for r in self.records), encoding="utf-8")
        tmp.replace(out)
        return out

    def close(self) -> None:
        """Close the mirror file, if any."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def write_line(fd: int, line: str) -> None:
    """Append ``line`` + newline to ``fd`` in one ``os.write`` (retried only for a partial write)."""
    data = (line + "\n").encode("utf-8")
    while data:
        n = os.write(fd, data)
        data = data[n:]


def split_lines(text: str, path: str | Path) -> list[str]:
    """The complete lines of a JSON-lines file; a torn last line (no newline, not JSON: a writer killed in the
    middle of it) is left out and reported with a warning naming the file."""
    lines = text.split("\n")
    tail = lines.pop()  # "" when the file ends with a newline
    if tail.strip():
        try:
            json.loads(tail)
            lines.append(tail)
        except json.JSONDecodeError:
            log.warning("%s: torn last line left out (%d bytes; the writer was killed mid-line)", path, len(tail))
    return lines


_REQUIRED: dict[str, tuple[type, ...]] = {
    "rank": (int,),
    "source": (str,),
    "dest": (str,),
    "trigger": (str,),
    "t_start": (int, float),
    "t_enter": (int, float),
    "t_end": (int, float),
}


def read_trace_file(path: str | Path) -> list[TraceRecord]:
    """Read one JSON-lines trace strictly; raises :class:`TraceFileError` naming the file and line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceFileError(p, None, "no such trace file") from None
    except IsADirectoryError:
        raise TraceFileError(p, None, "is a directory, expected a JSON-lines trace file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFileError(p, None, f"cannot read: {exc}") from None
    records: list[TraceRecord] = []
    for n, line in enumerate(split_lines(text, p), 1):
        if not line.strip():
            continue
        try:
            data: Any = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceFileError(p, n, f"not JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(data, dict):
            raise TraceFileError(p, n, f"expected a JSON object (a trace record), got {type(data).__name__}")
        for key, types in _REQUIRED.items():
            if key not in data:
                raise TraceFileError(p, n, f"trace record lacks {key!r}")
            value: Any = data[key]
            if isinstance(value, bool) or not isinstance(value, types):
                want = "a number" if float in types else f"a {types[0].__name__}"
                raise TraceFileError(p, n, f"{key}={value!r}: expected {want}")
            if float in types and not math.isfinite(data[key]):
                raise TraceFileError(p, n, f"{key}={value!r}: expected a finite number")
        if not data["t_start"] <= data["t_enter"] <= data["t_end"]:
            raise TraceFileError(p, n, "times out of order: expected t_start <= t_enter <= t_end")
        data.setdefault("seq", n)
        data.setdefault("step", 0)
        data.setdefault("weight_version", 0)
        try:
            records.append(TraceRecord.from_dict(data))
        except TypeError as exc:
            raise TraceFileError(p, n, f"not a trace record ({exc})") from None
    if not records:
        raise TraceFileError(p, None, "holds no trace records")
    return records


def read_trace(paths: str | Path | Iterable[str | Path]) -> list[TraceRecord]:
    """Read one or more JSON-lines traces (e.g. one per rank), sorted by ``t_start``.

    Each file is read by :func:`read_trace_file`: a malformed one raises :class:`TraceFileError` naming the
    file and line.
    """
    if isinstance(paths, str | Path):
        paths = [paths]
    records = [r for p in paths for r in read_trace_file(p)]
    records.sort(key=lambda r: (r.t_start, r.rank, r.seq))
    return records


__all__ = ["Trace", "TraceFileError", "TraceRecord", "read_trace", "read_trace_file", "split_lines", "write_line"]
