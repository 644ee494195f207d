"""The built-in models' byte-level tokenizer: ``tokenizer.json`` plus its config files.

Every byte is one token (id == byte value, 0..255) through the GPT-2 byte-to-character map, with
no merges, so any text round-trips and multi-byte UTF-8 characters span several tokens (which is
what the incremental detokenizer must cope with). Named special tokens follow at 256, then
reserved special tokens pad the vocabulary to the model's ``vocab_size`` so every id the model
can emit is a real token. The chat template is ChatML with a leading BOS.
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

NUM_BYTE_TOKENS = 256
BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"
IM_START_TOKEN = "<|im_start|>"
IM_END_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|pad|>"
NAMED_SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, IM_START_TOKEN, IM_END_TOKEN, PAD_TOKEN)

BOS_TOKEN_ID = NUM_BYTE_TOKENS + NAMED_SPECIAL_TOKENS.index(BOS_TOKEN)
EOS_TOKEN_ID = NUM_BYTE_TOKENS + NAMED_SPECIAL_TOKENS.index(EOS_TOKEN)
IM_END_TOKEN_ID = NUM_BYTE_TOKENS + NAMED_SPECIAL_TOKENS.index(IM_END_TOKEN)
PAD_TOKEN_ID = NUM_BYTE_TOKENS + NAMED_SPECIAL_TOKENS.index(PAD_TOKEN)
# Generation stops at either the plain end of text or the end of an assistant turn.
GENERATION_EOS_TOKEN_IDS = (EOS_TOKEN_ID, IM_END_TOKEN_ID)

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown role: ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def byte_to_char_map() -> dict[int, str]:
    """The GPT-2 byte-level alphabet: printable bytes stand for themselves, the rest shift up.

    This is the table the ``tokenizers`` ByteLevel pre-tokenizer and decoder use, so a vocabulary
    keyed by these characters gives byte ``b`` the token ``byte_to_char_map()[b]``.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    mapping = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(NUM_BYTE_TOKENS):
        if b not in mapping:
            mapping[b] = chr(NUM_BYTE_TOKENS + shifted)
            shifted += 1
    return mapping


def special_tokens(vocab_size: int) -> list[str]:
    """All special tokens in id order, starting at id 256, padding the vocabulary to size."""
    num_reserved = vocab_size - NUM_BYTE_TOKENS - len(NAMED_SPECIAL_TOKENS)
    if num_reserved < 0:
        raise ValueError(f"vocab_size {vocab_size} is too small for the byte tokenizer")
    reserved = [f"<|reserved_special_token_{i}|>" for i in range(num_reserved)]
    return [*NAMED_SPECIAL_TOKENS, *reserved]


def build_tokenizer(vocab_size: int) -> Tokenizer:
    """A byte-level BPE tokenizer (no merges) with ``vocab_size`` tokens; encoding adds BOS."""
    vocab = {char: byte for byte, char in byte_to_char_map().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in special_tokens(vocab_size)]
    )
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, BOS_TOKEN_ID)],
    )
    return tokenizer


def tokenizer_config() -> dict[str, Any]:
    """The ``tokenizer_config.json`` body (HF keys)."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 65536,
        "chat_template": CHAT_TEMPLATE,
    }


def generation_config() -> dict[str, Any]:
    """The ``generation_config.json`` body: which ids start and end a generation."""
    return {
        "bos_token_id": BOS_TOKEN_ID,
        "eos_token_id": list(GENERATION_EOS_TOKEN_IDS),
        "pad_token_id": PAD_TOKEN_ID,
    }
