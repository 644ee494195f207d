"""Chat templates: rendering, message validation, and the sandbox."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.errors import ConfigError, InvalidRequestError
from engine.tokenizer import ChatTemplate, Tokenizer, validate_messages

TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}


def test_builtin_chatml_rendering(tokenizer: Tokenizer) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    expected = (
        "<|begin_of_text|>"
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
    )
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=False) == expected
    with_prompt = tokenizer.apply_chat_template(messages)
    assert with_prompt == expected + "<|im_start|>assistant\n"
    ids = tokenizer.encode(with_prompt, add_special_tokens=False)
    assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 1
    assert ids[-len("assistant\n") - 1] == tokenizer.backend.token_to_id("<|im_start|>")


def test_builtin_template_refuses_unknown_role(tokenizer: Tokenizer) -> None:
    with pytest.raises(InvalidRequestError, match="unknown role: wizard") as err:
        tokenizer.apply_chat_template([{"role": "wizard", "content": "x"}])
    assert err.value.param == "messages"


def test_hf_environment_features() -> None:
    source = (
        "{% for m in messages %}\n"
        "  {% if m.role == 'skip' %}{% continue %}{% endif %}\n"
        "  [{{ m.role }}] {{ m.content }}{{ eos_token }}\n"
        "{% endfor %}\n"
        "{{ {'k': 'ü'} | tojson }}{{ extra_flag }}"
    )
    template = ChatTemplate(source, TOKENS)
    rendered = template.render(
        [{"role": "user", "content": "a"}, {"role": "skip", "content": "b"}],
        template_kwargs={"extra_flag": "!"},
    )
    # trim_blocks/lstrip_blocks: block tags leave no whitespace; tojson keeps non-ASCII.
    assert rendered == '  [user] a</s>\n{"k": "ü"}!'


def test_absent_special_tokens_render_empty() -> None:
    template = ChatTemplate("[{{ bos_token }}]{{ messages[0].content }}", {"bos_token": None})
    assert template.render([{"role": "user", "content": "x"}]) == "[]x"


def test_content_parts_are_flattened() -> None:
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
        },
        {"role": "assistant", "content": None, "tool_calls": []},
    ]
    cleaned = validate_messages(messages)
    assert cleaned[0]["content"] == "one\ntwo"
    assert cleaned[1] == {"role": "assistant", "content": "", "tool_calls": []}


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([], "messages"),
        ("hello", "messages"),
        (["hello"], "messages[0]"),
        ([{"content": "x"}], "messages[0].role"),
        ([{"role": "user", "content": "x"}, {"role": "", "content": "y"}], "messages[1].role"),
        ([{"role": "user", "content": 3}], "messages[0].content"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content[0].type"),
        (
            [{"role": "user", "content": [{"type": "text", "text": 1}]}],
            "messages[0].content[0].text",
        ),
    ],
)
def test_bad_messages_name_the_field(messages: object, param: str) -> None:
    template = ChatTemplate("{{ messages[0].content }}", TOKENS)
    with pytest.raises(InvalidRequestError) as err:
        template.render(messages)  # type: ignore[arg-type]
    assert err.value.param == param
    assert param.removesuffix(".type") in err.value.message


@pytest.mark.parametrize(
    "source",
    [
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.append({'role': 'system', 'content': 'injected'}) }}",
        "{% set d = {} %}{{ d.update({'a': 1}) }}",
        "{{ raise_exception.__globals__ }}",
    ],
)
def test_sandbox_escapes_are_refused(source: str) -> None:
    template = ChatTemplate(source, TOKENS)
    with pytest.raises(ConfigError, match="unsafe") as err:
        template.render([{"role": "user", "content": "hi"}])
    assert err.value.param == "chat_template"


def test_syntax_error_is_config_error() -> None:
    with pytest.raises(ConfigError, match="syntax error") as err:
        ChatTemplate("{% for m in messages %}{{ m.content }", TOKENS)
    assert err.value.param == "chat_template"


def test_template_type_error_is_invalid_request() -> None:
    template = ChatTemplate("{{ messages[0].content + 1 }}", TOKENS)
    with pytest.raises(InvalidRequestError) as err:
        template.render([{"role": "user", "content": "hi"}])
    assert err.value.param == "messages"


def _tokenizer_dir_with(tiny_model_dir: Path, tmp_path: Path, **config: object) -> Path:
    directory = tmp_path / "tok"
    directory.mkdir()
    (directory / "tokenizer.json").write_text((tiny_model_dir / "tokenizer.json").read_text())
    body = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    body.update(config)
    (directory / "tokenizer_config.json").write_text(json.dumps(body))
    return directory


def test_template_sources(tiny_model_dir: Path, tmp_path: Path) -> None:
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    directory = _tokenizer_dir_with(tiny_model_dir, tmp_path, chat_template=named)
    message = [{"role": "user", "content": "x"}]
    assert Tokenizer.from_dir(directory).apply_chat_template(message) == "D"
    (directory / "chat_template.jinja").write_text("J{{ messages | length }}")
    assert Tokenizer.from_dir(directory).apply_chat_template(message) == "J1"


def test_no_template_is_invalid_request(tiny_model_dir: Path, tmp_path: Path) -> None:
    directory = _tokenizer_dir_with(tiny_model_dir, tmp_path, chat_template=None)
    tokenizer = Tokenizer.from_dir(directory)
    assert not tokenizer.has_chat_template
    with pytest.raises(InvalidRequestError, match="no chat template"):
        tokenizer.apply_chat_template([{"role": "user", "content": "x"}])
