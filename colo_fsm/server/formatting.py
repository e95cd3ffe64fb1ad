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

    def text(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` as a response carries it (special tokens left out)."""
        return "" if self.tok is None else str(self.tok.detokenize(list(ids)))

    def offsets(self, ids: Sequence[int], text: str) -> list[int]:
        """Where each token starts in ``text`` (the choice's text, possibly cut at a stop string): the length of
        the text of the tokens before it, so a special token that ``text`` leaves out takes no room."""
        if self.tok is None:
            return [0] * len(ids)
        lengths = [len(self.text([t])) for t in ids]
        offs: list[int] = []
        if sum(lengths) == len(self.text(ids)):  # tokens decode independently (the common case): one pass
            pos = 0
            for n in lengths:
                offs.append(pos)
                pos += n
        else:  # merged pieces (e.g. byte-level tokens of one character): the prefix's own text
            offs = [len(self.text(ids[:i])) for i in range(len(ids))]
        return [min(o, len(text)) for o in offs]

    def completion_logprobs(
        self, ids: Sequence[int], lps: Sequence[float], tops: Sequence[Any], s: Sampling, offsets: Sequence[int]
    ) -> dict[str, Any]:
        """Completions' ``logprobs`` for ``ids`` (``text_offset``: ``offsets``, indexes into the choice's text)."""
        return {
            "tokens": [self.string(t, s) for t in ids],
            "token_logprobs": list(lps),
            "top_logprobs": self.top_dicts(tops, len(ids), s),
            "text_offset": list(offsets),
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
