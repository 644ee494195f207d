"""What one forward pass tells the attention layers: the contract between runner and backends.

A step runs a *flattened* batch: ``T`` new tokens from ``B`` sequences, laid out sequence after
sequence. Sequence ``i`` contributes ``query_lens[i]`` new tokens (a prefill chunk, or 1 for
decode) and, after the step, has ``seq_lens[i]`` tokens of context (cached prefix + new). New
tokens sit at the end of their context, so token ``j`` of sequence ``i`` is at absolute position
``seq_lens[i] - query_lens[i] + j`` and attends causally to context positions ``<=`` that.

The KV storage of one layer is the strided view ``kv[:, layer]`` of the block-major tensor (see
``core.kv_layout``): ``[num_blocks, 2, block_size, num_kv_heads, head_dim]``. ``slot_mapping``
gives, for each new token, the flat slot ``block_id * block_size + offset`` its K and V go to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.device_io import upload


@dataclass(frozen=True)
class AttentionMetadata:
    """Tensors (on the model's device) plus their Python mirrors for host-side loops."""

    query_start_loc: torch.Tensor  # [B + 1] int32, cumulative query_lens
    seq_lens: torch.Tensor  # [B] int32, context length after this step
    block_tables: torch.Tensor  # [B, max_blocks] int32, padded with 0
    slot_mapping: torch.Tensor  # [T] int64
    query_lens_list: tuple[int, ...]
    seq_lens_list: tuple[int, ...]
    block_size: int

    @property
    def num_seqs(self) -> int:
        """B."""
        return len(self.seq_lens_list)

    @property
    def num_tokens(self) -> int:
        """T."""
        return int(sum(self.query_lens_list))

    @property
    def max_query_len(self) -> int:
        """Longest new-token run in the batch."""
        return max(self.query_lens_list, default=0)

    @property
    def max_seq_len(self) -> int:
        """Longest context in the batch."""
        return max(self.seq_lens_list, default=0)

    @property
    def decode_only(self) -> bool:
        """True when every sequence has exactly one new token."""
        return self.max_query_len == 1

    @classmethod
    def build(
        cls,
        query_lens: Sequence[int],
        seq_lens: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        block_size: int,
        device: torch.device | str = "cpu",
    ) -> AttentionMetadata:
        """Build metadata from host lists; each block table must cover its ``seq_lens`` entry."""
        if not (len(query_lens) == len(seq_lens) == len(block_tables)):
            raise ValueError("query_lens, seq_lens and block_tables must have one entry per seq")
        slots: list[int] = []
        for q_len, s_len, table in zip(query_lens, seq_lens, block_tables, strict=True):
            if q_len > s_len or s_len > len(table) * block_size:
                raise ValueError(
                    f"sequence with {q_len} new / {s_len} total tokens does not fit "
                    f"{len(table)} blocks of {block_size}"
                )
            for pos in range(s_len - q_len, s_len):
                slots.append(table[pos // block_size] * block_size + pos % block_size)
        width = max((len(t) for t in block_tables), default=0)
        padded = [list(t) + [0] * (width - len(t)) for t in block_tables]
        starts = [0]
        for q_len in query_lens:
            starts.append(starts[-1] + q_len)
        device = torch.device(device)
        return cls(
            query_start_loc=upload(starts, torch.int32, device),
            seq_lens=upload(list(seq_lens), torch.int32, device),
            block_tables=upload(padded, torch.int32, device).reshape(len(padded), width),
            slot_mapping=upload(slots, torch.int64, device),
            query_lens_list=tuple(query_lens),
            seq_lens_list=tuple(seq_lens),
            block_size=block_size,
        )
