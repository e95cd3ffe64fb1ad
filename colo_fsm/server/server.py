"""Run the OpenAI-compatible app on a real socket (uvicorn in a background thread), and the gated engine.

:class:`GatedEngine` wraps a colocated engine so that the lifecycle's ``suspend()`` closes the request gate
before the engine is suspended and ``resume()`` opens it only after the engine resumed: no request is ever
handed to an engine that is not awake. With ``inflight="park"`` (the default) requests already handed over are
parked in the engine with the rest and answered after the resume; ``"drain"`` waits for them before suspending.
With ``serve=True`` it brings the HTTP server up once, in ``bring_up()`` (that is, when the engine is built),
and publishes the base URLs of every data-parallel replica: with tensor parallelism, one server per
tensor-parallel group on its first rank, whose requests the lockstep feeds to the group's other ranks
(:mod:`colo_fsm.server.topology`); a layout that cannot route is refused there, on every rank.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import uvicorn

from colo_fsm.adapters.protocols import Completion, GenerationEngine, TextGenerator
from colo_fsm.errors import ConfigError, EngineRebuild, WaitTimeout
from colo_fsm.log import get_logger
from colo_fsm.server.app import ChatTemplate, ServerSettings, create_app, default_chat_template
from colo_fsm.server.closing import CloseWhenDraining, DrainingServer
from colo_fsm.server.gate import SuspendGate
from colo_fsm.server.lifecycle_clock import LifecycleClock
from colo_fsm.server.params import engine_seed
from colo_fsm.server.topology import ServingRole, check_serving_layout, gather_roles, serving_role
from colo_fsm.states.spec import LIFECYCLE, EngineCondition, LifecycleSpec

log = get_logger(__name__)

LOOPBACK = "127.0.0.1"


class OpenAIServer:
    """One OpenAI-compatible HTTP server (per data-parallel rank) over a generator, behind a suspend gate.

    ``port=0`` picks a free port. The socket is bound before :meth:`start` returns, so :attr:`base_url` is
    usable at once. Binds ``127.0.0.1`` unless ``host`` says otherwise. ``rank`` labels its ``/metrics``;
    ``lifecycle`` feeds their lifecycle series (see :func:`~colo_fsm.server.app.create_app`). :meth:`stop`
    refuses new connections first and gives open ones ``drain_s`` to finish (:mod:`~colo_fsm.server.closing`).
    """

    def __init__(
        self,
        generator: TextGenerator,
        *,
        gate: SuspendGate | None = None,
        host: str = LOOPBACK,
        port: int = 0,
        model_name: str = "colo-fsm",
        request_timeout_s: float = 30.0,
        retry_after_s: int = 1,
        status: Callable[[], Any] | None = None,
        chat_template: ChatTemplate = default_chat_template,
        count_tokens: Callable[[str], int] | None = None,
        tokenizer: Any = None,
        settings: ServerSettings | None = None,
        stopping: Callable[[], bool] | None = None,
        rank: int = 0,
        lifecycle: LifecycleClock | None = None,
        drain_s: float = 1.0,
    ) -> None:
        if not isinstance(host, str) or not host:
            raise ConfigError("host", host, "an interface address such as 127.0.0.1")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
            raise ConfigError("port", port, "an integer in [0, 65535] (0: any free port)")
        if isinstance(drain_s, bool) or not isinstance(drain_s, int | float) or not 0 <= drain_s <= 60:
            raise ConfigError("drain_s", drain_s, "seconds in [0, 60] that open connections get to close at stop()")
        self.drain_s = float(drain_s)
        self.gate = gate if gate is not None else SuspendGate(name="server", is_open=True)
        self.app = create_app(
            generator,
            gate=self.gate,
            model_name=model_name,
            request_timeout_s=request_timeout_s,
            retry_after_s=retry_after_s,
            status=status,
            chat_template=chat_template,
            count_tokens=count_tokens,
            tokenizer=tokenizer,
            settings=settings,
            stopping=stopping,
            rank=rank,
            lifecycle=lifecycle,
        )
        self.app.add_middleware(CloseWhenDraining, draining=self._draining)  # outermost: sees every response
        self.host = host
        self._port = port
        self._server: DrainingServer | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    @property
    def port(self) -> int:
        """The bound port (after :meth:`start`)."""
        return self._port

    @property
    def base_url(self) -> str:
        """``http://host:port/v1``: pass it as ``base_url`` to an OpenAI client."""
        if self._sock is None:
            raise ConfigError("server", "not started", "OpenAIServer.start() called first")
        return f"http://{self.host}:{self._port}/v1"

    @property
    def running(self) -> bool:
        """Whether the server thread is serving."""
        return self._server is not None and self._server.started and not self._server.should_exit

    def _draining(self) -> bool:
        return self._server is not None and self._server.draining

    def start(self, timeout: float = 30.0) -> str:
        """Bind, serve in a background thread, wait until it accepts connections; return :attr:`base_url`."""
        if self._server is not None:
            raise EngineRebuild("the OpenAI-compatible server is started once")
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self._port))
        sock.listen(2048)
        self._sock = sock
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            loop="asyncio",
            http="h11",
            timeout_keep_alive=30,
            timeout_graceful_shutdown=3,
            backlog=2048,
        )
        self._server = DrainingServer(config, self.drain_s)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name=f"openai-server-{self._port}", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise WaitTimeout(f"the OpenAI-compatible server on {self.host}:{self._port} to start", timeout)
            time.sleep(0.01)
        log.info("OpenAI-compatible server at %s", self.base_url)
        return self.base_url

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and join the thread: new connections are refused at once, open ones get ``drain_s`` to
        finish their exchange (every response from then on says ``Connection: close``)."""
        if self._server is None:
            return
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        if self._sock is not None:
            self._sock.close()


def serving_state(state: Any, spec: LifecycleSpec = LIFECYCLE) -> bool:
    """Whether requests may be admitted in ``state``: the spec declares ``serves_requests`` there (the static
    validator holds that to resting states with the engine AWAKE, so no action of a handoff is running). Read
    from the spec, not from a list of state names: in the shipped lifecycle that is Generating and Validating."""
    st = spec.state(state)
    return st.serves_requests and st.resting and st.engine is EngineCondition.AWAKE


def admit_while_serving(lifecycle: Any, spec: LifecycleSpec | None = None) -> Callable[[], bool]:
    """The admission predicate for :meth:`GatedEngine.attach_admit`: True while ``lifecycle.state`` is a
    :func:`serving_state` of ``spec`` (default: the lifecycle's own ``spec``, else :data:`LIFECYCLE`)."""
    the_spec = spec or getattr(lifecycle, "spec", None) or LIFECYCLE

    def admit() -> bool:
        return serving_state(lifecycle.state, the_spec)

    return admit


def gather_base_urls(local: str | None, group: Any = None) -> list[str]:
    """Every data-parallel rank's base URL, in rank order (``torch.distributed.all_gather_object`` when
    initialized, else just ``local``). Ranks that serve nothing pass None and are left out."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a dependency
        dist = None  # type: ignore[assignment]
    if dist is not None and dist.is_available() and dist.is_initialized():
        out: list[str | None] = [None] * dist.get_world_size(group)
        dist.all_gather_object(out, local, group=group)
        return [u for u in out if u]
    return [local] if local else []


def resolve_inflight(inflight: Any, settings: ServerSettings | None, engine: Any) -> str:
    """The gate's in-flight policy: ``inflight``, else ``settings.inflight``, else ``engine.inflight``, else park.

    Raises :class:`ConfigError` naming ``inflight`` when two of them disagree in a way the gate cannot honour:
    ``inflight`` and ``settings.inflight`` both set and different, or a park/abort gate over an engine whose own
    policy differs (only the engine can park or abort; a drain gate over any engine is fine: it holds HTTP
    requests out of the suspend).
    """
    from colo_fsm.adapters.engine.options import parse_inflight

    given = parse_inflight(inflight).value if inflight is not None else None
    from_settings = settings.inflight if settings is not None else None
    if given is not None and from_settings is not None and given != from_settings:
        raise ConfigError("inflight", inflight, f"the same as settings.inflight={from_settings!r} (or leave one unset)")
    raw_engine = getattr(engine, "inflight", None)
    of_engine = parse_inflight(raw_engine).value if raw_engine is not None else None
    policy = given or from_settings or of_engine or "park"
    if of_engine is not None and policy != "drain" and policy != of_engine:
        raise ConfigError(
            "inflight",
            policy,
            f"the engine's own inflight={of_engine!r} or 'drain' (the gate cannot make the engine {policy} requests)",
        )
    return policy


class GatedEngine:
    """A :class:`GenerationEngine` and :class:`TextGenerator` that never hands a request to a sleeping engine.

    ``suspend()`` closes the gate, waits until no request is being handed over, then suspends the inner engine;
    ``resume()`` resumes the inner engine, then opens the gate. With ``inflight="park"`` (default) requests
    already handed over stay in the engine across the suspend (parked at a decode-step boundary) and finish
    after the resume; with ``"drain"`` a request holds the gate until it finished, so ``suspend()`` waits for
    every admitted request (``drain_timeout_s``). HTTP requests run at the engine's server priority, below
    the trainer's rollouts. With ``serve=True``, ``bring_up()`` starts one :class:`OpenAIServer` and gathers
    the base URLs over ``dp_group``; ``attach_admit(admit_while_serving(lc))`` admits only in resting states
    with the engine awake.
    """

    def __init__(
        self,
        engine: GenerationEngine,
        generator: TextGenerator | Any,
        *,
        serve: bool = False,
        admit: Callable[[], bool] | None = None,
        status: Callable[[], Any] | None = None,
        request_timeout_s: float = 30.0,
        drain_timeout_s: float = 300.0,
        shutdown_grace_s: float = 5.0,
        inflight: Any = None,
        host: str = LOOPBACK,
        port: int = 0,
        model_name: str = "colo-fsm",
        retry_after_s: int = 1,
        dp_group: Any = None,
        record: bool = False,
        settings: ServerSettings | None = None,
        tokenizer: Any = None,
        **server_kwargs: Any,
    ) -> None:
        if not callable(getattr(generator, "generate", None)) and not callable(getattr(generator, "submit", None)):
            raise ConfigError("generator", generator, "an engine with submit() or a TextGenerator (with generate())")
        for name in ("bring_up", "suspend", "resume", "shutdown"):
            if not callable(getattr(engine, name, None)):
                raise ConfigError("engine", engine, f"a GenerationEngine (missing {name}())")
        inflight = resolve_inflight(inflight, settings, engine)
        if isinstance(shutdown_grace_s, bool) or not isinstance(shutdown_grace_s, int | float) or shutdown_grace_s < 0:
            raise ConfigError("shutdown_grace_s", shutdown_grace_s, "a non-negative number of seconds")
        self.inner = engine
        self.generator = generator
        self.tokenizer = tokenizer if tokenizer is not None else getattr(generator, "tokenizer", None)
        self.reads_weights_in_place = bool(getattr(engine, "reads_weights_in_place", False))
        self._status = status
        self.gate = SuspendGate(name="engine", is_open=False, admit=admit, state=self._state_name, record=record)
        self.request_timeout_s = request_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.shutdown_grace_s = float(shutdown_grace_s)
        self.settings = replace(settings if settings is not None else ServerSettings(), inflight=inflight)
        self.inflight = inflight
        self.serve = serve
        self._server_args = dict(
            host=host,
            port=port,
            model_name=model_name,
            retry_after_s=retry_after_s,
            request_timeout_s=request_timeout_s,
            **server_kwargs,
        )
        self._dp_group = dp_group
        self.role: ServingRole | None = None  # this rank's part in serving, known after bring_up
        self.server: OpenAIServer | None = None
        self._urls: list[str] = []
        self._built = False
        self.stopping = False
        self.stopped = False
        self.suspend_drain_s: list[float] = []
        self.events: list[str] = []  # "suspend" / "resume" / "shutdown", in order (tests and traces)
        self.lifecycle_clock = LifecycleClock()  # the lifecycle's state, time per state, steps: for /metrics

    def attach_status(self, status: Callable[[], Any]) -> None:
        """Set the status source of ``/health`` and 503 messages (e.g. ``lifecycle.status``) after construction."""
        self._status = status

    def attach_admit(self, admit: Callable[[], bool]) -> None:
        """Set the admission predicate after construction (the lifecycle is usually built after the engine)."""
        self.gate._admit = admit

    def attach_lifecycle(self, lifecycle: Any, spec: LifecycleSpec | None = None) -> None:
        """Serve under ``lifecycle`` (a :class:`~colo_fsm.Lifecycle`): its ``status`` feeds ``/health``, requests
        are admitted only in its serving states (:func:`admit_while_serving`), and its trace feeds the lifecycle
        series of ``/metrics`` (state, time in each state, training steps and their rate, weight version)."""
        self.attach_status(lifecycle.status)
        self.attach_admit(admit_while_serving(lifecycle, spec))
        the_spec = spec or getattr(lifecycle, "spec", None) or LIFECYCLE
        self.lifecycle_clock.add_states(s.state.value for s in the_spec.states)
        trace = getattr(lifecycle, "trace", None)
        if trace is not None:
            for record in list(trace):  # what happened before (e.g. the start), then every new record
                self.lifecycle_clock(record)
            trace.subscribe(self.lifecycle_clock)

    def _state_name(self) -> str:
        if self._status is None:
            return "suspended"
        st = self._status()
        return str(getattr(st, "state", None) or (st.get("state") if isinstance(st, Mapping) else st))

    # ------------------------------------------------------------------ GenerationEngine
    def bring_up(self) -> None:
        """Build the inner engine, start the server (once), gather the base URLs, open the gate."""
        if self._built:
            raise EngineRebuild("the colocated engine (and its server) come up exactly once")
        self._built = True
        self.inner.bring_up()
        # every rank reports its part; every rank refuses a layout that cannot route, with the same error
        self.role = serving_role(self.serve, self.generator)
        check_serving_layout(gather_roles(self.role, self._dp_group))
        local = None
        if self.role.runs_server:  # with TP > 1: the group's first rank only; the lockstep feeds the others
            fed = _FeedGroup(self.generator) if len(self.role.group) > 1 else self.generator
            self.server = OpenAIServer(
                fed,
                gate=self.gate,
                status=lambda: self._status() if self._status else None,
                tokenizer=self.tokenizer,
                settings=self.settings,
                stopping=_Stopping(self),
                rank=self.role.rank,
                lifecycle=self.lifecycle_clock,
                **self._server_args,
            )
            local = self.server.start()
        self._urls = gather_base_urls(local, self._dp_group)
        self.gate.open()

    def suspend(self) -> None:
        """Close the gate, wait until no request is being handed over (``drain``: until none runs), suspend."""
        self.suspend_drain_s.append(self.gate.close_and_drain(self.drain_timeout_s))
        self.inner.suspend()
        self.events.append("suspend")

    def resume(self) -> None:
        """Resume the inner engine, then open the gate."""
        self.inner.resume()
        self.events.append("resume")
        self.gate.open()

    def _active_http(self) -> int:
        if self.server is None:
            return 0
        return int(self.server.app.state.ctx.active)

    def shutdown(self) -> None:
        """Stop admitting (waiting requests get a 503 at once), give in-flight requests ``shutdown_grace_s`` to
        finish while the engine is awake, shut the engine down (what is left is aborted and answered 503), then
        stop the server."""
        self.stopping = True
        try:
            self.gate.close_and_drain(self.drain_timeout_s)
        except WaitTimeout:
            log.warning("shutdown with requests still being handed to the engine")
        self.gate.retire()  # requests still waiting get a 503 now instead of at their timeout
        if getattr(self.inner, "awake", True):
            deadline = time.monotonic() + self.shutdown_grace_s
            while self._active_http() > 0 and time.monotonic() < deadline:
                time.sleep(0.02)
        left = self._active_http()
        if left:
            log.warning("shutdown: %d HTTP request(s) still running; the engine aborts them (503)", left)
        self.inner.shutdown()
        self.stopped = True
        self.events.append("shutdown")
        deadline = time.monotonic() + 2.0
        while self._active_http() > 0 and time.monotonic() < deadline:  # let the 503s go out
            time.sleep(0.02)
        if self.server is not None:
            self.server.stop()

    def model_mode(self) -> Any:
        """The inner engine's report of the shared model's mode (None when it reports none)."""
        from colo_fsm.guards.mode import report_of

        return report_of(self.inner)

    def engine_state(self) -> Any:
        """The inner engine's own state report (None when it reports none): the lifecycle checks it."""
        from colo_fsm.guards.engine_state import engine_state_of

        return engine_state_of(self.inner)

    def server_base_urls(self) -> Sequence[str]:
        """Every data-parallel rank's server base URL (empty without ``serve``)."""
        return list(self._urls)

    # ------------------------------------------------------------------ TextGenerator
    def generate(
        self, prompts: Sequence[str], *, max_tokens: int, temperature: float = 0.0, seed: int | None = None
    ) -> list[Completion]:
        """Generate behind the gate (waits while suspended; ``ServerUnavailable`` after ``request_timeout_s``).

        Over an engine with ``submit()`` and ``inflight`` park or abort only the hand-over holds the gate, so a
        suspend leaves these requests to the engine (parked, or ended and resubmitted) instead of waiting for them.
        A ``seed`` may be any integer: prompt ``i`` gets ``seed + i`` folded into [0, 2**63)
        (:func:`~colo_fsm.server.params.engine_seed`), as every engine takes a non-negative seed.
        """
        submit = getattr(self.generator, "submit", None)
        if self.inflight != "drain" and callable(submit) and self.tokenizer is not None:
            ids = [self.tokenizer.tokenize(p) for p in prompts]
            with self.gate.admit(self.request_timeout_s):
                handles = [
                    submit(p, max_tokens=max_tokens, temperature=temperature, seed=engine_seed(seed, i))
                    for i, p in enumerate(ids)
                ]
            outs = [h.future.result() for h in handles]
            return [
                Completion(
                    text=o.text,
                    token_ids=tuple(o.token_ids),
                    weight_version=int(o.weight_version),
                    finish_reason=o.finish_reason,
                    **_completion_extras(o),
                )
                for o in outs
            ]
        with self.gate.admit(self.request_timeout_s):
            return list(
                self.generator.generate(prompts, max_tokens=max_tokens, temperature=temperature, seed=engine_seed(seed))
            )


class _FeedGroup:
    """The generator as the tensor-parallel group's server sees it: every ``submit`` is made with ``feed=True``,
    so the lockstep carries the request to the group's other ranks."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def submit(self, prompt_ids: Sequence[int], **kwargs: Any) -> Any:
        """``engine.submit(prompt_ids, feed=True, **kwargs)``."""
        return self._engine.submit(prompt_ids, feed=True, **kwargs)


class _Stopping:
    """``stopping()`` for the app, with ``phase()``: "running", "stopping" (teardown began) or "stopped"."""

    def __init__(self, gated: GatedEngine) -> None:
        self._gated = gated

    def __call__(self) -> bool:
        return self._gated.stopping

    def phase(self) -> str:
        g = self._gated
        return "stopped" if g.stopped else "stopping" if g.stopping else "running"


def _completion_extras(o: Any) -> dict[str, Any]:
    """``weight_versions`` and ``logprobs`` for :class:`Completion` when it has those fields."""
    fields = getattr(Completion, "__dataclass_fields__", {})
    out: dict[str, Any] = {}
    for name in ("weight_versions", "logprobs"):
        if name in fields and hasattr(o, name):
            out[name] = tuple(getattr(o, name))
    return out


__all__ = [
    "LOOPBACK",
    "GatedEngine",
    "OpenAIServer",
    "admit_while_serving",
    "gather_base_urls",
    "serving_state",
]
