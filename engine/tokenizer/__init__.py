"""Tokenization: HF ``tokenizers``, the checkpoint's chat template, streaming detokenization."""

from engine.tokenizer.chat_template import ChatTemplate, validate_messages
from engine.tokenizer.detokenizer import IncrementalDetokenizer
from engine.tokenizer.tokenizer import Tokenizer

__all__ = ["ChatTemplate", "IncrementalDetokenizer", "Tokenizer", "validate_messages"]
