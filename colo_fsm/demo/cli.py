"""``colo-fsm demo``: the asynchronous GRPO demo on a tiny megatron-core GPT (CPU by default).

``register(subparsers)`` adds the subcommand to the ``colo-fsm`` entry point; ``main(argv)`` runs it
standalone (``python -m colo_fsm.demo``). Bad arguments or settings print one line naming the field and
the expected value, and exit with code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from colo_fsm.errors import ColoFsmError, ConfigError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# asked to stop by a signal (SIGTERM / SIGINT): the run stopped cleanly and exits with 128 + the signal number
EXIT_SIGNAL_BASE = 128
PROG = "colo-fsm demo"


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer")
    return v


def _nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a non-negative integer") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a non-negative integer")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The demo's options (shared by the subcommand and the standalone entry point)."""
    from colo_fsm.demo.config import DemoConfig

    d = DemoConfig()
    p.add_argument(
        "--steps", type=_positive_int, default=d.steps, help=f"training steps in the run (default {d.steps})"
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default=d.device, help="cpu (gloo) or cuda (NCCL)")
    p.add_argument(
        "--ranks",
        type=_positive_int,
        default=d.ranks,
        help="processes: gloo ranks on the CPU or one per GPU (data parallel; default 1)",
    )
    p.add_argument(
        "--run-dir", default=None, metavar="DIR", help="run folder (default: a fresh timestamped folder under ./runs)"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the last checkpoint of --run-dir (default: the newest run under ./runs)",
    )
    p.add_argument(
        "--prompts-per-step",
        type=_positive_int,
        default=d.num_prompts_per_step,
        dest="num_prompts_per_step",
        help=f"prompt groups per training step (default {d.num_prompts_per_step})",
    )
    p.add_argument(
        "--samples-per-group",
        type=_positive_int,
        default=d.samples_per_group,
        help=f"completions per prompt (default {d.samples_per_group})",
    )
    p.add_argument(
        "--max-age",
        type=_nonneg_int,
        default=d.max_trajectory_age_steps,
        dest="max_trajectory_age_steps",
        help=f"max_trajectory_age_steps (default {d.max_trajectory_age_steps})",
    )
    p.add_argument(
        "--digits",
        type=_positive_int,
        default=d.num_digits,
        dest="num_digits",
        help=f"task: reverse this many digits (default {d.num_digits})",
    )
    p.add_argument("--lr", type=_positive_float, default=d.lr, help=f"AdamW learning rate (default {d.lr})")
    p.add_argument("--hidden-size", type=_positive_int, default=d.hidden_size)
    p.add_argument("--layers", type=_positive_int, default=d.num_layers, dest="num_layers")
    p.add_argument(
        "--validate-every",
        type=_positive_int,
        default=d.validate_every,
        help=f"validate every N steps (default {d.validate_every})",
    )
    p.add_argument(
        "--checkpoint-every",
        type=_positive_int,
        default=d.checkpoint_every,
        help=f"checkpoint every N steps (default {d.checkpoint_every})",
    )
    p.add_argument("--kv-cache-mode", default=d.kv_cache_mode, help="persist | offload | recompute (GPU engine)")
    p.add_argument(
        "--inflight",
        choices=("park", "drain", "abort", "keep", "wait"),
        default=d.inflight,
        help="what a handoff does with the rollouts in flight: park them in the engine, finished after the step "
        "under the new weights (default; alias keep), drain (wait for them: strictly on-policy, slower; alias "
        "wait), or abort (end them at the handoff, re-prefill prompt + tokens so far after it)",
    )
    p.add_argument("--seed", type=_nonneg_int, default=d.seed)
    p.add_argument("--threads", type=_positive_int, default=None, help="torch CPU threads per rank")
    p.add_argument("--no-tensorboard", action="store_false", dest="tensorboard", help="skip TensorBoard event files")
    p.add_argument(
        "--serve",
        action="store_true",
        help="also bring up an OpenAI-compatible HTTP server per rank on 127.0.0.1 (once, with the engine); "
        "prints dp_openai_server_base_urls=[...] at start-up; requests are served while the engine is awake",
    )
    p.add_argument(
        "--chat-template",
        default=d.chat_template,
        metavar="NAME|FILE",
        help="chat template of --serve's /v1/chat/completions: 'digits' (default; user text + '>', what the demo's "
        "tokenizer can encode), 'roles' ('role: text' lines), or a Jinja2 file (messages, add_generation_prompt)",
    )
    p.add_argument(
        "--on-policy-guard",
        action="store_true",
        help="with --serve: answer 400 to a request whose temperature or top_p differ from the training rollouts' "
        "(a gym then cannot silently train on off-policy samples)",
    )
    p.add_argument(
        "--server-share",
        type=float,
        default=d.server_share,
        metavar="S",
        help=f"with --serve: the share of the engine's slots HTTP requests may hold at once (default "
        f"{d.server_share}: the demo's own rollouts keep the rest; 1 lifts the cap)",
    )
    p.add_argument(
        "--no-save-on-signal",
        action="store_false",
        dest="save_on_signal",
        help="on SIGTERM stop after the step in progress without saving (default: that boundary's next step saves "
        "a checkpoint and is the run's last, so a preempted run loses at most the step in progress)",
    )
    p.add_argument(
        "--stop-timeout",
        type=_positive_float,
        default=d.stop_timeout_s,
        dest="stop_timeout_s",
        metavar="SECONDS",
        help=f"with --ranks N: how long the parent waits for its ranks to stop after SIGTERM/SIGINT before it kills "
        f"them (default {d.stop_timeout_s:g})",
    )
    p.add_argument("--stop-after", type=_positive_int, default=None, help=argparse.SUPPRESS)


def config_from_args(args: argparse.Namespace) -> Any:
    """A :class:`~colo_fsm.demo.config.DemoConfig` from parsed arguments (raises ``ConfigError``)."""
    from colo_fsm.demo.config import DemoConfig

    fields = DemoConfig.__dataclass_fields__
    return DemoConfig(**{k: v for k, v in vars(args).items() if k in fields})


def run(args: argparse.Namespace) -> int:
    """Run the demo for parsed ``args``; prints a summary; returns the exit code."""
    from colo_fsm.demo.run import launch

    cfg = config_from_args(args)
    res = launch(cfg)
    if res.stopped_by_signal:
        import signal

        name = signal.Signals(res.stopped_by_signal).name
        saved = (
            f"checkpoint saved at step {res.checkpoint_step} (resume with --resume --run-dir {res.run_dir})"
            if res.checkpoint_step is not None and res.checkpoint_step == res.end_step
            else "no checkpoint at this step"
        )
        print(
            f"stopped by {name} after step {res.end_step}: {saved}; lifecycle stopped, trace and metrics closed "
            f"(run folder: {res.run_dir}); exit code {EXIT_SIGNAL_BASE + res.stopped_by_signal}",
            flush=True,
        )
        return EXIT_SIGNAL_BASE + res.stopped_by_signal
    val = "n/a" if res.val_accuracy is None else f"{res.val_accuracy:.3f}"
    print(
        f"done: steps {res.start_step}->{res.end_step}, weight version {res.weight_version}, "
        f"reward {res.first_rewards:.3f} (first 10 steps) -> {res.last_rewards:.3f} (last 10 steps), "
        f"last validation accuracy {val}, {res.consumed_samples} samples in {res.elapsed_s:.1f}s "
        f"(backend {res.backend})"
    )
    print(
        f"run folder: {res.run_dir} (trace.rank*.jsonl, metrics.jsonl, tensorboard/, lifecycle.svg, "
        f"timeline.png, checkpoints/)"
    )
    return EXIT_OK


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``demo`` subcommand to an argparse subparsers object (used by ``colo-fsm``)."""
    p = subparsers.add_parser(
        "demo", help="run the asynchronous GRPO demo on a tiny megatron-core GPT", description=__doc__.splitlines()[0]
    )
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point: parse ``argv``, run, return the exit code (2 for bad arguments or settings)."""
    parser = _OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        return run(args)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ColoFsmError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


__all__ = ["EXIT_SIGNAL_BASE", "add_arguments", "config_from_args", "main", "register", "run"]
