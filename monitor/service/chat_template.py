"""A model's own chat template, rendered as transformers' `apply_chat_template` renders it.

Hugging Face checkpoints (tokenizer_config.json's `chat_template`) and imported GGUF files
(`tokenizer.chat_template`) carry their prompt format as a Jinja template. It is the model's
file, not ours, so it runs in Jinja's immutable sandbox: no attribute of a Python object that
is not plain data, no mutation of what it is given. The environment is transformers' own:
`trim_blocks` and `lstrip_blocks`, the loop-controls extension, a `tojson` filter that keeps
non-ASCII text, and the `raise_exception` and `strftime_now` globals templates call.

A template that raises (its own `raise_exception("roles must alternate")`, a syntax error, an
undefined name used as a value) is a `ChatTemplateFailed` naming the message the client sent:
the endpoint answers 400, never 500.

Compiled templates are kept per template text (a handful of versions at most), so a request
renders, it does not compile.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

__all__ = ["ChatTemplateFailed", "render_template"]


class ChatTemplateFailed(ValueError):
    """The model's chat template cannot render these messages; `reason` is its own words."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"the model's chat template cannot render these messages: {reason}")


class _TemplateRaised(Exception):
    pass


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:  # fmt: skip
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compiled(template: str) -> Any:
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except TemplateError as exc:
        raise ChatTemplateFailed(f"the template does not compile: {exc}") from None


def render_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    special_tokens: Mapping[str, str],
    *,
    add_generation_prompt: bool = True,
) -> str:
    """The prompt text for `messages` ([{role, content}, ...]) under `template`."""
    from jinja2 import TemplateError
    from jinja2.exceptions import SecurityError

    compiled = _compiled(template)
    try:
        return str(
            compiled.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                **dict(special_tokens),
            )
        )
    except _TemplateRaised as exc:
        raise ChatTemplateFailed(str(exc)) from None
    except SecurityError as exc:
        raise ChatTemplateFailed(f"the sandbox refused: {exc}") from None
    except (TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
        raise ChatTemplateFailed(f"{type(exc).__name__}: {exc}") from None
