"""The expert placement plan: which global experts live on which expert-parallel rank.

Every expert has exactly one *primary* rank; a rank may also hold *redundant* copies of hot
experts owned elsewhere. A plan validates itself at construction (:class:`ConfigError` naming
the offending field) and is plain data (tuples of ints), so every rank of a gang can build the
same plan from config and check, via :meth:`ExpertPlacement.fingerprint`, that they agree.

Which copy a token goes to is decided by :meth:`ExpertPlacement.replica_table`: a rank holding
the expert keeps the row local (no bytes on the wire); otherwise copies are taken round-robin
by token index, offset by the sender's rank, so the load of a hot expert spreads over its copies.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from core.errors import ConfigError


@dataclass(frozen=True)
class ExpertPlacement:
    """``primary[r]``: experts rank ``r`` owns; ``redundant[r]``: extra copies it also holds."""

    num_experts: int
    primary: tuple[tuple[int, ...], ...]
    redundant: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "primary", tuple(tuple(ids) for ids in self.primary))
        redundant = self.redundant or tuple(() for _ in self.primary)
        object.__setattr__(self, "redundant", tuple(tuple(ids) for ids in redundant))
        self._validate()

    @classmethod
    def contiguous(
        cls,
        num_experts: int,
        num_ranks: int,
        redundant: Mapping[int, Sequence[int]] | None = None,
    ) -> ExpertPlacement:
        """Rank ``r`` owns a contiguous slice of ``num_experts / num_ranks`` experts (the first
        ``num_experts % num_ranks`` ranks one more); ``redundant`` maps an expert id to the
        extra ranks holding a copy of it."""
        if num_ranks < 1:
            raise ConfigError(f"expert_parallel must be >= 1, got {num_ranks}", param="ranks")
        base, extra = divmod(num_experts, num_ranks)
        primary, start = [], 0
        for rank in range(num_ranks):
            size = base + (1 if rank < extra else 0)
            primary.append(tuple(range(start, start + size)))
            start += size
        copies: list[list[int]] = [[] for _ in range(num_ranks)]
        for expert_id, ranks in sorted((redundant or {}).items()):
            for rank in ranks:
                if not 0 <= rank < num_ranks:
                    raise ConfigError(
                        f"redundant copy of expert {expert_id} on rank {rank}, outside "
                        f"0..{num_ranks - 1}",
                        param="redundant",
                    )
                copies[rank].append(expert_id)
        return cls(num_experts, tuple(primary), tuple(tuple(c) for c in copies))

    @property
    def num_ranks(self) -> int:
        """The expert-parallel world size."""
        return len(self.primary)

    def experts_of(self, rank: int) -> tuple[int, ...]:
        """Every expert rank ``rank`` holds (primary and redundant), sorted: what it loads."""
        self._check_rank(rank)
        return tuple(sorted(self.primary[rank] + self.redundant[rank]))

    def holders_of(self, expert_id: int) -> tuple[int, ...]:
        """The ranks holding ``expert_id``: its primary rank first, then the copies in order."""
        _check_ids([expert_id], self.num_experts)
        owner = next(r for r, ids in enumerate(self.primary) if expert_id in ids)
        copies = [r for r, ids in enumerate(self.redundant) if expert_id in ids]
        return (owner, *copies)

    def replica_table(self, rank: int) -> tuple[tuple[int, ...], ...]:
        """For a sender ``rank``, per expert the ranks its rows may go to, in pick order.

        ``(rank,)`` where the sender holds the expert (rows stay local); otherwise the holders
        rotated by ``rank`` so different senders start at different copies. Token ``t``'s row
        for expert ``e`` goes to ``table[e][t % len(table[e])]``.
        """
        self._check_rank(rank)
        table: list[tuple[int, ...]] = []
        for expert_id in range(self.num_experts):
            holders = self.holders_of(expert_id)
            if rank in holders:
                table.append((rank,))
            else:
                shift = rank % len(holders)
                table.append(holders[shift:] + holders[:shift])
        return tuple(table)

    def expected_load(self, tokens_per_expert: Sequence[int]) -> list[float]:
        """Per rank, the tokens it would compute if each expert's ``tokens_per_expert`` were
        spread evenly over the expert's holders."""
        self._check_load(tokens_per_expert)
        load = [0.0] * self.num_ranks
        for expert_id, tokens in enumerate(tokens_per_expert):
            holders = self.holders_of(expert_id)
            for rank in holders:
                load[rank] += tokens / len(holders)
        return load

    def with_hot_copies(self, tokens_per_expert: Sequence[int], num_copies: int) -> ExpertPlacement:
        """A new plan adding one copy of each of the ``num_copies`` hottest experts (by
        ``tokens_per_expert``, e.g. from load statistics), each on the rank with the least
        :meth:`expected_load` that does not hold it yet."""
        self._check_load(tokens_per_expert)
        plan = self
        hottest = sorted(range(self.num_experts), key=lambda e: (-tokens_per_expert[e], e))
        for expert_id in hottest[:num_copies]:
            load = plan.expected_load(tokens_per_expert)
            candidates = [r for r in range(self.num_ranks) if expert_id not in plan.experts_of(r)]
            if not candidates:
                continue
            rank = min(candidates, key=lambda r: (load[r], r))
            copies = [list(ids) for ids in plan.redundant]
            copies[rank].append(expert_id)
            plan = ExpertPlacement(self.num_experts, self.primary, tuple(map(tuple, copies)))
        return plan

    def to_json(self) -> str:
        """Canonical JSON (what :meth:`fingerprint` hashes; :meth:`from_json` reads it back)."""
        body = {
            "num_experts": self.num_experts,
            "primary": [list(ids) for ids in self.primary],
            "redundant": [list(ids) for ids in self.redundant],
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ExpertPlacement:
        """Parse :meth:`to_json` output; malformed input raises :class:`ConfigError`."""
        try:
            body = json.loads(text)
            return cls(
                int(body["num_experts"]),
                tuple(tuple(int(e) for e in ids) for ids in body["primary"]),
                tuple(tuple(int(e) for e in ids) for ids in body["redundant"]),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"malformed expert placement: {e!r}", param="placement") from e

    def fingerprint(self) -> int:
        """A 62-bit digest of the plan; ranks compare it before their first step."""
        digest = hashlib.blake2b(self.to_json().encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") >> 2

    def _check_load(self, tokens_per_expert: Sequence[int]) -> None:
        if len(tokens_per_expert) != self.num_experts:
            raise ConfigError(
                f"got load for {len(tokens_per_expert)} experts, the plan has {self.num_experts}",
                param="tokens_per_expert",
            )

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.num_ranks:
            raise ConfigError(f"rank {rank} outside 0..{self.num_ranks - 1}", param="rank")

    def _validate(self) -> None:
        if self.num_experts < 1 or not self.primary:
            raise ConfigError(
                f"a placement needs >= 1 expert and >= 1 rank, got {self.num_experts} experts "
                f"on {len(self.primary)} ranks",
                param="num_experts",
            )
        if len(self.redundant) != len(self.primary):
            raise ConfigError(
                f"redundant lists {len(self.redundant)} ranks, primary {len(self.primary)}",
                param="redundant",
            )
        owned = [e for ids in self.primary for e in ids]
        _check_ids(owned + [e for ids in self.redundant for e in ids], self.num_experts)
        if sorted(owned) != list(range(self.num_experts)):
            missing = sorted(set(range(self.num_experts)) - set(owned))
            twice = sorted({e for e in owned if owned.count(e) > 1})
            raise ConfigError(
                f"every expert must have exactly one primary rank: missing {missing}, "
                f"on several ranks {twice}",
                param="primary",
            )
        for rank, (mine, copies) in enumerate(zip(self.primary, self.redundant, strict=True)):
            if not mine:
                raise ConfigError(f"rank {rank} owns no expert", param="primary")
            if len(set(copies)) != len(copies) or set(copies) & set(mine):
                raise ConfigError(
                    f"rank {rank} holds an expert twice (primary {list(mine)}, "
                    f"redundant {list(copies)})",
                    param="redundant",
                )


def _check_ids(expert_ids: Sequence[int], num_experts: int) -> None:
    bad = sorted({e for e in expert_ids if not 0 <= e < num_experts})
    if bad:
        raise ConfigError(f"expert ids {bad} outside 0..{num_experts - 1}", param="expert_ids")
