"""The prompts the tensor-parallel tests decode, in one process and in each rank of a real gang
(``tp_worker``), and how many tokens each decodes."""

from __future__ import annotations

PROMPTS = [[3, 17, 29, 44, 5, 61, 7], [9, 2, 33, 14], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49]]
NEW_TOKENS = 6
