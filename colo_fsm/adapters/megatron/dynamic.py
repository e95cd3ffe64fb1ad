"""The GPU generation path: megatron-core's dynamic inference engine over the training model object.

``MegatronLLM(model=..., use_coordinator=False)`` builds the engine once (context, inference wrapper,
controller, ``DynamicInferenceEngine``); in this direct mode its own ``suspend()``/``resume()`` methods are
refused, so suspend and resume go to the underlying ``DynamicInferenceEngine``. That engine clears the
process-wide ``InferenceMode`` flag on ``suspend()`` and sets it again on ``resume()``.

:class:`DynamicStepBackend` drives that engine request by request (a
:class:`~colo_fsm.adapters.batching.StepBackend`): ``add_request(id, token_ids, SamplingParams)`` per admitted
request, one ``step_modern()`` per decode step, and after each step the new tokens and log-probs of every
request are read off its ``DynamicInferenceRequestRecord`` from where the last step's reading stopped
(:class:`RecordCursor`: O(tokens that step produced), not O(tokens so far)). A record holds more than one
request after a recompute-mode resume or an eviction checkpointed it: the generated tokens of all of them, in
order, are the request's tokens. megatron-core has no abort call; a running request is finished through the engine's
stop-word hook (its id goes into ``stop_word_finished_request_ids``: the controller marks it finished at the
next bookkeeping and its KV blocks are released), and a waiting one is taken off the waiting queue.
A request is *kept* across ``suspend()``/``resume()`` in every mode: persist leaves the KV buffer in place,
offload copies it to host memory and back, recompute checkpoints each active request (prompt += generated)
and re-adds it on resume, where it is re-prefilled.

KV-cache modes (``InferenceConfig.kv_cache_management_mode``) and CUDA graphs:

* ``persist``: the KV buffer stays on the GPU at the same address; suspend/resume cost about a millisecond
  and captured CUDA graphs stay valid (never recaptured).
* ``offload``: the KV buffer is copied to host memory on suspend and back on resume, freeing GPU memory for
  training; because the buffer comes back at a new address, the engine deletes its CUDA graphs on suspend
  and recaptures them on resume (unless ``static_kv_memory_pointers`` with UVM / torch_memory_saver).
* ``recompute``: the KV buffer is freed on suspend and reallocated empty on resume; in-flight requests are
  re-prefilled. CUDA graphs are deleted and recaptured as for ``offload``.

CUDA graphs are only captured when the model's ``TransformerConfig`` asks for them (``cuda_graph_impl=
"local"``); with the default config ``create_cuda_graphs()`` does nothing and the recapture costs nothing.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from colo_fsm.adapters.batching import BackendRequest, StepOutput, TopLogprobs
from colo_fsm.adapters.megatron.inference_settings import megatron_inference_config
from colo_fsm.adapters.megatron.parallel import on_own_device
from colo_fsm.adapters.megatron.step_profile import StepProfile, record_step_safely
from colo_fsm.errors import ConfigError, LifecycleError
from colo_fsm.guards.sampling import SamplingStream
from colo_fsm.log import get_logger

log = get_logger(__name__)


def dynamic_engine_available() -> tuple[bool, str]:
    """Whether the dynamic engine can run here, and if not, why (no CUDA device, no flash-attention)."""
    if not torch.cuda.is_available():
        return False, "no CUDA device (megatron-core's dynamic engine needs flash-attention on a GPU)"
    from megatron.core.transformer import attention as mattn  # megatron-core's own flash-attention probes

    for flag in ("HAVE_FA4", "HAVE_FA3"):
        if getattr(mattn, flag, False):
            return True, f"CUDA device and flash-attention ({flag}) found"
    if getattr(mattn, "flash_attn_with_kvcache", None) is not None:
        return True, "CUDA device and flash-attention 2 found"
    return False, "no flash-attention importable (the dynamic engine's paged attention needs it)"


def check_head_dim(config: Any) -> None:
    """Refuse a head dimension the dynamic engine's paged flash-attention cannot run (not a multiple of 16).

    flash-attn-4 on an H200 asserts "Paged KV does not support irregular head dim" for e.g. head dim 8.
    """
    kv = getattr(config, "kv_channels", None) or config.hidden_size // config.num_attention_heads
    if kv % 16:
        raise ConfigError(
            "kv_channels",
            kv,
            "a multiple of 16 for the dynamic engine's paged flash-attention (hidden_size / num_attention_heads)",
        )


def requests_of(record: Any) -> Sequence[Any]:
    """The requests of a ``DynamicInferenceRequestRecord`` in order (one per recompute checkpoint; the record's
    own list, not a copy); a bare request stands for itself."""
    return getattr(record, "requests", None) or [record]


def _as_list(x: Any) -> list[Any]:
    if x is None:
        return []
    if torch.is_tensor(x):
        return list(x.tolist())
    return list(x)


def record_tokens(record: Any) -> tuple[list[int], list[float]]:
    """Every generated token and log-prob of a ``DynamicInferenceRequestRecord`` (all its requests, in order).

    A request without log-probs for some tokens gets ``nan`` there (never a made-up probability).
    """
    toks: list[int] = []
    lps: list[float] = []
    for r in requests_of(record):
        t = [int(x) for x in _as_list(r.generated_tokens)]
        lp = [float(x) for x in _as_list(getattr(r, "generated_log_probs", None))]
        toks.extend(t)
        lps.extend((lp + [math.nan] * len(t))[: len(t)])
    return toks, lps


def record_top_logprobs(record: Any, text_to_id: Callable[[str], int | None]) -> list[TopLogprobs]:
    """Every generated token's top alternatives of a ``DynamicInferenceRequestRecord`` (all its requests, in order).

    megatron-core keys each token's top-n by the alternative's *text* (``tokenizer.detokenize([id])``), so
    ``text_to_id`` maps a text back to a token id (alternatives it cannot map are left out; alternatives
    whose texts collide were already merged by megatron-core). Pairs are sorted most likely first.
    """
    out: list[TopLogprobs] = []
    for r in requests_of(record):
        n = len(_as_list(r.generated_tokens))
        tops = list(getattr(r, "generated_top_n_logprobs", None) or [])
        for d in (tops + [{}] * n)[:n]:
            out.append(top_pairs(d, len(d or {}), text_to_id))
    return out


def record_status(record: Any) -> str:
    """The status name of a record's latest request ("COMPLETED", "FAILED", ...; "" if unknown)."""
    status = getattr(requests_of(record)[-1], "status", None)
    return str(getattr(status, "name", status or ""))


def _slice(x: Any, start: int, stop: int) -> list[Any]:
    """``x[start:stop]`` as a list (a list, a tuple or a tensor; None is empty): O(stop - start)."""
    if x is None:
        return []
    part = x[start:stop]
    return list(part.tolist()) if torch.is_tensor(part) else list(part)


@dataclass
class RecordCursor:
    """Where one request's reading of its ``DynamicInferenceRequestRecord`` stands, so each engine step reads only
    the tokens that step produced (O(new tokens), never the whole generation so far).

    A record holds one request per recompute checkpoint; every request but the last is complete, so the cursor
    keeps the index of the request being read (``part``) and how many of its generated tokens were reported
    (``offset``). ``reported`` counts every token reported, ``last_token`` is the latest one.
    """

    part: int = 0
    offset: int = 0
    reported: int = 0
    last_token: int | None = None

    def advance(self, record: Any, top_k: int = 0) -> tuple[list[int], list[float], list[Any]]:
        """The tokens, log-probs (``nan`` where missing) and raw top-n entries (when ``top_k > 0``) generated
        since the last call; the cursor moves past them."""
        if not top_k:
            one = self._one_new_token(record)
            if one is not None:
                return one
        return self.read_new(record, top_k)

    def _one_new_token(self, record: Any) -> tuple[list[int], list[float], list[Any]] | None:
        """What :meth:`read_new` gives when the request being read (the record's last) appended exactly one token
        to Python lists since the last call, most engine steps, read without building slices; None otherwise."""
        reqs = requests_of(record)
        if self.part != len(reqs) - 1:
            return None
        r = reqs[self.part]
        gen = r.generated_tokens
        got = getattr(r, "generated_log_probs", None)
        if not isinstance(gen, list) or len(gen) != self.offset + 1 or not (got is None or isinstance(got, list)):
            return None
        tok = int(gen[self.offset])
        lp = float(got[self.offset]) if got is not None and len(got) > self.offset else math.nan
        self.offset += 1
        self.reported += 1
        self.last_token = tok
        return [tok], [lp], []

    def read_new(self, record: Any, top_k: int = 0) -> tuple[list[int], list[float], list[Any]]:
        """:meth:`advance` for any record: every request of it from the cursor on, tokens in lists or tensors."""
        reqs = requests_of(record)
        toks: list[int] = []
        lps: list[float] = []
        tops: list[Any] = []
        while self.part < len(reqs):
            r = reqs[self.part]
            gen = r.generated_tokens
            n = len(gen) if gen is not None else 0
            if n > self.offset:
                t = [int(x) for x in _slice(gen, self.offset, n)]
                lp = [float(x) for x in _slice(getattr(r, "generated_log_probs", None), self.offset, n)]
                toks.extend(t)
                lps.extend(lp + [math.nan] * (len(t) - len(lp)))
                if top_k > 0:
                    raw = _slice(getattr(r, "generated_top_n_logprobs", None), self.offset, n)
                    tops.extend(raw + [{}] * (len(t) - len(raw)))
            if self.part == len(reqs) - 1:
                self.offset = max(self.offset, n)
                break
            self.part += 1  # a checkpointed request is complete: go on with the next one in the record
            self.offset = 0
        if toks:
            self.reported += len(toks)
            self.last_token = toks[-1]
        return toks, lps, tops


def top_pairs(raw: Any, k: int, text_to_id: Callable[[str], int | None]) -> TopLogprobs:
    """One token's top-``k`` alternatives from megatron-core's text-keyed dict (see :func:`record_top_logprobs`)."""
    pairs = []
    for text, lp in dict(raw or {}).items():
        tid = text_to_id(str(text))
        if tid is not None:
            pairs.append((int(tid), float(lp)))
    pairs.sort(key=lambda p: -p[1])
    return tuple(pairs[:k])


def outputs_from_records(
    tracked: dict[int, RecordCursor],
    live: Mapping[int, Any] | LiveRecords,
    finished: Sequence[Any],
    eod: int,
    *,
    want_top: Mapping[int, int] | None = None,
    text_to_id: Callable[[str], int | None] | None = None,
) -> list[StepOutput]:
    """New tokens per tracked request since the last step (``tracked``: request id -> its :class:`RecordCursor`).

    ``live`` maps request ids to records still in the engine, ``finished`` are the records the step returned.
    The cursors move in place; finished requests leave ``tracked``. Requests not tracked are ignored (aborted).
    Requests in ``want_top`` (request id -> k) also get their new tokens' top alternatives (``text_to_id`` is
    required then). The work per call is O(tokens produced since the last call), not O(tokens so far).
    """
    out: list[StepOutput] = []
    done = {int(r.request_id): r for r in finished}
    want = want_top or {}
    for rid, cursor in list(tracked.items()):
        record = done.get(rid)
        if record is None and (record := live.get(rid)) is None:
            continue
        k = want.get(rid, 0)
        new_t, new_lp, raw_top = cursor.advance(record, k)
        new_top: tuple[TopLogprobs, ...] = ()
        if k > 0 and new_t:
            assert text_to_id is not None, "text_to_id is needed for top log-probs"
            new_top = tuple(top_pairs(d, k, text_to_id) for d in raw_top)
        reason: str | None = None
        if rid in done:
            status = record_status(record)
            if status == "FAILED":
                log.warning("dynamic engine failed request %d: %s", rid, getattr(record[-1], "events", ""))
                reason = "abort"
            else:
                reason = "stop" if cursor.last_token == eod else "length"
            del tracked[rid]
        if new_t or reason is not None:
            out.append(StepOutput(rid, tuple(new_t), tuple(new_lp), reason, new_top))
    return out


class LiveRecords:
    """The records of the requests megatron's engine holds, looked up one id at a time (``engine.requests`` maps
    an id to an entry holding its record): no per-step copy of the whole table."""

    __slots__ = ("_requests",)

    def __init__(self, requests: Mapping[int, Any]) -> None:
        self._requests = requests

    def get(self, request_id: int, default: Any = None) -> Any:
        """The record of ``request_id``, or ``default`` when the engine no longer holds it."""
        entry = self._requests.get(request_id)
        return default if entry is None else entry.record


class EngineIds:
    """colo-fsm request ids <-> the dynamic engine's own request ids.

    megatron-core keeps request ids in an int32 tensor of its context, while colo-fsm's ids can be far larger (a
    resubmission under ``inflight="abort"``, a request a TP leader feeds its group): the engine sees dense ids
    of its own, handed out here, and every id crossing the backend boundary is translated here and nowhere else.
    """

    def __init__(self) -> None:
        self._next = 0
        self._engine: dict[int, int] = {}  # colo-fsm request id -> engine id
        self._request: dict[int, int] = {}  # engine id -> colo-fsm request id

    def peek(self) -> int:
        """The engine id the next :meth:`add` hands out."""
        return self._next

    def add(self, request_id: int) -> int:
        """A new engine id for ``request_id`` (a live request id is refused: ids are never shared)."""
        if request_id in self._engine:
            raise LifecycleError(f"request id {request_id} is already in the dynamic engine")
        engine_id = self._next
        self._next += 1
        self._engine[request_id] = engine_id
        self._request[engine_id] = request_id
        return engine_id

    def engine_id(self, request_id: int) -> int | None:
        """The engine id of a live request (None: unknown or already finished)."""
        return self._engine.get(request_id)

    def request_id(self, engine_id: int) -> int:
        """The colo-fsm request id of a live engine id."""
        return self._request[engine_id]

    def forget(self, engine_id: int) -> None:
        """Drop a finished or aborted request's mapping."""
        request_id = self._request.pop(engine_id, None)
        if request_id is not None:
            self._engine.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._request)


def sampling_params(request: BackendRequest, eod: int) -> Any:
    """megatron-core ``SamplingParams`` of one request (greedy as top-k 1; top-p 1.0 as megatron's "off" 0.0;
    ``top_logprobs`` as ``top_n_logprobs``, of the same distribution as the sampled token's log-prob: the engine's
    ``InferenceConfig.logprobs_mode``, see :class:`DynamicStepBackend`)."""
    from megatron.core.inference.sampling_params import SamplingParams

    greedy = request.temperature == 0
    return SamplingParams(
        temperature=1.0 if greedy else float(request.temperature),
        top_k=1 if greedy else int(request.top_k),
        top_p=0.0 if greedy or request.top_p >= 1.0 else float(request.top_p),
        num_tokens_to_generate=int(request.max_tokens),
        termination_id=int(eod),
        return_log_probs=True,
        skip_prompt_log_probs=True,
        top_n_logprobs=int(request.top_logprobs),
    )


def reseed_sampler(engine: Any, seed: int) -> None:
    """Seed the generator the dynamic engine samples every request from (``engine.controller.sampling_rng``).

    Not per request: see :class:`DynamicStepBackend`. torch's default CUDA generator (which the trainer's
    dropout uses) is left alone.
    """
    rng = getattr(getattr(engine, "controller", None), "sampling_rng", None)
    if rng is None:
        log.warning("the dynamic engine has no controller.sampling_rng; seed %d not applied", seed)
        return
    rng.manual_seed(int(seed))


def token_text_index(tokenizer: Any) -> dict[str, int]:
    """``tokenizer.detokenize([id]) -> id`` over the vocabulary (the lowest id wins when texts collide, except
    that the end-of-document id wins its text)."""
    index: dict[str, int] = {}
    for tid in range(int(tokenizer.vocab_size)):
        try:
            text = tokenizer.detokenize([tid])
        except Exception:  # an id the tokenizer cannot render alone
            continue
        index.setdefault(str(text), tid)
    eod = getattr(tokenizer, "eod", None)
    if eod is not None:  # specials often share one text (""): the one a model generates is end-of-document
        with contextlib.suppress(Exception):
            index[str(tokenizer.detokenize([int(eod)]))] = int(eod)
    return index


def drop_finished_from_resume(engine: Any) -> list[int]:
    """After ``engine.suspend()``: take the requests already marked finished (ended through the stop-word hook by
    :meth:`DynamicStepBackend.abort`, e.g. by an ``inflight="abort"`` suspend) off the list a RECOMPUTE-mode resume
    re-adds, so none is re-prefilled only to be finished at the next step. Returns the engine ids dropped (none in
    PERSIST and OFFLOAD, where the list holds only waiting requests and finished rows go at the next step)."""
    finished = engine.stop_word_finished_request_ids
    resume_ids = list(engine.resume_request_ids or [])
    dropped = [rid for rid in resume_ids if rid in finished]
    if not dropped:
        return []
    engine.resume_request_ids = [rid for rid in resume_ids if rid not in finished]
    for rid in dropped:
        finished.discard(rid)
        entry = engine.requests.pop(rid, None)
        if entry is not None and not entry.future.done():
            entry.future.cancel()
    return dropped


class DynamicStepBackend:
    """``DynamicInferenceEngine`` as a step backend (built through ``MegatronLLM(use_coordinator=False)``).

    Build it on the thread that will step it (the batcher's engine thread): the engine's asyncio loop and the
    requests' CUDA tensors belong there.

    ``logprobs_mode`` ("raw" or "processed") is megatron-core's ``InferenceConfig.logprobs_mode`` (raw_logprobs /
    processed_logprobs), one setting for the whole engine: a request asking for the other is refused.

    Seeds are *not isolated per request* on this backend: megatron-core 0.19.2 samples every request of a step
    from one generator (``controller.sampling_rng``) and has no per-request seed. A seeded request re-seeds that
    generator when it is admitted, so its tokens are reproducible only when the same requests share its steps
    in the same order (e.g. when it runs alone); the draws of the other requests decoded with it change too.
    (The CPU backend gives each seeded request its own generator.)
    """

    name = "dynamic"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        kv_cache_mode: str,
        max_sequence_length: int,
        buffer_size_gb: float,
        max_requests: int | None,
        block_size_tokens: int,
        num_cuda_graphs: int | None = None,
        cuda_graph_sizing: str | None = None,
        logprobs_mode: str = "raw",
        sampling: SamplingStream | None = None,
    ) -> None:
        from megatron.core.inference.apis.llm import MegatronLLM

        check_head_dim(model.config)
        self.device = next(model.parameters()).device
        self.model = model
        self.tokenizer = tokenizer
        self.eod = int(tokenizer.eod)
        self.inference_config = megatron_inference_config(
            block_size_tokens=block_size_tokens,
            buffer_size_gb=buffer_size_gb,
            max_requests=max_requests if max_requests is not None else 128,  # bounded: see InferenceConfig
            max_sequence_length=max_sequence_length,
            kv_cache_mode=kv_cache_mode,
            num_cuda_graphs=num_cuda_graphs,
            cuda_graph_sizing=cuda_graph_sizing,
            logprobs_mode=logprobs_mode,
        )
        self.logprobs_mode = logprobs_mode
        model.eval()
        self.llm = MegatronLLM(
            model=model, tokenizer=tokenizer, inference_config=self.inference_config, use_coordinator=False
        )
        self.engine: Any = self.llm.engine
        self.sampling = sampling  # guards: this replica's stream, not megatron's 42 + DP rank (guards/sampling.py)
        if sampling is not None:
            reseed_sampler(self.engine, sampling.seed)
        self.ids = EngineIds()
        self._tracked: dict[int, RecordCursor] = {}  # engine id -> where reading its record stands
        self._want_top: dict[int, int] = {}  # engine id -> top alternatives asked for
        self._text_ids: dict[str, int] | None = None  # built on the first request asking for alternatives
        self.profile = StepProfile()  # each step's kind, time and request counts (step_profile.py)

    @on_own_device
    def add(self, request: BackendRequest) -> None:
        """``add_request`` with the request's own sampling parameters; prefilled at the next step."""
        if request.logprobs_mode != self.logprobs_mode:
            raise ConfigError(
                "logprobs_mode",
                request.logprobs_mode,
                f"{self.logprobs_mode!r}: megatron-core's dynamic engine sets it once for every request "
                "(GenerationConfig.logprobs_mode)",
            )
        if request.seed is not None and request.temperature > 0:
            seed = int(request.seed)
            reseed_sampler(self.engine, self.sampling.request_seed(seed) if self.sampling is not None else seed)
        rid = self.ids.peek()
        fut = self.engine.add_request(rid, [int(t) for t in request.prompt_ids], sampling_params(request, self.eod))
        if fut.done():  # refused at once (too long for the context, more blocks than the buffer has, ...)
            if rid in self.engine.failed_request_ids:
                self.engine.failed_request_ids.remove(rid)
            entry = self.engine.requests.pop(rid, None)
            events = [str(e) for e in getattr(entry.record[-1], "events", [])] if entry is not None else []
            raise LifecycleError(
                f"the dynamic engine refused request {request.request_id}: {'; '.join(events) or 'no reason given'}"
            )
        self.ids.add(int(request.request_id))
        self._tracked[rid] = RecordCursor()
        if request.top_logprobs > 0:
            self._want_top[rid] = int(request.top_logprobs)

    def text_to_id(self, text: str) -> int | None:
        """The token id whose text is ``text`` (the lowest such id), for megatron-core's text-keyed top-n."""
        if self._text_ids is None:
            self._text_ids = token_text_index(self.tokenizer)
        return self._text_ids.get(text)

    @on_own_device
    def step(self) -> list[StepOutput]:
        """One ``step_modern()`` (prefill of newly added requests and/or one decode token for the others)."""
        if not self.engine.has_unfinished_requests():
            return self._as_requests(outputs_from_records(self._tracked, {}, [], self.eod))
        t = time.perf_counter()
        result = self.engine.step_modern()
        record_step_safely(self.profile, self.engine, result, time.perf_counter() - t)
        outs = outputs_from_records(
            self._tracked,
            LiveRecords(self.engine.requests),
            result["finished_request_records"],
            self.eod,
            want_top=self._want_top,
            text_to_id=self.text_to_id,
        )
        for rid in [r for r in self._want_top if r not in self._tracked]:
            del self._want_top[rid]
        return self._as_requests(outs)

    def _as_requests(self, outs: list[StepOutput]) -> list[StepOutput]:
        """The step's outputs under colo-fsm's request ids (a finished request's mapping is dropped)."""
        ids = self.ids
        mapped = []
        for o in outs:
            request_id = ids.request_id(o.request_id)
            if o.finished is not None:
                ids.forget(o.request_id)
            mapped.append(StepOutput(request_id, o.token_ids, o.logprobs, o.finished, o.top_logprobs))
        return mapped

    @on_own_device
    def abort(self, request_id: int) -> None:
        """Finish one request early (waiting: dequeued; active: through the stop-word hook); others untouched."""
        rid = self.ids.engine_id(int(request_id))
        if rid is None:
            return
        self.ids.forget(rid)
        self._want_top.pop(rid, None)
        if self._tracked.pop(rid, None) is None:
            return
        eng = self.engine
        if rid in eng.waiting_request_ids:
            eng.waiting_request_ids.remove(rid)
            entry = eng.requests.pop(rid, None)
            if entry is not None and not entry.future.done():
                entry.future.cancel()
        elif eng.resume_request_ids and rid in eng.resume_request_ids and rid not in self._in_context():
            eng.resume_request_ids.remove(rid)  # suspended in recompute mode: it will not be re-added
            entry = eng.requests.pop(rid, None)
            if entry is not None and not entry.future.done():
                entry.future.cancel()
        elif rid in eng.requests:
            eng.stop_word_finished_request_ids.add(rid)  # finished at the next step's bookkeeping

    def _in_context(self) -> set[int]:
        ctx = self.engine.context
        try:
            ids = ctx.request_ids[: ctx.total_request_count].tolist()
        except Exception:  # buffers freed (recompute mode while suspended)
            return set()
        return {int(i) for i in ids}

    @on_own_device
    def suspend(self) -> float:
        """Suspend the engine with its requests kept (KV per mode, ``InferenceMode`` cleared); seconds taken."""
        t = time.perf_counter()
        self.engine.suspend()
        drop_finished_from_resume(self.engine)
        return time.perf_counter() - t

    @on_own_device
    def resume(self) -> float:
        """Model in eval mode, engine resumed (KV restored or requests re-prefilled per mode); seconds taken."""
        t = time.perf_counter()
        self.model.eval()
        self.engine.resume()
        return time.perf_counter() - t

    @on_own_device
    def shutdown(self) -> None:
        """Drop the engine and free its buffers."""
        self.engine.suspend()
        self._tracked.clear()
        self.ids = EngineIds()
        self.llm = None
        self.engine = None
        torch.cuda.empty_cache()


__all__ = [
    "DynamicStepBackend",
    "RecordCursor",
    "check_head_dim",
    "drop_finished_from_resume",
    "dynamic_engine_available",
    "outputs_from_records",
    "record_status",
    "record_tokens",
    "record_top_logprobs",
    "reseed_sampler",
    "sampling_params",
    "token_text_index",
    "top_pairs",
]
