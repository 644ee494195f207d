"""The speculative-decoding benchmark's workloads: prompts with an answer a model would give.

Two workloads, as issue 42 names them. ``repetitive``: answers that reuse their prompt (edit
this code, repeat this list with one change, quote the passage), where drafting from the
request's own text should pay. ``chat``: open questions whose answers are new prose, where
speculation must at least not slow decoding down.

Each case is text (a user message for the real model, SmolLM2-135M-Instruct) with a reference
answer: what the offline acceptance simulator (``benchmarks/spec_acceptance.py``) replays and
what a model asked the question would roughly say. ``tokenized_cases`` turns them into token
ids with any tokenizer; ``byte_token_cases`` uses the byte-level vocabulary of the tiny
built-in models (token id = UTF-8 byte). Pure data and builders: nothing here runs a model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

Workload = Literal["repetitive", "chat"]
WORKLOADS: tuple[Workload, ...] = ("repetitive", "chat")


@dataclass(frozen=True)
class SpecCase:
    """One prompt of a workload (a user message) and the answer it calls for."""

    workload: Workload
    name: str
    prompt: str
    reference: str


@dataclass(frozen=True)
class TokenCase:
    """A case as token ids: the prompt, then the reference answer a replay emits."""

    name: str
    prompt_token_ids: tuple[int, ...]
    reference_token_ids: tuple[int, ...]


_CODE = """def mean(values):
    total = 0
    for value in values:
        total += value
    return total / len(values)


def spread(values):
    low = min(values)
    high = max(values)
    return high - low
"""

_CODE_RENAMED = _CODE.replace("values", "samples").replace("value", "sample")

_CONFIG = """[server]
host = "0.0.0.0"
port = 8080
workers = 4
timeout_s = 30

[cache]
enabled = true
max_entries = 1024
ttl_s = 600
"""

_SHOPPING = [
    "two loaves of rye bread",
    "a dozen eggs",
    "one litre of oat milk",
    "three red onions",
    "a jar of honey",
    "half a kilo of carrots",
    "a bag of basmati rice",
    "four lemons",
    "a block of cheddar",
    "fresh basil",
]

_PASSAGE = (
    "The lighthouse keeper climbed the one hundred and twelve steps every evening at dusk. "
    "He trimmed the wick, polished the great lens until it threw no smudge onto the water, "
    "and wrote the state of the sea in a ledger that nobody had asked to read in forty years. "
    "When the automatic lamp finally arrived, he kept climbing the steps anyway, because the "
    "stairs, he said, did not know they had been replaced."
)

_PLANETS = ["Mercury", "Venus", "Earth", "Mars", "Jupiter", "Saturn", "Uranus", "Neptune"]


def _numbered(items: Sequence[str]) -> str:
    return "".join(f"{index}. {item}\n" for index, item in enumerate(items, start=1))


_REPETITIVE: tuple[SpecCase, ...] = (
    SpecCase(
        workload="repetitive",
        name="rename_variable",
        prompt="Rename the variable `values` to `samples` (and `value` to `sample`) in this "
        f"code. Reply with the whole file.\n\n{_CODE}",
        reference=_CODE_RENAMED,
    ),
    SpecCase(
        workload="repetitive",
        name="change_config_value",
        prompt="Set the number of workers to 8 in this config and show the full file.\n\n"
        + _CONFIG,
        reference=_CONFIG.replace("workers = 4", "workers = 8"),
    ),
    SpecCase(
        workload="repetitive",
        name="list_one_change",
        prompt="Repeat this shopping list exactly, but replace the lemons with limes.\n\n"
        + _numbered(_SHOPPING),
        reference=_numbered([item.replace("lemons", "limes") for item in _SHOPPING]),
    ),
    SpecCase(
        workload="repetitive",
        name="list_append",
        prompt="Here are the planets in order. Write the list again and add Pluto at the end "
        "as a dwarf planet.\n\n" + _numbered(_PLANETS),
        reference=_numbered([*_PLANETS, "Pluto (a dwarf planet)"]),
    ),
    SpecCase(
        workload="repetitive",
        name="quote_passage",
        prompt=f"Quote the following passage word for word, in quotation marks.\n\n{_PASSAGE}",
        reference=f'"{_PASSAGE}"',
    ),
    SpecCase(
        workload="repetitive",
        name="add_docstring",
        prompt=f"Add a one-line docstring to each function. Return the full code.\n\n{_CODE}",
        reference=_CODE.replace(
            "def mean(values):\n", 'def mean(values):\n    """The arithmetic mean."""\n'
        ).replace(
            "def spread(values):\n",
            'def spread(values):\n    """The distance from the smallest to the largest."""\n',
        ),
    ),
)

_CHAT: tuple[SpecCase, ...] = (
    SpecCase(
        workload="chat",
        name="why_sky_blue",
        prompt="Why is the sky blue during the day but red at sunset?",
        reference="Sunlight holds every colour, and air molecules scatter short blue waves far "
        "more than long red ones. At midday the light crosses little air, so scattered blue "
        "reaches you from all directions. At sunset it travels a long slant path, most of the "
        "blue is scattered away before it arrives, and the reds and oranges are what is left.",
    ),
    SpecCase(
        workload="chat",
        name="learn_language",
        prompt="What is a good way to start learning a new language as an adult?",
        reference="Start small and daily: twenty minutes of listening and speaking beats a long "
        "weekly session. Learn the few hundred most common words first, in short phrases you "
        "would actually say. Find a patient partner or tutor early, accept sounding clumsy, and "
        "mix in material you enjoy, such as podcasts, songs or simple novels.",
    ),
    SpecCase(
        workload="chat",
        name="bread_rise",
        prompt="My homemade bread came out dense. What might have gone wrong?",
        reference="Dense bread usually means the dough did not trap enough gas. The yeast may "
        "have been old or killed by water that was too hot, the dough may not have been kneaded "
        "long enough to build gluten, or it was baked before it had doubled. Too much flour or "
        "a cold kitchen can also slow the rise.",
    ),
    SpecCase(
        workload="chat",
        name="tides",
        prompt="Explain tides to a ten-year-old.",
        reference="The Moon pulls on everything on Earth, including the oceans. The water on "
        "the side facing the Moon bulges toward it, and there is a second bulge on the far side. "
        "As Earth spins, your beach moves through those bulges, so the sea rises and falls about "
        "twice a day.",
    ),
    SpecCase(
        workload="chat",
        name="remote_work",
        prompt="What are the pros and cons of working from home?",
        reference="Working from home saves commuting time, gives more control over your day and "
        "can make deep focus easier. On the other hand, it blurs the line between work and rest, "
        "makes casual help from colleagues rarer, and can feel lonely. Clear hours, a separate "
        "corner for work and regular calls help balance it.",
    ),
    SpecCase(
        workload="chat",
        name="name_a_cat",
        prompt="Suggest a few names for a grey kitten and say why.",
        reference="Ash, for the colour of its fur; Pebble, because it is small and round; Misty, "
        "for a soft grey morning; and Pixel, if you like something playful and modern. Watch "
        "the kitten for a day or two, since its character may pick the name for you.",
    ),
)


def text_cases(workload: Workload) -> tuple[SpecCase, ...]:
    """The cases of one workload, as text."""
    return _REPETITIVE if workload == "repetitive" else _CHAT


def tokenized_cases(
    workload: Workload, encode: Callable[[str], Sequence[int]]
) -> tuple[TokenCase, ...]:
    """The cases of one workload as token ids, each text encoded with ``encode``."""
    return tuple(
        TokenCase(
            name=case.name,
            prompt_token_ids=tuple(encode(case.prompt)),
            reference_token_ids=tuple(encode(case.reference)),
        )
        for case in text_cases(workload)
    )


def byte_token_cases(workload: Workload) -> tuple[TokenCase, ...]:
    """The cases as the tiny built-in models' token ids: one id per UTF-8 byte."""
    return tokenized_cases(workload, _utf8_bytes)


def _utf8_bytes(text: str) -> list[int]:
    return list(text.encode("utf-8"))
