"""The ``engine.speculative`` section: which draft method guesses tokens, and how many.

Field names follow vLLM's ``speculative_config`` so a block written for vLLM reads the same
here. Three methods: ``ngram`` prompt lookup and ``suffix`` decoding (draft-free) and
``draft_model`` (a smaller model with the target's vocabulary, checked when the engine loads it).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from core.config.base import StrictModel

SpeculativeMethod = Literal["ngram", "suffix", "draft_model"]


class SpeculativeConfig(StrictModel):
    """Speculative decoding: draft a few tokens per running request, verify them in one step."""

    method: SpeculativeMethod = Field(
        ...,
        description="ngram: prompt lookup (the tokens that followed the latest earlier "
        "occurrence of the sequence's suffix); suffix: suffix decoding over the request and "
        "recent outputs; draft_model: a smaller model with the target's vocabulary, drafting "
        "greedily with its own KV.",
    )
    num_speculative_tokens: int = Field(
        ...,
        ge=1,
        le=64,
        description="Most draft tokens verified per request and step (k); a verify row "
        "computes k + 1 tokens and counts them all against max_num_batched_tokens.",
    )
    prompt_lookup_min: int = Field(
        2, ge=1, description="ngram: shortest suffix that must have occurred earlier."
    )
    prompt_lookup_max: int = Field(
        5, ge=1, description="ngram: longest suffix looked up (the longest match wins)."
    )
    suffix_decoding_max_tree_depth: int = Field(
        24, ge=2, description="suffix: deepest path of the suffix trees (tokens)."
    )
    suffix_decoding_max_cached_requests: int = Field(
        10000,
        ge=0,
        description="suffix: finished requests whose outputs stay in the shared tree (0: none).",
    )
    suffix_decoding_max_spec_factor: float = Field(
        1.0,
        gt=0.0,
        description="suffix: most draft tokens per matched prefix token (draft length "
        "<= factor * match length).",
    )
    suffix_decoding_min_token_prob: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="suffix: least estimated probability of a drafted token.",
    )
    model: str | None = Field(
        None, description="draft_model: the draft checkpoint (built-in name or HF dir)."
    )
    adaptive_draft_length: bool = Field(
        True,
        description="Each request drafts as many tokens as its last verification earned: one "
        "more than it accepted after a rejection, one more than before after a full "
        "acceptance (at most num_speculative_tokens). False: always num_speculative_tokens.",
    )
    pause_unprofitable_drafts: bool = Field(
        True,
        description="A request drafts only while its measured acceptance pays for what its "
        "verify row measurably costs at the current batch size (a least-squares fit of the "
        "engine's own decode step timings); otherwise it decodes plainly for a pause that "
        "doubles at each failed retry. False: every request always drafts.",
    )
    disable_by_batch_size: int | None = Field(
        None,
        ge=1,
        description="No request drafts while more than this many run (a busy replica is "
        "compute-bound, where verifying drafts costs more than it saves). None: always "
        "draft.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> SpeculativeConfig:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"prompt_lookup_min ({self.prompt_lookup_min}) must be <= prompt_lookup_max "
                f"({self.prompt_lookup_max})"
            )
        if self.method == "draft_model":
            if self.model is None:
                raise ValueError("method 'draft_model' needs model (the draft checkpoint)")
        elif self.model is not None:
            raise ValueError(f"model is only read by method 'draft_model', not {self.method!r}")
        return self
