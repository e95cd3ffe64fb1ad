"""The ``colo-fsm`` command line.

Subcommands:

* ``diagram``  -- the lifecycle as Mermaid, DOT or Markdown; a PNG/SVG through Graphviz; regenerate or check
  the generated blocks of a docs page;
* ``timeline`` -- draw one or more JSON-lines traces (e.g. one per rank) as states against wall-clock time;
* ``simulate`` -- run the lifecycle with recording fakes and print every transition;
* ``demo``     -- the end-to-end demo, registered by :func:`colo_fsm.demo.cli.register` when installed;
* ``check``    -- the exhaustive multi-rank checker, :func:`colo_fsm.testing.checker.main`, when installed.

User errors print one line (``colo-fsm <command>: error: ...``) and exit 2; no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from colo_fsm.errors import ActionFailed, ColoFsmError, ConfigError, GraphvizNotFound, UsageError
from colo_fsm.log import get_logger

if TYPE_CHECKING:
    from colo_fsm.states.spec import LifecycleSpec

log = get_logger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

_TEXT_SUFFIXES = {
    ".mmd": "mermaid",
    ".mermaid": "mermaid",
    ".dot": "dot",
    ".gv": "dot",
    ".md": "markdown",
    ".markdown": "markdown",
}
_IMAGE_SUFFIXES = (".png", ".svg", ".pdf")


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage dump) and exit with code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# ---------------------------------------------------------------------------------------------- diagram
def _cmd_diagram(args: argparse.Namespace) -> int:
    from colo_fsm import diagram
    from colo_fsm.states.presets import resolve_spec
    from colo_fsm.states.validate import check_names

    try:
        spec = resolve_spec(args.spec)
        check_names(spec)  # a transition naming an unknown state or trigger is named here, not drawn
    except ConfigError as exc:
        raise UsageError(f"argument --spec: {exc}") from None

    if args.update_docs or args.check_docs:
        if args.output:
            raise UsageError("argument --output: not allowed with --update-docs/--check-docs")
        path = args.check_docs or args.update_docs
        result = diagram.update_docs(path, spec, check=bool(args.check_docs))
        if args.check_docs:
            if result.stale:
                print(
                    f"{path}: generated blocks out of date: {', '.join(result.changed)}; run "
                    f"`colo-fsm diagram --update-docs {path}`"
                )
                return EXIT_FAILED
            print(f"{path}: up to date ({', '.join(result.found)})")
            return EXIT_OK
        print(f"{path}: " + (f"updated {', '.join(result.changed)}" if result.changed else "already up to date"))
        return EXIT_OK

    output = Path(args.output) if args.output else None
    suffix = output.suffix.lower() if output else ""
    fmt = args.format
    if fmt == "svg":
        return _write_builtin_svg(args, spec, output)
    options: dict[str, Any] = {}
    if fmt != "markdown" and suffix not in (".md", ".markdown"):
        options = {"actions": not args.no_actions, "conditions": not args.no_conditions, "failure": args.failure}
        if args.title is not None:
            options["title"] = args.title or None
    elif args.title is not None:
        raise UsageError("argument --title: the markdown format has no title (its sections are headed ## Diagram...)")
    if output is not None and suffix in _IMAGE_SUFFIXES:
        if fmt not in (None, "dot"):
            raise UsageError(
                f"argument --output: {output} is rendered by Graphviz from the DOT source; use "
                f"--format dot or leave --format out (got --format {fmt})"
            )
        options["rankdir"] = args.direction
        diagram.render(output, spec, **options)
        print(f"wrote {output}")
        return EXIT_OK
    if fmt is None:
        fmt = _TEXT_SUFFIXES.get(suffix, "mermaid")
    if fmt == "mermaid":
        options["direction"] = args.direction
    elif fmt == "dot":
        options["rankdir"] = args.direction
    return _emit(diagram.diagram_text(fmt, spec, **options), output)


def _emit(text: str, output: Path | None) -> int:
    """Write a diagram's ``text`` to ``output`` (its folders created), or to stdout without one."""
    if output is None:
        sys.stdout.write(text)
        return EXIT_OK
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"argument --output: cannot write {output}: {exc.strerror or exc}") from None
    print(f"wrote {output}")
    return EXIT_OK


def _write_builtin_svg(args: argparse.Namespace, spec: LifecycleSpec, output: Path | None) -> int:
    """``--format svg``: colo-fsm's own SVG picture (no Graphviz), to ``output`` or stdout."""
    from colo_fsm.diagram import to_svg

    if output is not None and output.suffix.lower() != ".svg":
        raise UsageError(f"argument --output: --format svg writes an .svg file (got {output})")
    if args.direction != "TB" or args.failure != "note":
        raise UsageError(
            "argument --format: svg is drawn top to bottom with the failure transition as a note on Failed; "
            "for --direction LR or --failure edges use --format dot (or mermaid)"
        )
    options: dict[str, Any] = {"actions": not args.no_actions, "conditions": not args.no_conditions}
    if args.title is not None:
        options["title"] = args.title or None
    return _emit(to_svg(spec, **options), output)


# ---------------------------------------------------------------------------------------------- timeline
def _cmd_timeline(args: argparse.Namespace) -> int:
    from colo_fsm.timeline import TIMELINE_FORMATS, render_timeline

    out = Path(args.output)
    if out.suffix.lstrip(".").lower() not in TIMELINE_FORMATS:
        raise UsageError(
            f"argument -o/--output: expected a file ending in {', '.join('.' + f for f in TIMELINE_FORMATS)}, got {out}"
        )
    render_timeline(
        args.traces, out, title=args.title, steps=args.steps, time_range=args.time, last_steps=args.last, full=args.full
    )
    print(f"wrote {out}")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- simulate
class _Paced:
    """Wraps a fake so each method call takes ``seconds`` (makes a simulated timeline readable)."""

    def __init__(self, inner: object, seconds: float) -> None:
        self._inner = inner
        self._seconds = seconds

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if not callable(value) or name.startswith("_"):
            return value

        def paced(*a: Any, **k: Any) -> Any:
            time.sleep(self._seconds)
            return value(*a, **k)

        return paced


def _trace_path(template: str | None, rank: int, ranks: int) -> Path | None:
    if template is None:
        return None
    if "{rank}" in template:
        return Path(template.format(rank=rank))
    p = Path(template)
    return p if ranks == 1 else p.with_name(f"{p.stem}.rank{rank}{p.suffix or '.jsonl'}")


def _parse_fault(spec: str | None) -> tuple[str, str, int] | None:
    if spec is None:
        return None
    head, _, step = spec.partition("@")
    component, _, method = head.partition(".")
    methods = {
        "engine": ("bring_up", "suspend", "resume", "shutdown"),
        "trainer": ("train_step", "offload_buffers", "restore_buffers", "save_checkpoint"),
        "collector": ("pause", "resume"),
        "drain": ("drain",),
    }
    if component not in methods or method not in methods[component]:
        choices = ", ".join(f"{c}.{m}" for c, ms in methods.items() for m in ms)
        raise UsageError(f"argument --fail-at: got {spec!r}, expected COMPONENT.METHOD[@STEP], one of {choices}")
    try:
        at = int(step) if step else 0
    except ValueError:
        raise UsageError(f"argument --fail-at: step {step!r} in {spec!r} is not an integer") from None
    if at < 0:
        raise UsageError(f"argument --fail-at: step {at} must be >= 0")
    return component, method, at


def _cmd_simulate(args: argparse.Namespace) -> int:
    from colo_fsm.guards.barrier import SoloBarrier, ThreadBarrier
    from colo_fsm.guards.decision import CheckpointDecision, ValidationDecision
    from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig
    from colo_fsm.machine.trace import TraceRecord
    from colo_fsm.testing.fakes import recording_adapters

    for name in ("steps", "ranks"):
        if getattr(args, name) < 1:
            raise UsageError(f"argument --{name}: expected an integer >= 1, got {getattr(args, name)}")
    for name in ("save_every", "validate_every"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"argument --{name.replace('_', '-')}: expected an integer >= 1, got {value}")
    if args.pace < 0:
        raise UsageError(f"argument --pace: expected seconds >= 0, got {args.pace}")
    if args.ranks > 64:
        raise UsageError(f"argument --ranks: expected at most 64 simulated ranks, got {args.ranks}")
    fault = _parse_fault(args.fail_at)
    if fault is not None and fault[2] >= args.steps:
        raise UsageError(f"argument --fail-at: step {fault[2]} is past the last step ({args.steps - 1})")
    for rank in range(args.ranks):
        path = _trace_path(args.trace, rank, args.ranks)
        if path is not None and path.exists() and (path.is_dir() or path.stat().st_size):
            what = "a directory" if path.is_dir() else f"a trace of {path.stat().st_size} bytes"
            raise UsageError(
                f"argument --trace: {path} is {what}; expected a path with no trace yet (a trace file is appended "
                "to, so a timeline of it would draw both runs as one): remove it or choose another path"
            )

    print_lock = threading.Lock()
    shared = threading.Barrier(args.ranks) if args.ranks > 1 else None
    outcomes: dict[int, str] = {}
    unexpected: list[str] = []

    def show(rec: TraceRecord) -> None:
        if args.quiet:
            return
        acts = ", ".join(rec.actions) if rec.actions else ""
        mark = "" if rec.ok else "  FAILED: " + (rec.error or "")
        with print_lock:
            print(
                f"rank {rec.rank}  v{rec.weight_version:<3} {rec.source:>13} {'-[' + rec.trigger + ']->':<20} "
                f"{rec.dest:<13} {rec.duration_s * 1e3:7.2f} ms  {acts}{mark}",
                flush=True,
            )

    def run_rank(rank: int) -> None:
        journal, engine, trainer, collector, drain = recording_adapters(urls=[f"http://127.0.0.1:{8000 + rank}/v1"])
        fakes: dict[str, Any] = {"engine": engine, "trainer": trainer, "collector": collector}
        barrier = ThreadBarrier(shared, rank, timeout_s=10.0) if shared is not None else SoloBarrier()
        drain_armed = [False]

        def drain_fn() -> object:
            if drain_armed[0]:
                drain_armed[0] = False
                raise RuntimeError("injected fault in device drain")
            return drain()

        def wrap(x: Any) -> Any:
            return _Paced(x, args.pace) if args.pace else x

        def arm(step: int) -> None:
            if fault is None or rank != 0 or step != fault[2]:
                return
            if fault[0] == "drain":
                drain_armed[0] = True
            else:
                fakes[fault[0]].fail_on(fault[1])

        lc = Lifecycle(
            wrap(engine),
            wrap(trainer),
            wrap(collector),
            config=LifecycleConfig(
                num_steps=args.steps,
                rank=rank,
                world_size=args.ranks,
                trace_path=_trace_path(args.trace, rank, args.ranks),
            ),
            drain=drain_fn,
            barrier=barrier,
            checkpoint=CheckpointDecision(args.save_every),
            validation=ValidationDecision(args.validate_every),
            validator=lambda step, version: {"reward": 0.5},
        )
        seen = 0

        def flush() -> None:
            nonlocal seen
            recs = lc.trace.records
            for rec in recs[seen:]:
                show(rec)
            seen = len(recs)

        try:
            arm(0)
            lc.start()
            flush()
            step = 0
            while not lc.finished:
                if step > 0:
                    arm(step)
                lc.step(list(range(4)))
                flush()
                step += 1
        except ActionFailed as exc:
            flush()
            outcomes[rank] = f"Failed: {exc}"
            if shared is not None:
                shared.abort()  # peers blocked at a barrier fail now instead of timing out
            if fault is None:
                unexpected.append(f"rank {rank}: {exc}")
        finally:
            lc.stop()
            flush()
        outcomes.setdefault(
            rank,
            f"{lc.state.value} after {lc.step_index} step(s), weight version "
            f"{lc.weight_version}, engine built {engine.builds}x, "
            f"{len(trainer.saves)} checkpoint(s), {len(journal.calls)} adapter calls",
        )

    def guarded(rank: int) -> None:
        try:
            run_rank(rank)
        except Exception as exc:  # never let a rank die silently: report it and fail the command
            outcomes.setdefault(rank, f"crashed: {type(exc).__name__}: {exc}")
            unexpected.append(f"rank {rank}: {type(exc).__name__}: {exc}")
            if shared is not None:
                shared.abort()

    if args.ranks == 1:
        guarded(0)
    else:
        threads = [threading.Thread(target=guarded, args=(r,), name=f"rank{r}") for r in range(args.ranks)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    for rank in sorted(outcomes):
        print(f"rank {rank}: {outcomes[rank]}")
    if args.trace:
        print("trace: " + ", ".join(str(_trace_path(args.trace, r, args.ranks)) for r in range(args.ranks)))
    return EXIT_FAILED if unexpected else EXIT_OK


# ---------------------------------------------------------------------------------------------- demo / check
def _unavailable(name: str, module: str, reason: str) -> Callable[[argparse.Namespace], int]:
    def run(_args: argparse.Namespace) -> int:
        hint = " Meanwhile `colo-fsm simulate` runs the lifecycle with recording fakes." if name == "demo" else ""
        print(f"colo-fsm {name}: unavailable: {module} could not be imported ({reason}).{hint}", file=sys.stderr)
        return EXIT_USAGE

    return run


def _import_optional(module: str) -> tuple[Any, str | None]:
    """Import ``module``; return (module, None), or (None, reason) when it (or its package) is missing."""
    try:
        return importlib.import_module(module), None
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            return None, "not part of this installation"
        return None, f"it needs {exc.name!r}, which is not installed"
    except ImportError as exc:
        return None, str(exc)


def _add_demo(sub: argparse._SubParsersAction, load: bool) -> bool:
    """Register ``demo``: the real one from colo_fsm.demo.cli, loaded only when selected (it may import torch).

    The demo module's ``register(subparsers)`` adds a ``demo`` parser and sets ``func(args) -> int`` as its
    default. Returns False when it was asked for and cannot be loaded.
    """
    if load:
        mod, _reason = _import_optional("colo_fsm.demo.cli")
        if mod is not None and hasattr(mod, "register"):
            mod.register(sub)
            return True
        return False
    sub.add_parser("demo", help="run the end-to-end demo (colo_fsm.demo)", add_help=False)
    return True


def _run_check(argv: Sequence[str]) -> int:
    mod, reason = _import_optional("colo_fsm.testing.checker")
    if mod is None or not hasattr(mod, "main"):
        return _unavailable("check", "colo_fsm.testing.checker", reason or "it has no main(argv)")(argparse.Namespace())
    rc = mod.main(list(argv))
    return int(rc or 0)


# ---------------------------------------------------------------------------------------------- parser
def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The ``colo-fsm`` parser. ``argv`` tells which optional subcommands need loading."""
    parser = _Parser(prog="colo-fsm", description="An explicit state machine for a colocated engine and trainer.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv: debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    d = sub.add_parser(
        "diagram",
        help="print or render the lifecycle diagram, regenerate docs tables",
        description="The lifecycle, generated from the declared spec.",
    )
    d.add_argument(
        "--format",
        choices=("mermaid", "dot", "markdown", "svg"),
        default=None,
        help="text format (default: from --output's suffix, else mermaid); svg: a picture drawn by colo-fsm "
        "itself, no Graphviz needed",
    )
    d.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write to FILE: .mmd, .dot, .md, or a picture .png/.svg/.pdf (these need Graphviz's dot; "
        "--format svg draws an .svg without it)",
    )
    d.add_argument("--direction", choices=("TB", "LR"), default="TB", help="layout direction (default TB)")
    d.add_argument(
        "--spec",
        default="lifecycle",
        help="the lifecycle to draw: lifecycle (default), nemo_rl, or your own as module:ATTR or path/to/file.py:ATTR",
    )
    d.add_argument(
        "--failure",
        choices=("note", "edges"),
        default="note",
        help="failure edges: one note/compound edge (default) or one edge per failable state",
    )
    d.add_argument("--no-actions", action="store_true", help="label edges with trigger and guards only")
    d.add_argument("--no-conditions", action="store_true", help="omit engine/collector conditions from states")
    d.add_argument(
        "--title",
        default=None,
        help="diagram title; {name} is the spec's name (default: 'colo-fsm lifecycle ({name})', '' for none)",
    )
    docs = d.add_mutually_exclusive_group()
    docs.add_argument("--update-docs", metavar="MD", help="regenerate the <!-- BEGIN GENERATED: ... --> blocks of MD")
    docs.add_argument("--check-docs", metavar="MD", help="exit 1 if the generated blocks of MD are out of date")
    d.set_defaults(func=_cmd_diagram)

    t = sub.add_parser("timeline", help="draw traces as states against wall-clock time, one row per rank")
    t.add_argument("traces", nargs="+", metavar="TRACE.jsonl", help="JSON-lines trace file(s), e.g. one per rank")
    t.add_argument(
        "-o",
        "--output",
        default="timeline.png",
        metavar="FILE",
        help="picture to write: .png, .svg or .pdf (default timeline.png)",
    )
    t.add_argument("--title", default=None, help="picture title")
    t.add_argument(
        "--steps",
        metavar="A:B",
        help="show training steps A through B only (A:, :B and a single step A also work)",
    )
    t.add_argument(
        "--time",
        metavar="A:B",
        help="show seconds A through B since the first transition only (with --steps: where both overlap)",
    )
    t.add_argument(
        "--last",
        type=int,
        metavar="N",
        default=None,
        help="show the last N steps (default: a run longer than 20 steps shows its last 20)",
    )
    t.add_argument("--full", action="store_true", help="show the whole run, however long")
    t.set_defaults(func=_cmd_timeline)

    s = sub.add_parser("simulate", help="run the lifecycle with recording fakes and print every transition")
    s.add_argument("--steps", type=int, default=6, help="training steps in the run (default 6)")
    s.add_argument("--save-every", type=int, default=3, metavar="N", help="checkpoint every N steps (default 3)")
    s.add_argument("--validate-every", type=int, default=2, metavar="N", help="validate every N steps (default 2)")
    s.add_argument("--ranks", type=int, default=1, help="simulated ranks, one thread each (default 1)")
    s.add_argument(
        "--pace",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="make every adapter call take SECONDS (for a readable timeline)",
    )
    s.add_argument(
        "--trace",
        metavar="PATH",
        help="write the trace as JSON lines (several ranks: PATH.rankN.jsonl, or put {rank} in PATH)",
    )
    s.add_argument(
        "--fail-at",
        metavar="COMPONENT.METHOD[@STEP]",
        help="inject a fault on rank 0, e.g. trainer.save_checkpoint@2 (shows the Failed path)",
    )
    s.add_argument("-q", "--quiet", action="store_true", help="print only the outcome")
    s.set_defaults(func=_cmd_simulate)

    first = next((a for a in argv if not a.startswith("-")), None)
    _add_demo(sub, load=first == "demo")
    sub.add_parser(
        "check", help="exhaustive multi-rank check of the lifecycle (colo_fsm.testing.checker)", add_help=False
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``colo-fsm`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    first = next((i for i, a in enumerate(args_list) if not a.startswith("-")), None)
    command = args_list[first] if first is not None else None
    if command == "check":
        return _run_check(args_list[first + 1 :])  # type: ignore[operator]
    if command == "demo":
        mod, reason = _import_optional("colo_fsm.demo.cli")
        if mod is None or not hasattr(mod, "register"):
            return _unavailable("demo", "colo_fsm.demo.cli", reason or "it has no register(subparsers)")(
                argparse.Namespace()
            )
    parser = build_parser(args_list)
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # --help, or a usage error already printed as one line
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    _setup_logging(args.verbose)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_USAGE
    prog = f"colo-fsm {args.command}"
    try:
        return int(func(args) or 0)
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (ConfigError, FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ColoFsmError as exc:
        if isinstance(exc, GraphvizNotFound):
            print(f"{prog}: error: argument --output: {exc}", file=sys.stderr)
            return EXIT_USAGE
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def _setup_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
