"""Structured output: grammar-constrained decoding with xgrammar, as a token mask per row.

An engine owns one :class:`GrammarBackend`: xgrammar's tokenizer view of the model's vocabulary
(built on first use, from the checkpoint's own ``tokenizer.json``) and a compiler whose results
are cached per constraint. A constrained request gets a :class:`GrammarState` — a matcher that
has accepted every token the request generated so far. Each step the sampler asks the states of
its rows for their next-token bitmasks, fills one bitmask tensor for the whole batch and applies
it to those rows in place (rows without a constraint are not touched, so they never wait on the
others' grammars); after sampling, each state accepts its row's token.

The state is a function of the accepted ids alone, so a decode replica continuing a prefill's
request rebuilds it by accepting the first token the prefill sampled: no grammar state crosses
the KV handoff. A constraint that does not compile is a ``SamplingParamsError`` naming the
request field it came from (``response_format``, ``guided_json`` ...).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import torch

from core.errors import SamplingParamsError
from core.sampling import StructuredOutput

if TYPE_CHECKING:
    from engine.tokenizer.tokenizer import Tokenizer

_CACHE_SIZE = 256


class GrammarState:
    """One request's matcher: what it may emit next, given what it emitted."""

    def __init__(self, matcher: Any) -> None:
        self._matcher = matcher

    def accept(self, token_id: int) -> bool:
        """Advance past ``token_id``; False when the grammar does not allow it (then the
        state is unchanged)."""
        return bool(self._matcher.accept_token(token_id))

    @property
    def terminated(self) -> bool:
        """True once the grammar is complete and a stop token was accepted."""
        return bool(self._matcher.is_terminated())

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)


class GrammarBackend:
    """xgrammar for one model: its vocabulary view and the compiled constraints."""

    def __init__(
        self, tokenizer: Tokenizer, vocab_size: int, stop_token_ids: Sequence[int]
    ) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._stop_token_ids = list(stop_token_ids)
        self._compiler: Any = None
        self._lock = threading.Lock()
        self._compile = lru_cache(maxsize=_CACHE_SIZE)(self._compile_uncached)

    def check(self, spec: StructuredOutput) -> None:
        """Compile ``spec`` (cached); raises ``SamplingParamsError`` naming its field."""
        self._compile(spec)

    def new_state(self, spec: StructuredOutput, accepted: Sequence[int] = ()) -> GrammarState:
        """A fresh state for ``spec`` that has accepted ``accepted``."""
        import xgrammar as xgr

        state = GrammarState(xgr.GrammarMatcher(self._compile(spec)))
        for token_id in accepted:
            if not state.accept(token_id):
                raise SamplingParamsError(
                    f"token {token_id} does not follow {spec.param}", param=spec.param
                )
        return state

    def _compiler_once(self) -> Any:
        with self._lock:
            if self._compiler is None:
                import xgrammar as xgr
                from transformers import PreTrainedTokenizerFast

                hf = PreTrainedTokenizerFast(tokenizer_object=self._tokenizer.backend)
                info = xgr.TokenizerInfo.from_huggingface(
                    hf, vocab_size=self._vocab_size, stop_token_ids=self._stop_token_ids
                )
                self._compiler = xgr.GrammarCompiler(info)
            return self._compiler

    def _compile_uncached(self, spec: StructuredOutput) -> Any:
        compiler = self._compiler_once()
        try:
            if spec.kind == "json":
                return compiler.compile_grammar(_json_schema_grammar(spec.spec))
            if spec.kind == "json_object":  # OpenAI's json_object: an object, not any value
                return compiler.compile_grammar(_json_schema_grammar('{"type": "object"}'))
            if spec.kind == "regex":
                return compiler.compile_regex(spec.spec)
            if spec.kind == "choice":
                return compiler.compile_grammar(_choice_grammar(spec.spec))
            return compiler.compile_grammar(spec.spec)
        except SamplingParamsError:
            raise
        except Exception as e:  # xgrammar raises RuntimeError/ValueError with its parser's words
            raise SamplingParamsError(
                f"invalid {spec.param}: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                param=spec.param,
            ) from None


_LENIENT_STRING_CHAR = r"[^\"\\\r\n]"
_STRICT_STRING_CHAR = r"[^\0-\x1f\"\\]"


def _json_schema_grammar(schema: str) -> Any:
    """xgrammar's grammar for a JSON schema, with no insignificant whitespace, and string
    characters as JSON defines them.

    NOTE: xgrammar (0.2.x) writes a length-bounded string (``maxLength``) with a character class
    that lets control characters through unescaped, which no JSON parser accepts; its unbounded
    strings exclude them. The bounded class is replaced by the unbounded one's.
    """
    import xgrammar as xgr

    ebnf = str(xgr.Grammar.from_json_schema(schema, any_whitespace=False))
    return xgr.Grammar.from_ebnf(ebnf.replace(_LENIENT_STRING_CHAR, _STRICT_STRING_CHAR))


def _choice_grammar(spec: str) -> str:
    """An EBNF grammar whose only sentences are the given strings (a JSON list)."""
    try:
        choices = json.loads(spec)
    except ValueError:
        choices = None
    if (
        not isinstance(choices, list)
        or not choices
        or not all(isinstance(c, str) and c for c in choices)
    ):
        raise SamplingParamsError(
            "guided_choice must be a non-empty list of non-empty strings", param="guided_choice"
        )
    return "root ::= " + " | ".join(json.dumps(c) for c in choices)


def apply_masks(logits: torch.Tensor, states: Sequence[GrammarState | None]) -> torch.Tensor:
    """``logits`` [B, V] with each constrained row's disallowed tokens set to -inf (a copy when
    any row is constrained)."""
    # NOTE: a terminated grammar (its stop token sampled under ignore_eos) constrains no more
    rows = [i for i, state in enumerate(states) if state is not None and not state.terminated]
    if not rows:
        return logits
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(len(states), logits.shape[-1])
    for i in rows:
        states[i].fill(bitmask, i)  # type: ignore[union-attr]
    out = logits.clone()
    if out.device.type == "cpu":
        xgr.apply_token_bitmask_inplace(out, bitmask, indices=rows)
    else:
        xgr.apply_token_bitmask_inplace(out, bitmask.to(out.device), indices=rows)
    return out


class GrammarStates:
    """The engine's constrained requests: their states by request id, and the backend made on
    the first constrained request (an engine that never sees one never imports xgrammar)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_token_ids: Sequence[int]):
        self._args = (tokenizer, vocab_size, tuple(stop_token_ids))
        self._backend: GrammarBackend | None = None
        self._states: dict[str, GrammarState] = {}

    def check(self, spec: StructuredOutput | None) -> None:
        """Raise ``SamplingParamsError`` (naming the field) when ``spec`` does not compile."""
        if spec is not None:
            self._get_backend().check(spec)

    def start(self, request_id: str, spec: StructuredOutput | None, accepted: Sequence[int] = ()):
        """Track ``request_id``'s state (after ``accepted``) when it is constrained."""
        if spec is not None:
            self._states[request_id] = self._get_backend().new_state(spec, accepted)

    def get(self, request_id: str) -> GrammarState | None:
        return self._states.get(request_id)

    def accept_one(self, request_id: str, token_id: int) -> None:
        """``request_id``'s sampled token, when it is constrained and not yet terminated."""
        state = self._states.get(request_id)
        if state is not None and not state.terminated:
            state.accept(token_id)

    def forget(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    def _get_backend(self) -> GrammarBackend:
        if self._backend is None:
            self._backend = GrammarBackend(*self._args)
        return self._backend
