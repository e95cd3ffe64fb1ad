"""Reading a request body: JSON only under a JSON content type (415 otherwise), at most ``max_body_bytes`` (413,
refused from ``Content-Length`` before reading, or as soon as the bytes read pass the limit), whole within
``upload_timeout_s`` (408 for a stalled or too-slow upload), then parsed with every parser failure a 400 naming
``body`` (invalid UTF-8 or JSON, integers over Python's digit limit, nesting deeper than
:data:`~colo_fsm.server.settings.MAX_JSON_DEPTH`). A client that goes away while its body is read is a client
outcome (:class:`~colo_fsm.errors.ClientGone` at stage ``upload``), never a server error."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import ClientDisconnect, Request

from colo_fsm.errors import ClientGone, PayloadTooLarge, UnsupportedMediaType, UploadTimeout
from colo_fsm.server.params import BadRequest
from colo_fsm.server.settings import MAX_JSON_DEPTH


def check_content_type(value: str | None) -> None:
    """415 unless ``value`` is ``application/json`` or a ``+json`` type (parameters such as charset allowed)."""
    media = (value or "").split(";", 1)[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        raise UnsupportedMediaType(value)


async def read_limited(request: Request, limit: int, timeout_s: float | None = None) -> bytes:
    """The raw body, at most ``limit`` bytes: 413 from ``Content-Length`` before anything is read, else as soon as
    the chunks received pass ``limit`` (the rest is never read); 408 (:class:`UploadTimeout`) when it has not
    arrived whole within ``timeout_s``; :class:`ClientGone` (stage ``upload``) when the client goes away."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise BadRequest("content-length", f"{declared[:40]!r} is not a number of bytes") from None
        if size > limit:
            raise PayloadTooLarge(size, limit)
    chunks: list[bytes] = []
    total = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                total += len(chunk)
                if total > limit:
                    raise PayloadTooLarge(total, limit)
                chunks.append(chunk)
    except TimeoutError:
        raise UploadTimeout(total, float(timeout_s or 0.0)) from None
    except ClientDisconnect:
        raise ClientGone("upload", f"client disconnected after {total} bytes of its body") from None
    return b"".join(chunks)


def parse_json(raw: bytes) -> Any:
    """The request body as JSON; a 400 naming ``body`` for invalid UTF-8 or JSON, an integer literal over
    Python's digit limit, or nesting deeper than :data:`~colo_fsm.server.settings.MAX_JSON_DEPTH`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest("body", f"not valid UTF-8 (byte {exc.start})") from None
    if not text.strip():
        raise BadRequest("body", "empty; expected a JSON object")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRequest("body", f"invalid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise BadRequest("body", f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # an integer literal over sys.get_int_max_str_digits() digits
        raise BadRequest("body", f"a number in the JSON cannot be read ({str(exc)[:120]})") from None
    check_depth(value, MAX_JSON_DEPTH)
    return value


def check_depth(value: Any, limit: int) -> None:
    """400 naming ``body`` when ``value`` nests lists and objects deeper than ``limit`` (checked without recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            items: Any = v.values()
        elif isinstance(v, list):
            items = v
        else:
            continue
        if depth > limit:
            raise BadRequest("body", f"JSON nested deeper than {limit} levels")
        stack.extend((x, depth + 1) for x in items if isinstance(x, dict | list))


async def read_json(request: Request, limit: int, timeout_s: float | None = None) -> Any:
    """The request's JSON value: content type checked, size and upload time bounded, parsed (see the module)."""
    check_content_type(request.headers.get("content-type"))
    return parse_json(await read_limited(request, limit, timeout_s))


__all__ = ["check_content_type", "check_depth", "parse_json", "read_json", "read_limited"]
