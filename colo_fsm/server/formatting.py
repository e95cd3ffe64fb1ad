"""OpenAI's response pieces from finished choices: usage, per-token log-probs (completions and chat shapes),
token strings, the weight version of a response, and server-sent-event framing."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, is_dataclass
from typing import Any

from colo_fsm.server.params import Sampling
from colo_fsm.server.runner import ChoiceResult


def jsonable(obj: Any) -> Any:
    """A dataclass or mapping as a plain dict (anything else unchanged)."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return asdict(obj)
    if isinstance(obj, Mapping):
        return dict(obj)
    return obj


def sse(obj: Any) -> bytes:
    """One server-sent event carrying ``obj`` as compact JSON."""
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


def usage(
    prompts: Sequence[Sequence[int]] | None,
    outs: Sequence[ChoiceResult],
    texts: Sequence[str],
    count_tokens: Callable[[str], int] | None,
) -> dict[str, int]:
    """OpenAI's ``usage``: each prompt counted once whatever ``n``, plus every generated token."""
    if prompts is not None:
        prompt_tokens = sum(len(p) for p in prompts)
    else:
        prompt_tokens = sum(count_tokens(t) for t in texts) if count_tokens else 0
    completion_tokens = sum(len(o.token_ids) for o in outs)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def versions(outs: Sequence[ChoiceResult]) -> int | None:
    """The oldest weight version that produced a token of the response (None without tokens)."""
    vs = [v for o in outs for v in o.weight_versions]
    return min(vs) if vs else None


class TokenText:
    """Token strings of one server's tokenizer (``"token_id:<id>"`` with ``return_tokens_as_token_ids``)."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok

    def string(self, t: int, s: Sampling) -> str:
        """Token ``t`` as text, special tokens included."""
        if s.tokens_as_ids:
            return f"token_id:{t}"
        if self.tok is None:
            return str(t)
        try:
            return str(self.tok.detokenize([t], skip_special_tokens=False))
        except TypeError:
            return str(self.tok.detokenize([t]))

    def top_dicts(self, tops: Sequence[Any], n: int, s: Sampling) -> list[dict[str, float]] | None:
        """Completions' ``top_logprobs``: per token, ``{token text: logprob}`` of its alternatives."""
        if not s.top_logprobs:
            return None
        padded = list(tops) + [()] * (n - len(tops))
        return [{self.string(t, s): float(v) for t, v in top} for top in padded[:n]]

    def completion_logprobs(
        self, ids: Sequence[int], lps: Sequence[float], tops: Sequence[Any], s: Sampling, start: int = 0
    ) -> dict[str, Any]:
        """Completions' ``logprobs`` for ``ids``; ``text_offset`` counts from ``start``."""
        toks = [self.string(t, s) for t in ids]
        offsets, pos = [], start
        for t in toks:
            offsets.append(pos)
            pos += len(t)
        return {
            "tokens": toks,
            "token_logprobs": list(lps),
            "top_logprobs": self.top_dicts(tops, len(toks), s),
            "text_offset": offsets,
        }

    def chat_logprobs(
        self, ids: Sequence[int], lps: Sequence[float], s: Sampling, tops: Sequence[Any] = ()
    ) -> dict[str, Any] | None:
        """Chat's ``logprobs.content``: per token its text, log-prob, bytes and alternatives."""
        if not s.logprobs:
            return None
        content = []
        padded = list(tops) + [()] * (len(ids) - len(tops))
        for t, lp, top in zip(ids, lps, padded):
            ts = self.string(t, s)
            alts = []
            for at, av in top if s.top_logprobs else ():
                a_s = self.string(at, s)
                alts.append({"token": a_s, "logprob": float(av), "bytes": list(a_s.encode("utf-8"))})
            content.append({"token": ts, "logprob": lp, "bytes": list(ts.encode("utf-8")), "top_logprobs": alts})
        return {"content": content, "refusal": None}


__all__ = ["TokenText", "jsonable", "sse", "usage", "versions"]
