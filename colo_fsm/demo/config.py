"""Settings of the demo, checked once: a bad value raises ``ConfigError(field, value, expected)``."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from colo_fsm.adapters.engine.options import check_share
from colo_fsm.errors import ConfigError

DEMO_SERVER_SHARE = 0.125
"""The demo's ``GenerationConfig.server_share`` (the library's default is 0.5). Its training rollouts come from its
own collector and fill the engine's slots, and on the CPU the engine's decode is what bounds training's step rate:
with HTTP traffic holding its whole share, training keeps about ``1 - server_share`` of its rate, less the HTTP
front's own CPU. An eighth kept it at 0.76-0.83x under the gym chaos of ``bench/server_chaos.py`` in four runs on
the CPU (bench/README.md), above the 0.75x bar in all four (in three of the four before them)."""


def _int(field: str, v: Any, lo: int, hi: int | None = None) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        raise ConfigError(field, v, f"an integer >= {lo}" + (f" and <= {hi}" if hi is not None else ""))


def _check_server_extra() -> None:
    """``serve=True`` needs the ``[server]`` extra (FastAPI, uvicorn): a clear error here, not an ImportError later."""
    from importlib.util import find_spec

    def absent(module: str) -> bool:
        try:
            return find_spec(module) is None
        except ImportError:
            return True

    missing = [m for m in ("fastapi", "uvicorn") if absent(m)]
    if missing:
        raise ConfigError("serve", True, f"False, or the [server] extra installed (missing: {', '.join(missing)})")


@dataclass(frozen=True)
class DemoConfig:
    """Everything one demo run needs. Defaults finish on 2 CPU cores in about a minute."""

    steps: int = 400
    ranks: int = 1
    device: str = "cpu"
    run_dir: str | None = None
    resume: bool = False
    num_prompts_per_step: int = 8
    samples_per_group: int = 8
    max_trajectory_age_steps: int = 1
    num_digits: int = 3
    lr: float = 1e-3
    hidden_size: int = 64
    num_layers: int = 2
    num_attention_heads: int = 4
    temperature: float = 1.0
    validate_every: int = 25
    checkpoint_every: int = 100
    val_prompts: int = 32
    kv_cache_mode: str = "persist"
    inflight: str = "park"  # a handoff parks the rollouts in flight ("drain": waits for them, strictly on-policy)
    seed: int = 0
    threads: int | None = None
    tensorboard: bool = True
    sample_timeout_s: float = 120.0
    serve: bool = False  # an OpenAI-compatible HTTP server per rank (127.0.0.1), up once with the engine
    stop_after: int | None = None  # stop early after this many steps of this run (tests; simulates an interruption)
    chat_template: str = "digits"  # --serve chat: 'digits' (the task alphabet), 'roles', or a Jinja2 file
    on_policy_guard: bool = False  # --serve: refuse requests whose temperature/top_p differ from the rollouts'
    server_share: float = DEMO_SERVER_SHARE  # --serve: the share of the engine's slots HTTP requests may hold
    save_on_signal: bool = True  # SIGTERM: the next step saves a checkpoint and is the run's last
    stop_timeout_s: float = 120.0  # --ranks N: how long the parent waits for its ranks after a signal

    def __post_init__(self) -> None:
        _int("steps", self.steps, 1)
        _int("ranks", self.ranks, 1, 64)
        if self.device not in ("cpu", "cuda"):
            raise ConfigError("device", self.device, "'cpu' or 'cuda'")
        for name in (
            "num_prompts_per_step",
            "samples_per_group",
            "hidden_size",
            "num_layers",
            "num_attention_heads",
            "validate_every",
            "checkpoint_every",
            "val_prompts",
        ):
            _int(name, getattr(self, name), 1)
        if self.samples_per_group < 2:
            raise ConfigError("samples_per_group", self.samples_per_group, "an integer >= 2 (GRPO compares samples)")
        _int("max_trajectory_age_steps", self.max_trajectory_age_steps, 0)
        _int("num_digits", self.num_digits, 1, 12)
        _int("seed", self.seed, 0)
        if self.threads is not None:
            _int("threads", self.threads, 1)
        for name in ("resume", "tensorboard", "serve", "on_policy_guard", "save_on_signal"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, getattr(self, name), "True or False")
        if self.stop_after is not None:
            _int("stop_after", self.stop_after, 1)
        check_share(self.server_share)
        if self.serve:
            _check_server_extra()
            from colo_fsm.server.templates import resolve_chat_template

            resolve_chat_template(self.chat_template)  # a bad name or path fails here, naming chat_template
        else:  # the server's options mean nothing without it: refused, never ignored (and FastAPI not imported)
            if self.chat_template != "digits":
                raise ConfigError("chat_template", self.chat_template, "the default 'digits' unless serve=True")
            if self.on_policy_guard:
                raise ConfigError("on_policy_guard", True, "False unless serve=True (it guards the server)")
            if self.server_share != DEMO_SERVER_SHARE:
                raise ConfigError("server_share", self.server_share, f"the default {DEMO_SERVER_SHARE} unless "
                                  "serve=True (it bounds HTTP requests in the engine)")  # fmt: skip
        if self.ranks == 1 and self.stop_timeout_s != DemoConfig.stop_timeout_s:
            raise ConfigError("stop_timeout_s", self.stop_timeout_s, "the default unless ranks > 1 (it bounds the wait "
                              "of the parent of several ranks)")  # fmt: skip
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                "hidden_size", self.hidden_size, f"a multiple of num_attention_heads={self.num_attention_heads}"
            )
        for name in ("lr", "temperature", "sample_timeout_s", "stop_timeout_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
                raise ConfigError(name, v, "a positive finite number")
        from colo_fsm.adapters.megatron.engine_config import parse_kv_cache_mode

        object.__setattr__(self, "kv_cache_mode", parse_kv_cache_mode(self.kv_cache_mode).value)
        from colo_fsm.collector.collector import parse_inflight

        object.__setattr__(self, "inflight", parse_inflight(self.inflight))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able settings (written to the run folder as config.json)."""
        return asdict(self)


__all__ = ["DemoConfig"]
