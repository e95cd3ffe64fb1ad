"""Run the OpenAI-compatible app on a real socket (uvicorn in a background thread), and the gated engine.

:class:`GatedEngine` wraps a colocated engine and its text generator so that the lifecycle's ``suspend()``
closes the request gate and waits for in-flight requests before the engine is suspended, and ``resume()``
opens it only after the engine resumed. With ``serve=True`` it brings the HTTP server up once, in
``bring_up()`` (that is, when the engine is built), and publishes the base URLs of every data-parallel rank.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import uvicorn

from colo_fsm.adapters.protocols import Completion, GenerationEngine, TextGenerator
from colo_fsm.errors import ConfigError, EngineRebuild, WaitTimeout
from colo_fsm.log import get_logger
from colo_fsm.server.app import create_app, default_chat_template
from colo_fsm.server.gate import SuspendGate
from colo_fsm.states.spec import LIFECYCLE, EngineCondition, LifecycleSpec

log = get_logger(__name__)

LOOPBACK = "127.0.0.1"


class OpenAIServer:
    """One OpenAI-compatible HTTP server (per data-parallel rank) over a generator, behind a suspend gate.

    ``port=0`` picks a free port. The socket is bound before :meth:`start` returns, so :attr:`base_url` is
    usable at once. Binds ``127.0.0.1`` unless ``host`` says otherwise.
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
        chat_template: Callable[[Sequence[Mapping[str, str]]], str] = default_chat_template,
        count_tokens: Callable[[str], int] | None = None,
    ) -> None:
        if not isinstance(host, str) or not host:
            raise ConfigError("host", host, "an interface address such as 127.0.0.1")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
            raise ConfigError("port", port, "an integer in [0, 65535] (0: any free port)")
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
        )
        self.host = host
        self._port = port
        self._server: uvicorn.Server | None = None
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
            backlog=2048,
        )
        self._server = uvicorn.Server(config)
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
        """Stop serving and join the thread."""
        if self._server is None:
            return
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        if self._sock is not None:
            self._sock.close()


def serving_state(state: Any, spec: LifecycleSpec = LIFECYCLE) -> bool:
    """Whether requests may be admitted in ``state``: the spec declares the engine AWAKE there and the machine
    rests there (waits for the training loop), so no action of a handoff is running. Read from the spec, not
    from a list of state names: in the shipped lifecycle that is Generating and Validating."""
    st = spec.state(state)
    return st.resting and st.engine is EngineCondition.AWAKE


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


class GatedEngine:
    """A :class:`GenerationEngine` and :class:`TextGenerator` that keeps requests out of every handoff.

    ``suspend()`` closes the gate, waits for in-flight requests (``drain_timeout_s``), then suspends the inner
    engine; ``resume()`` resumes the inner engine, then opens the gate. ``generate()`` (used by the collector)
    passes the same gate. With ``serve=True``, ``bring_up()`` starts one :class:`OpenAIServer` and gathers the
    base URLs over ``dp_group``; ``attach_admit(admit_while_serving(lc))`` keeps requests out of the start-up
    handoff and the first actions of a step too (admitted only in resting states with the engine awake).
    """

    def __init__(
        self,
        engine: GenerationEngine,
        generator: TextGenerator,
        *,
        serve: bool = False,
        admit: Callable[[], bool] | None = None,
        status: Callable[[], Any] | None = None,
        request_timeout_s: float = 30.0,
        drain_timeout_s: float = 300.0,
        host: str = LOOPBACK,
        port: int = 0,
        model_name: str = "colo-fsm",
        retry_after_s: int = 1,
        dp_group: Any = None,
        record: bool = False,
        **server_kwargs: Any,
    ) -> None:
        if not callable(getattr(generator, "generate", None)):
            raise ConfigError("generator", generator, "a TextGenerator (with generate())")
        for name in ("bring_up", "suspend", "resume", "shutdown"):
            if not callable(getattr(engine, name, None)):
                raise ConfigError("engine", engine, f"a GenerationEngine (missing {name}())")
        self.inner = engine
        self.generator = generator
        self.reads_weights_in_place = bool(getattr(engine, "reads_weights_in_place", False))
        self._status = status
        self.gate = SuspendGate(name="engine", is_open=False, admit=admit, state=self._state_name, record=record)
        self.request_timeout_s = request_timeout_s
        self.drain_timeout_s = drain_timeout_s
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
        self.server: OpenAIServer | None = None
        self._urls: list[str] = []
        self._built = False
        self.suspend_drain_s: list[float] = []

    def attach_status(self, status: Callable[[], Any]) -> None:
        """Set the status source of ``/health`` and 503 messages (e.g. ``lifecycle.status``) after construction."""
        self._status = status

    def attach_admit(self, admit: Callable[[], bool]) -> None:
        """Set the admission predicate after construction (the lifecycle is usually built after the engine)."""
        self.gate._admit = admit

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
        local = None
        if self.serve:
            self.server = OpenAIServer(
                self.generator,
                gate=self.gate,
                status=lambda: self._status() if self._status else None,
                **self._server_args,
            )
            local = self.server.start()
        self._urls = gather_base_urls(local, self._dp_group)
        self.gate.open()

    def suspend(self) -> None:
        """Close the gate, wait for in-flight requests, then suspend the inner engine."""
        self.suspend_drain_s.append(self.gate.close_and_drain(self.drain_timeout_s))
        self.inner.suspend()

    def resume(self) -> None:
        """Resume the inner engine, then open the gate."""
        self.inner.resume()
        self.gate.open()

    def shutdown(self) -> None:
        """Close the gate (best-effort drain), answer waiting requests with 503, stop the server, shut the engine down."""
        try:
            self.gate.close_and_drain(self.drain_timeout_s)
        except WaitTimeout:
            log.warning("shutdown with requests still in flight")
        self.gate.retire()  # requests still waiting get a 503 now instead of at their timeout
        if self.server is not None:
            self.server.stop()
        self.inner.shutdown()

    def server_base_urls(self) -> Sequence[str]:
        """Every data-parallel rank's server base URL (empty without ``serve``)."""
        return list(self._urls)

    # ------------------------------------------------------------------ TextGenerator
    def generate(
        self, prompts: Sequence[str], *, max_tokens: int, temperature: float = 0.0, seed: int | None = None
    ) -> list[Completion]:
        """Generate behind the gate (waits while suspended; ``ServerUnavailable`` after ``request_timeout_s``)."""
        with self.gate.admit(self.request_timeout_s):
            return list(self.generator.generate(prompts, max_tokens=max_tokens, temperature=temperature, seed=seed))


__all__ = [
    "LOOPBACK",
    "GatedEngine",
    "OpenAIServer",
    "admit_while_serving",
    "gather_base_urls",
    "serving_state",
]
