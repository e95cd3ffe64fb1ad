"""Stepping: one decode step over every active request, and the intake of the tokens it produced.

Every token is stamped with the weight version read just before the step that produced it; a request ends on
its backend's finish, a stop token, ``on_token`` returning False (or raising: "abort") or ``max_tokens``. A row
the loop itself ended leaves the backend at once; under a tensor-parallel lockstep it leaves every rank's
backend together, through the leader's next plan (a follower never drops a row on its own).
"""

from __future__ import annotations

from colo_fsm.adapters.engine.protocol import StepBackend, StepOutput
from colo_fsm.adapters.engine.results import EngineRequest, resolve
from colo_fsm.adapters.engine.state import EngineState
from colo_fsm.log import get_logger

log = get_logger(__name__)


class Stepping(EngineState):
    """The engine loop's decode step (a part of :class:`~colo_fsm.adapters.engine.ContinuousBatcher`)."""

    def _step(self, backend: StepBackend) -> None:
        """One ``backend.step()`` (only ever called awake); tokens go to their requests, finished ones resolve."""
        version = int(self._weight_version())
        with self._cond:
            self._decode_in_flight = True
        try:
            outputs = backend.step()
        finally:
            with self._cond:
                self._decode_in_flight = False
                self.steps += 1
                if not self._awake:
                    self.steps_while_suspended += 1
        finished: list[EngineRequest] = []
        for out in outputs:
            req = self._active.get(out.request_id)
            if req is None or req.state != "running":
                continue  # aborted meanwhile: its backend.abort is pending
            reason = self._take_tokens(req, out, version)
            if reason is not None:
                with self._cond:
                    if req.state != "running":
                        continue  # a caller aborted it meanwhile: it is already resolved, and only once
                    if out.finished is None:  # we ended it (stop token, on_token, length): free its slot
                        if self._lockstep is None:
                            backend.abort(req.backend_id)
                        elif self._lockstep.leader:  # the whole group drops the row, in the next plan
                            self._pending_aborts.append(req.backend_id)
                    self._active.pop(req.backend_id, None)
                    self._mark_done_locked(req, reason)
                finished.append(req)
        for req in finished:
            resolve(req)
        with self._cond:
            self._cond.notify_all()

    def _take_tokens(self, req: EngineRequest, out: StepOutput, version: int) -> str | None:
        """Append one step's tokens to ``req``; the finish reason if the request ends with them."""
        limit = req.submitted.max_tokens
        if len(out.token_ids) == 1 and req.on_token is None and not req.backend.top_logprobs:
            # the common decode step (one token, nobody watching it): the same rules as below, without the lists
            if len(req.token_ids) >= limit:
                return "length"
            tok = int(out.token_ids[0])
            req.token_ids.append(tok)
            req.logprobs.append(float(out.logprobs[0]) if out.logprobs else 0.0)
            req.versions.append(version)
            if tok in req.stop_token_ids:
                return "stop"
            if out.finished is not None:
                return out.finished
            return "length" if len(req.token_ids) >= limit else None
        lps = list(out.logprobs) + [0.0] * (len(out.token_ids) - len(out.logprobs))
        want_top = req.backend.top_logprobs > 0
        tops = list(out.top_logprobs) + [()] * (len(out.token_ids) - len(out.top_logprobs))
        for tok, lp, top in zip(out.token_ids, lps, tops):
            if len(req.token_ids) >= req.submitted.max_tokens:
                return "length"
            req.token_ids.append(int(tok))
            req.logprobs.append(float(lp))
            req.versions.append(version)
            if want_top:
                req.tops.append(tuple((int(t), float(v)) for t, v in top[: req.backend.top_logprobs]))
            if int(tok) in req.stop_token_ids:
                return "stop"
            if req.on_token is not None:
                try:
                    if want_top:
                        keep = req.on_token(int(tok), float(lp), version, req.tops[-1])
                    else:
                        keep = req.on_token(int(tok), float(lp), version)
                except Exception as exc:
                    log.warning("on_token of request %d raised %r; the request is aborted", req.request_id, exc)
                    return "abort"
                if keep is False:
                    return "stop"
        if out.finished is not None:
            return out.finished
        if len(req.token_ids) >= req.submitted.max_tokens:
            return "length"
        return None


__all__ = ["Stepping"]
