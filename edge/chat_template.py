"""Chat templates rendered with limits: a template comes with a model directory or a bundle, so it is data a
stranger wrote, and jinja runs it.

    text = render_chat_template(template, [{"role": "user", "content": "Hi"}], where="out/lm.json")

Rendered in jinja2's ImmutableSandboxedEnvironment (no attribute of Python internals, no mutation of the
arguments; as transformers renders them), and bounded:

- time: ``TIME_LIMIT_S`` of rendering, checked between the lines jinja's compiled template runs (a tracer on
  this thread), so nested loops over ``range(100000)`` stop within it;
- output: ``OUTPUT_LIMIT`` characters, counted as the template streams its output;
- single operations: ``*`` and ``**`` whose result would pass the output limit (``'a' * 3000000000``) and
  filters given a width or count past it (``center``, ``indent``, ``truncate`` ...) are refused before they run;
  memory the render grows by more than ``MEMORY_LIMIT`` bytes (resident, checked with the time) stops it.

A template over a limit, with a syntax error, or failing as it runs is a ``ChatTemplateError`` naming
``where`` (the file or field it came from), in one line.
"""

from __future__ import annotations

import resource
import sys
import time

__all__ = ["ChatTemplateError", "MEMORY_LIMIT", "OUTPUT_LIMIT", "TIME_LIMIT_S", "check_chat_template",
           "render_chat_template"]

TIME_LIMIT_S = 1.0
OUTPUT_LIMIT = 1 << 22  # 4 Mi characters: far past any prompt a context window holds
MEMORY_LIMIT = 512 << 20
SAMPLE_CONVERSATION = [{"role": "user", "content": "Hello!"}]  # what generate --chat renders: one user turn


class ChatTemplateError(ValueError):
    """A chat template that cannot be rendered within the limits; the message names where it came from."""


class _Limit(Exception):
    pass


def _one_line(text) -> str:
    return " ".join(str(text).split())[:200]


def _rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


class _Guard:
    """The time and memory limit: a trace function on this thread that looks at the clock every 256 lines."""

    def __init__(self):
        self.deadline = time.monotonic() + TIME_LIMIT_S
        self.rss0 = _rss_kib()
        self.lines = 0

    def check(self):
        if time.monotonic() > self.deadline:
            raise _Limit(f"rendering took longer than {TIME_LIMIT_S:g} s")
        if (_rss_kib() - self.rss0) * 1024 > MEMORY_LIMIT:
            raise _Limit(f"rendering grew the process by more than {MEMORY_LIMIT >> 20} MiB")

    def local(self, frame, event, arg):
        self.lines += 1
        if not self.lines & 255:
            self.check()
        return self.local

    def __call__(self, frame, event, arg):
        return self.local


def _size(x) -> int | None:
    return len(x) if isinstance(x, (str, bytes, list, tuple)) else None


def _guarded_filter(name, fn):
    def run(*args, **kwargs):
        for v in list(args[1:]) + list(kwargs.values()):  # a width, count or length argument
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) > OUTPUT_LIMIT:
                raise _Limit(f"filter {name!r} was given {v}, past the {OUTPUT_LIMIT}-character output limit")
        out = fn(*args, **kwargs)
        if (_size(out) or 0) > OUTPUT_LIMIT:
            raise _Limit(f"filter {name!r} made {len(out)} characters, past the {OUTPUT_LIMIT}-character limit")
        return out

    for attr in ("jinja_pass_arg",):  # jinja's pass_context / pass_environment marks
        if hasattr(fn, attr):
            setattr(run, attr, getattr(fn, attr))
    return run


def _raise_exception(message):
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


_ENV: dict = {}


def _environment():
    if not _ENV:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        class Bounded(ImmutableSandboxedEnvironment):
            intercepted_binops = frozenset(["*", "**", "+"])

            def call_binop(self, context, operator, left, right):
                if operator == "**" and isinstance(right, int) and isinstance(left, (int, float)) and \
                        abs(right) > 64 and abs(left) > 1:
                    raise _Limit(f"{left!r} ** {right!r} is past the template's number limit")
                if operator == "*":
                    for seq, n in ((left, right), (right, left)):
                        size = _size(seq)
                        if size is not None and isinstance(n, int) and size * n > OUTPUT_LIMIT:
                            raise _Limit(f"a {size}-long value times {n} is past the {OUTPUT_LIMIT}-character "
                                         "output limit")
                if operator == "+" and (_size(left) or 0) + (_size(right) or 0) > OUTPUT_LIMIT:
                    raise _Limit(f"joining values past the {OUTPUT_LIMIT}-character output limit")
                return super().call_binop(context, operator, left, right)

        env = Bounded(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_exception  # transformers' templates call it to refuse a conversation
        env.filters = {k: _guarded_filter(k, f) for k, f in env.filters.items()}
        _ENV["env"] = env
    return _ENV["env"]


def render_chat_template(template: str, messages: list, *, where: str, add_generation_prompt: bool = True,
                         **extra) -> str:
    """``template`` rendered for ``messages`` (transformers' variables: messages, add_generation_prompt,
    bos_token, eos_token, plus ``extra``) within the limits; ChatTemplateError naming ``where`` otherwise."""
    import jinja2

    if not isinstance(template, str) or not template.strip():
        raise ChatTemplateError(f"{where}: the chat template is empty or not text")
    if len(template) > OUTPUT_LIMIT:
        raise ChatTemplateError(f"{where}: the chat template is {len(template)} characters; at most {OUTPUT_LIMIT}")
    guard = _Guard()
    parts, total = [], 0
    previous = sys.gettrace()
    try:
        compiled = _environment().from_string(template)
        sys.settrace(guard)
        try:
            for chunk in compiled.generate(messages=messages, add_generation_prompt=add_generation_prompt,
                                           **{"bos_token": "", "eos_token": "", **extra}):
                total += len(chunk)
                if total > OUTPUT_LIMIT:
                    raise _Limit(f"the output passed {OUTPUT_LIMIT} characters")
                guard.check()
                parts.append(chunk)
        finally:
            sys.settrace(previous)
    except _Limit as e:
        raise ChatTemplateError(f"{where}: the chat template was stopped: {e}; it must render a conversation "
                                f"within {TIME_LIMIT_S:g} s and {OUTPUT_LIMIT} characters: fix the template") from None
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"{where}: jinja syntax error on line {e.lineno}: {_one_line(e.message)}: fix the "
                                "chat template") from None
    except (jinja2.TemplateError, ArithmeticError, LookupError, TypeError, ValueError, AttributeError,
            RecursionError, MemoryError) as e:
        raise ChatTemplateError(f"{where}: the chat template failed as it ran ({type(e).__name__}: "
                                f"{_one_line(e)}): fix the template") from None
    return "".join(parts)


def check_chat_template(template: str | None, *, where: str) -> None:
    """At conversion: the template renders a sample user turn with the generation prompt within the limits, as
    generate --chat will render it."""
    if template is None:
        return
    render_chat_template(template, SAMPLE_CONVERSATION, where=where)

