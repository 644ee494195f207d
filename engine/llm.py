"""The offline, vLLM-style API: ``LLM(model=...).generate(prompts, sampling_params)``."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from core.config import DType, EngineConfig, ModelConfig
from core.errors import InvalidRequestError
from core.sampling import SamplingParams
from engine.engine import LLMEngine
from engine.outputs import RequestOutput
from engine.setup import build_engine_parts


class LLM:
    """Load a model once, then generate for batches of prompts on the local engine.

    ``model`` is a built-in name (``builtin:tiny-llama``, ``builtin:tiny-moe``) or a local HF
    directory. Engine options are the fields of :class:`core.config.EngineConfig`.
    """

    def __init__(
        self,
        model: str,
        *,
        dtype: DType = "auto",
        max_model_len: int | None = None,
        seed: int = 0,
        block_size: int = 16,
        kv_cache_memory_bytes: int | None = None,
        max_num_batched_tokens: int = 2048,
        long_prefill_token_threshold: int | None = None,
        max_num_seqs: int = 64,
        enable_prefix_caching: bool = True,
        compile_model: bool = False,
        enforce_eager: bool = False,
        cuda_graph_batch_sizes: Sequence[int] | None = None,
    ) -> None:
        model_cfg = ModelConfig(name=model, dtype=dtype, seed=seed)
        engine_cfg = EngineConfig(
            max_model_len=max_model_len,
            block_size=block_size,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            max_num_batched_tokens=max_num_batched_tokens,
            long_prefill_token_threshold=long_prefill_token_threshold,
            max_num_seqs=max_num_seqs,
            enable_prefix_caching=enable_prefix_caching,
            compile_model=compile_model,
            enforce_eager=enforce_eager,
            cuda_graph_batch_sizes=(
                None if cuda_graph_batch_sizes is None else tuple(cuda_graph_batch_sizes)
            ),
        )
        self.engine = LLMEngine(build_engine_parts(model_cfg, engine_cfg))
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def generate(
        self,
        prompts: str | Sequence[str] | None = None,
        *,
        prompt_token_ids: Sequence[Sequence[int]] | None = None,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text or token ids); outputs in input order."""
        texts, token_lists = self._prompts(prompts, prompt_token_ids)
        params = _params_list(sampling_params, len(token_lists))
        request_ids = [f"offline-{next(self._ids)}" for _ in token_lists]
        requests = list(zip(request_ids, texts, token_lists, params, strict=True))
        for rid, _, ids, p in requests:  # refuse a bad batch before queueing any of it
            self.engine.check_request(rid, ids, p)
        try:
            for rid, text, ids, p in requests:
                self.engine.add_request(rid, ids, p, prompt=text)
            return self._run(request_ids)
        except BaseException:
            for rid in request_ids:  # NOTE: after a failure, none of the batch stays queued
                self.engine.abort(rid)
            raise

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        sampling_params: SamplingParams | None = None,
    ) -> RequestOutput:
        """Render ``messages`` with the model's chat template and generate one reply."""
        prompt = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True)
        ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        return self.generate(prompt_token_ids=[ids], sampling_params=sampling_params)[0]

    def _prompts(
        self,
        prompts: str | Sequence[str] | None,
        prompt_token_ids: Sequence[Sequence[int]] | None,
    ) -> tuple[list[str | None], list[list[int]]]:
        if (prompts is None) == (prompt_token_ids is None):
            raise InvalidRequestError(
                "pass exactly one of prompts or prompt_token_ids", param="prompts"
            )
        if prompt_token_ids is not None:
            return [None] * len(prompt_token_ids), [list(ids) for ids in prompt_token_ids]
        text_list = [prompts] if isinstance(prompts, str) else list(prompts or [])
        return list(text_list), [self.tokenizer.encode(text) for text in text_list]

    def _run(self, request_ids: list[str]) -> list[RequestOutput]:
        pending = set(request_ids)
        final: dict[str, RequestOutput] = {}
        while pending:
            for output in self.engine.step():
                if output.finished and output.request_id in pending:
                    final[output.request_id] = output
                    pending.discard(output.request_id)
        return [final[rid] for rid in request_ids]


def _params_list(
    sampling_params: SamplingParams | Sequence[SamplingParams] | None, count: int
) -> list[SamplingParams]:
    if sampling_params is None:
        return [SamplingParams()] * count
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * count
    if len(sampling_params) != count:
        raise InvalidRequestError(
            f"got {len(sampling_params)} sampling_params for {count} prompts",
            param="sampling_params",
        )
    return list(sampling_params)
