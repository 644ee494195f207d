"""The offline, vLLM-style API: ``LLM(model=...).generate(prompts, sampling_params)``."""

from __future__ import annotations

import contextlib
import itertools
import logging
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, cast

from core.config import DType, EngineConfig, KVTiersConfig, ModelConfig, SpeculativeConfig
from core.config.files import validate_mapping
from core.errors import InvalidRequestError
from core.sampling import SamplingParams
from engine.engine_builder import build_engine
from engine.lora import LoRARequest
from engine.offline_batch import (
    PromptInput,
    PromptJob,
    gather,
    params_list,
    parse_prompts,
    plan_prompt,
    prompt_salts,
)
from engine.outputs import RequestOutput

logger = logging.getLogger(__name__)

Messages = Sequence[Mapping[str, Any]]
"""One conversation: OpenAI-style ``{"role": ..., "content": ...}`` messages."""


class LLM:
    """Load a model once, then generate for batches of prompts on the local engine.

    ``model`` is a built-in name (``builtin:tiny-llama``, ``builtin:tiny-moe``) or a local HF
    directory. Engine options are the fields of :class:`core.config.EngineConfig`.
    ``tensor_parallel_size=N`` splits the model over N ranks: this process is rank 0 and
    starts ranks 1..N-1 as local processes (one GPU each on CUDA), stopped by :meth:`shutdown`.
    ``speculative_config`` is vLLM's mapping (``{"method": "ngram", "num_speculative_tokens":
    4}``, the fields of :class:`core.config.SpeculativeConfig`); a bad one raises
    ``ConfigError`` naming every wrong field on one line.
    ``enable_lora=True`` (with ``max_loras``, ``max_lora_rank``, ``max_cpu_loras``) serves PEFT
    adapters: ``generate(..., lora_request=LoRARequest(name, int_id, path))``.
    ``generate`` and ``chat`` return vLLM-shaped :class:`RequestOutput` s, one per prompt, in
    input order: ``outs[0].outputs[0].text``.
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
        kv_tiers: KVTiersConfig | None = None,
        quantization: Literal["int8"] | None = None,
        kv_cache_dtype: Literal["auto", "fp8_e4m3", "int8"] = "auto",
        async_scheduling: Literal["auto", "on", "off"] = "auto",
        tensor_parallel_size: int = 1,
        speculative_config: Mapping[str, Any] | None = None,
        enable_lora: bool = False,
        max_loras: int = 1,
        max_lora_rank: int = 16,
        max_cpu_loras: int | None = None,
    ) -> None:
        speculative = None
        if speculative_config is not None:
            speculative = validate_mapping(
                SpeculativeConfig,
                speculative_config,
                kind="speculative_config",
                source="LLM(speculative_config=...)",
            )
        model_cfg = ModelConfig(name=model, dtype=dtype, seed=seed, quantization=quantization)
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
            kv_tiers=kv_tiers or KVTiersConfig(),
            kv_cache_dtype=kv_cache_dtype,
            async_scheduling=async_scheduling,
            tensor_parallel_size=tensor_parallel_size,
            speculative=speculative,
            enable_lora=enable_lora,
            max_loras=max_loras,
            max_lora_rank=max_lora_rank,
            max_cpu_loras=max_cpu_loras,
        )
        self.engine = build_engine(model_cfg, engine_cfg).engine
        # NOTE: a tensor-parallel engine's followers stop when the LLM is collected, too
        self._close = weakref.finalize(self, self.engine.close)
        if tensor_parallel_size == 1:
            self._close.detach()
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput] | None = None,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        prompt_token_ids: Sequence[Sequence[int]] | None = None,
        use_tqdm: bool = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text, ``{"prompt": text}``, ``{"prompt_token_ids": ids}``,
        either dict optionally with ``"cache_salt"``, or ids via ``prompt_token_ids``); one
        output per prompt with ``n`` sequences each.
        ``sampling_params`` is one for all prompts or one per prompt. ``use_tqdm`` shows a
        progress bar on stderr (when tqdm is installed). ``lora_request``: the LoRA adapter
        of every prompt, or one per prompt (None: the base model); needs ``enable_lora``."""
        texts, token_lists = parse_prompts(prompts, prompt_token_ids, self.tokenizer.encode)
        params = params_list(sampling_params, len(token_lists))
        salts = prompt_salts(prompts, len(token_lists))
        loras = _lora_list(lora_request, len(token_lists))
        jobs = [
            plan_prompt(f"offline-{next(self._ids)}", text, ids, p, salt)
            for text, ids, p, salt in zip(texts, token_lists, params, salts, strict=True)
        ]
        lora_of = {job.request_id: lora for job, lora in zip(jobs, loras, strict=True)}
        sequences = [(job, seq) for job in jobs for seq in job.sequences]
        for job, seq in sequences:  # refuse a bad batch before queueing any of it
            self.engine.check_request(seq.request_id, job.prompt_token_ids, seq.params)
        for lora in dict.fromkeys(lora for lora in loras if lora is not None):
            self.engine.add_lora(lora)
        try:
            for job, seq in sequences:
                self.engine.add_request(
                    seq.request_id,
                    job.prompt_token_ids,
                    seq.params,
                    prompt=job.prompt,
                    cache_salt=job.cache_salt,
                    lora_request=lora_of[job.request_id],
                )
            return self._run(jobs, use_tqdm)
        except BaseException:
            for _, seq in sequences:  # NOTE: after a failure, none of the batch stays queued
                self.engine.abort(seq.request_id)
            raise

    def chat(
        self,
        messages: Messages | Sequence[Messages],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Render each conversation (one, or a list of them) with the model's chat template and
        generate its reply; one output per conversation (``lora_request`` as in
        :meth:`generate`)."""
        conversations = _conversations(messages)
        token_lists = []
        for conversation in conversations:
            prompt = self.tokenizer.apply_chat_template(
                list(conversation), add_generation_prompt=True
            )
            token_lists.append(self.tokenizer.encode(prompt, add_special_tokens=False))
        return self.generate(
            prompt_token_ids=token_lists,
            sampling_params=sampling_params,
            use_tqdm=use_tqdm,
            lora_request=lora_request,
        )

    def shutdown(self) -> None:
        """Stop the tensor-parallel followers (their processes exit) and release the engine;
        idempotent. Also runs when the ``LLM`` is garbage-collected or used as a context
        manager; without tensor parallelism it only releases the engine."""
        if self._close.alive:
            self._close()
        else:
            self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _run(self, jobs: list[PromptJob], use_tqdm: bool) -> list[RequestOutput]:
        owner = {seq.request_id: job for job in jobs for seq in job.sequences}
        left = {job.request_id: len(job.sequences) for job in jobs}
        finals: dict[str, RequestOutput] = {}
        with _progress(len(jobs), use_tqdm) as advance:
            while owner:
                for output in self.engine.step():
                    job = owner.pop(output.request_id, None) if output.finished else None
                    if job is None:
                        continue
                    finals[output.request_id] = output
                    left[job.request_id] -= 1
                    if left[job.request_id] == 0:
                        advance()
        return [gather(job, finals) for job in jobs]


def _lora_list(
    lora_request: LoRARequest | Sequence[LoRARequest | None] | None, num_prompts: int
) -> list[LoRARequest | None]:
    """One adapter (or None) per prompt from one for all or a list of them."""
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * num_prompts
    loras = list(lora_request)
    if len(loras) != num_prompts:
        raise InvalidRequestError(
            f"lora_request has {len(loras)} entries for {num_prompts} prompts",
            param="lora_request",
        )
    return loras


def _conversations(messages: Messages | Sequence[Messages]) -> list[Messages]:
    """A single conversation (a list of message dicts) or a list of conversations."""
    items = list(messages)
    if not items or isinstance(items[0], Mapping):
        return [cast(Messages, items)]
    return [cast(Messages, conversation) for conversation in items]


@contextlib.contextmanager
def _progress(total: int, enabled: bool) -> Iterator[Callable[[], None]]:
    """Yields "one more prompt done"; a tqdm bar on stderr when enabled and tqdm is installed."""
    if not enabled:
        yield lambda: None
        return
    try:
        from tqdm import tqdm
    except ImportError:
        logger.debug("tqdm is not installed; no progress bar")
        yield lambda: None
        return
    bar = tqdm(total=total, desc="Processed prompts", unit="prompt", dynamic_ncols=True)
    try:
        yield lambda: bar.update(1)
    finally:
        bar.close()
