"""Control messages between the ingress and the prefill / decode workers.

Frozen dataclasses of plain values (ints, strings, lists, nested plain dicts) — never tensors,
never arbitrary objects. They cross process boundaries as ``to_dict()`` dicts and are rebuilt
with ``from_dict()``, so a Serve handle call carries only JSON-shaped data.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from core.kv_handle import KVHandle
from core.sampling import SamplingParams


def sampling_to_dict(params: SamplingParams) -> dict[str, Any]:
    """``SamplingParams`` as a JSON-ready dict (tuples become lists)."""
    data = asdict(params)
    data["stop"] = list(params.stop)
    data["stop_token_ids"] = list(params.stop_token_ids)
    return data


def sampling_from_dict(data: dict[str, Any]) -> SamplingParams:
    """Inverse of :func:`sampling_to_dict`; validates like the constructor."""
    known = {f.name for f in fields(SamplingParams)}
    return SamplingParams(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class PrefillRequest:
    """Ingress -> prefill: compute the prompt's KV, sample the first token, export the KV."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrefillRequest:
        """Inverse of :meth:`to_dict`."""
        return cls(data["request_id"], list(data["prompt_token_ids"]), dict(data["sampling"]))


@dataclass(frozen=True)
class PrefillResult:
    """Prefill -> ingress: the first token (and its text) plus where to pull the KV from.

    ``kv_handle`` is None when the first token already ended the request (``finish_reason``
    set) — nothing to decode, nothing pinned.
    """

    request_id: str
    first_token_id: int
    first_text: str
    num_cached_tokens: int
    kv_handle: KVHandle | None
    finish_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the handle nested as a dict)."""
        data = asdict(self)
        data["kv_handle"] = None if self.kv_handle is None else self.kv_handle.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrefillResult:
        """Inverse of :meth:`to_dict`."""
        handle = data.get("kv_handle")
        return cls(
            request_id=data["request_id"],
            first_token_id=int(data["first_token_id"]),
            first_text=data["first_text"],
            num_cached_tokens=int(data["num_cached_tokens"]),
            kv_handle=None if handle is None else KVHandle.from_dict(handle),
            finish_reason=data.get("finish_reason"),
        )


@dataclass(frozen=True)
class DecodeRequest:
    """Ingress -> decode: continue after ``first_token_id`` with KV pulled from ``kv_handle``.

    Both None means *local prefill*: decode runs the whole request itself (short prompts,
    no healthy prefill capacity) and streams from the first token on.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling: dict[str, Any]
    first_token_id: int | None = None
    kv_handle: KVHandle | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        data = asdict(self)
        data["kv_handle"] = None if self.kv_handle is None else self.kv_handle.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DecodeRequest:
        """Inverse of :meth:`to_dict`."""
        handle = data.get("kv_handle")
        first = data.get("first_token_id")
        return cls(
            request_id=data["request_id"],
            prompt_token_ids=list(data["prompt_token_ids"]),
            sampling=dict(data["sampling"]),
            first_token_id=None if first is None else int(first),
            kv_handle=None if handle is None else KVHandle.from_dict(handle),
        )


@dataclass(frozen=True)
class TokenChunk:
    """Decode -> ingress, one per engine step that advanced the request.

    ``error_type`` / ``error_message`` (and ``error_param``, the field at fault) are set on a
    failed request (the last chunk); the ingress turns them into an OpenAI error (an SSE error
    event mid-stream).
    """

    request_id: str
    token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    error_type: str | None = None
    error_message: str | None = None
    error_param: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TokenChunk:
        """Inverse of :meth:`to_dict`."""
        return cls(**data)
