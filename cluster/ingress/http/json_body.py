"""Request bodies as JSON objects, refused with a 400 before anything deeper can choke on them.

``json.loads`` accepts what Python strings and the tokenizer cannot take: a lone UTF-16
surrogate (``"\\ud800"``) is a valid JSON escape but not encodable text, and nesting a few
thousand arrays deep makes every recursive consumer (pydantic, the chat template, logging)
raise ``RecursionError``. :func:`parse_json_object` walks the parsed value once, without
recursion, and names the field path of the first offending value.
"""

from __future__ import annotations

import json
from typing import Any

from core.errors import InvalidRequestError

MAX_JSON_DEPTH = 32
"""Deepest nesting of arrays and objects a request body may have (OpenAI bodies need ~6)."""


def parse_json_object(raw: bytes, *, max_depth: int = MAX_JSON_DEPTH) -> dict[str, Any]:
    """The request body as a JSON object; malformed JSON, a non-object, nesting deeper than
    ``max_depth`` or text that is not valid Unicode is a 400 naming the field."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise InvalidRequestError(
            f"the JSON body nests deeper than {max_depth} levels", param=None
        ) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidRequestError(f"malformed JSON body: {e}", param=None) from e
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object", param=None)
    check_json_value(body, max_depth)
    return body


def check_json_value(value: Any, max_depth: int) -> None:
    """Raise ``InvalidRequestError`` at the first value nested deeper than ``max_depth`` or the
    first string (key or value) holding a lone surrogate."""
    stack: list[tuple[Any, str, int]] = [(value, "", 1)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item, path)
            continue
        if not isinstance(item, dict | list):
            continue
        if depth > max_depth:
            raise InvalidRequestError(
                f"{path or 'body'}: the JSON body nests deeper than {max_depth} levels",
                param=path or None,
            )
        if isinstance(item, dict):
            for key, child in item.items():
                child_path = f"{path}.{key}" if path else str(key)
                _check_text(key, child_path)
                if isinstance(child, str | dict | list):
                    stack.append((child, child_path, depth + 1))
        else:
            stack.extend(
                (child, f"{path}[{index}]", depth + 1)
                for index, child in enumerate(item)
                if isinstance(child, str | dict | list)
            )


def _check_text(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRequestError(
            f"{path or 'body'}: the text holds an unpaired UTF-16 surrogate at character "
            f"{e.start}; send valid Unicode",
            param=path or None,
        ) from None
