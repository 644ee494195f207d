"""Tokenizer-only GGUF files for the load-test tests, written with ``gguf``'s own writer."""

from __future__ import annotations

from pathlib import Path


def write_gguf_tokenizer(
    path: Path,
    model: str,
    tokens: list[str],
    token_types: list[int],
    *,
    merges: list[str] | None = None,
    scores: list[float] | None = None,
    pre: str | None = None,
    bos_token_id: int | None = None,
) -> Path:
    """A GGUF file holding only tokenizer metadata (no tensors), written by ``gguf``'s writer."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model(model)
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    if merges is not None:
        writer.add_token_merges(merges)
    if scores is not None:
        writer.add_token_scores(scores)
    if bos_token_id is not None:
        writer.add_bos_token_id(bos_token_id)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
