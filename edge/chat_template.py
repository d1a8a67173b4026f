"""Chat templates rendered with limits: a template comes with a model directory or a bundle, so it is data a
stranger wrote, and jinja runs it.

    text = render_chat_template(template, [{"role": "user", "content": "Hi"}], where="out/lm.json")

Rendered in jinja2's ImmutableSandboxedEnvironment (no attribute of Python internals, no mutation of the
arguments; as transformers renders them), and bounded:

- time: ``TIME_LIMIT_S`` of rendering, checked between the lines jinja's compiled template runs (a tracer on
  this thread), so nested loops over ``range(100000)`` stop within it;
- output: ``OUTPUT_LIMIT`` characters, counted as the template streams its output;
- single operations: everything that builds a string or a list in one step, in C where no tracer sees it, is
  sized before it runs and refused past the output limit: ``*`` (``'a' * 3000000000``), ``+``, ``~`` (compiled
  to a checked call rather than jinja's plain str_join), ``%`` and ``str.format`` (their widths and arguments),
  printing a list or dict (its repr), the filters ``join``, ``format``, ``replace``, ``indent``, ``wordwrap``,
  ``tojson``, ``sum`` ..., any filter given a width or count past the limit (``center``, ``truncate`` ...), and the
  str methods ``join``, ``replace``, ``ljust`` / ``rjust`` / ``center`` / ``zfill``, ``expandtabs``, ``translate``;
- memory: the resident size now (``/proc/self/statm``, not the peak a loaded model once set) growing by more
  than ``MEMORY_LIMIT`` bytes since the render began stops it (checked with the time).

A template over a limit, with a syntax error, or failing as it runs is a ``ChatTemplateError`` naming
``where`` (the file or field it came from), in one line.
"""

from __future__ import annotations

import os
import re
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


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss_bytes() -> int:
    """The process's resident memory now (not its peak: a process that once held a bigger model would hide a
    template's growth up to that peak)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read(256).split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):  # no /proc (macOS): the peak, the best the platform tells
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


class _Guard:
    """The time and memory limit: a trace function on this thread that looks at the clock every 256 lines."""

    def __init__(self):
        self.deadline = time.monotonic() + TIME_LIMIT_S
        self.rss0 = _rss_bytes()
        self.lines = 0

    def check(self):
        if time.monotonic() > self.deadline:
            raise _Limit(f"rendering took longer than {TIME_LIMIT_S:g} s")
        if _rss_bytes() - self.rss0 > MEMORY_LIMIT:
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


def _text_size(value, strings: int = 1) -> int:
    """An upper bound on the characters ``str(value)`` (``strings`` = 1), or its repr / JSON inside a container
    (``strings`` = 12: an escaped character is at most 12), makes; counted only until it passes OUTPUT_LIMIT, so a
    list holding one long string a thousand times costs a step per item until then."""
    from jinja2.utils import Namespace

    total, stack = 0, [(value, strings)]
    while stack and total <= OUTPUT_LIMIT:
        v, per_char = stack.pop()
        if isinstance(v, str):
            total += len(v) if per_char == 1 else per_char * len(v) + 2
        elif isinstance(v, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(v)
            stack.extend((x, 12) for x in v)
        elif isinstance(v, dict):
            total += 2 + 4 * len(v)
            stack.extend((x, 12) for kv in v.items() for x in kv)
        elif isinstance(v, Namespace):
            stack.append((object.__getattribute__(v, "_Namespace__attrs"), 12))
            total += 16
        elif isinstance(v, bool) or v is None:
            total += 5
        elif isinstance(v, int):
            total += v.bit_length() // 3 + 2
        else:  # a float, an undefined value, a loop or a macro: a short repr
            total += 64
    return total


def _refuse_past(size: int, what: str) -> None:
    if size > OUTPUT_LIMIT:
        raise _Limit(f"{what} would make more than {OUTPUT_LIMIT} characters, the output limit")


def _formatted_size(fmt: str, args, placeholder: str) -> int:
    """An upper bound on ``fmt % args`` or ``fmt.format(*args)`` (``args`` a tuple, a mapping or one value): each
    placeholder is at most as wide as the widest width or precision written in ``fmt`` (or passed with ``*`` / a
    nested ``{}``) plus the text of all the arguments (their repr where ``fmt`` asks for one)."""
    keyed = isinstance(args, dict) and ("%(" in fmt or placeholder == "{")
    values = list(args.values()) if keyed else list(args) if isinstance(args, (tuple, list)) else [args]
    widths = [int(n) for n in re.findall(r"\d+", fmt)]
    if "*" in fmt or re.search(r"\{[^{}]*\{", fmt):
        widths += [abs(v) for v in values if isinstance(v, int)]
    per_char = 12 if re.search(r"%[^a-zA-Z%]*[ra]|![ra]", fmt) else 1
    text = 0
    for v in values:
        text += _text_size(v, per_char)
        if text > OUTPUT_LIMIT:
            break
    return len(fmt) + fmt.count(placeholder) * (max(widths, default=0) + text)


def _joined_size(items, sep) -> int:
    if not isinstance(items, (list, tuple, set, frozenset, dict, str)):
        return 0  # a generator or a loop: made step by step, which the time and memory limits see
    total = 0
    for x in items:
        total += _text_size(x) + (_text_size(sep) if total else 0)
        if total > OUTPUT_LIMIT:
            break
    return total


def _string_method_size(s: str, name: str, args: tuple) -> int:
    """An upper bound on what ``s.<name>(*args)`` makes, for the str methods that can make more than they get."""
    def arg(i, default):
        return args[i] if len(args) > i else default

    if name in ("ljust", "rjust", "center", "zfill"):
        width = arg(0, 0)
        return max(len(s), width if isinstance(width, int) else 0)
    if name == "expandtabs":
        tab = arg(0, 8)
        return len(s) + s.count("\t") * (tab if isinstance(tab, int) else 0) + s.count("\t")
    if name == "replace" and isinstance(arg(0, None), str) and isinstance(arg(1, None), str):
        return _replaced_size(s, args[0], args[1], arg(2, -1))
    if name == "join":
        return _joined_size(arg(0, ()), s)
    if name == "translate" and isinstance(arg(0, None), dict):
        return len(s) * max([1] + [_text_size(v) for v in args[0].values() if isinstance(v, str)])
    return 0


def _replaced_size(s: str, old: str, new: str, count) -> int:
    n = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    return len(s) + n * max(0, len(new) - len(old))


def _filter_size(name: str, args: tuple, kwargs: dict) -> int:
    """An upper bound on what filter ``name`` makes of ``args`` (the value first), before it runs."""
    if not args:
        return 0
    value, rest = args[0], args[1:]

    def arg(i, key, default):
        return rest[i] if len(rest) > i else kwargs.get(key, default)

    if name == "join":
        return _joined_size(value, arg(0, "d", ""))
    if name in ("string", "pprint", "tojson", "xmlattr"):  # str(), or a repr / JSON of every item
        return _text_size(value, 1 if name == "string" else 12)
    if name in ("e", "escape", "forceescape", "urlencode"):  # '&' is '&amp;', a 4-byte character '%F0%9F%98%80'
        return _text_size(value) * (6 if name != "urlencode" else 12)
    if name == "format" and isinstance(value, str):
        return _formatted_size(value, kwargs or rest, "%")
    if name == "replace" and all(isinstance(x, str) for x in (value, arg(0, "old", None), arg(1, "new", None))):
        return _replaced_size(value, arg(0, "old", ""), arg(1, "new", ""), arg(2, "count", None))
    if name == "indent" and isinstance(value, str):
        width = arg(0, "width", 4)
        return len(value) + (value.count("\n") + 1) * (len(width) if isinstance(width, str) else int(width))
    if name == "wordwrap" and isinstance(value, str):
        wrap = arg(3, "wrapstring", None)
        return len(value) + (len(value) + 1) * (len(wrap) if isinstance(wrap, str) else 2)
    if name == "sum":
        items = value if isinstance(value, (list, tuple)) else ()
        start = arg(1, "start", 0)
        return (_size(start) or 0) + sum(_size(x) or 0 for x in items)
    return 0


def _guarded_filter(name, fn):
    lead = 1 if hasattr(fn, "jinja_pass_arg") else 0  # the context, eval context or environment jinja passes first

    def run(*args, **kwargs):
        for v in list(args[lead + 1:]) + list(kwargs.values()):  # a width, count or length argument
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) > OUTPUT_LIMIT:
                raise _Limit(f"filter {name!r} was given {v}, past the {OUTPUT_LIMIT}-character output limit")
        _refuse_past(_filter_size(name, args[lead:], kwargs), f"filter {name!r}")
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
        from jinja2.compiler import CodeGenerator, optimizeconst
        from jinja2.runtime import markup_join, str_join
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        class BoundedCodeGenerator(CodeGenerator):
            """``~`` as ``environment.bounded_concat(...)``: jinja's own is a str_join nothing intercepts."""

            @optimizeconst
            def visit_Concat(self, node, frame):
                self.write("environment.bounded_concat(context.eval_ctx, (")
                for arg in node.nodes:
                    self.visit(arg, frame)
                    self.write(", ")
                self.write("))")

        class Bounded(ImmutableSandboxedEnvironment):
            code_generator_class = BoundedCodeGenerator
            intercepted_binops = frozenset(["*", "**", "+", "%"])

            def bounded_concat(self, eval_ctx, values):
                _refuse_past(sum(_text_size(v) for v in values), "'~'")
                return (markup_join if eval_ctx.autoescape else str_join)(values)

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
                if operator == "%" and isinstance(left, str):
                    _refuse_past(_formatted_size(left, right, "%"), "'%' formatting")
                return super().call_binop(context, operator, left, right)

            def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja's own signature
                owner = getattr(__obj, "__self__", None)
                if isinstance(owner, str):
                    _refuse_past(_string_method_size(owner, getattr(__obj, "__name__", ""), args),
                                 f"str.{getattr(__obj, '__name__', '')}")
                return super().call(__context, __obj, *args, **kwargs)

            def wrap_str_format(self, value):
                wrapped = super().wrap_str_format(value)
                if wrapped is None:
                    return None
                fmt, name = value.__self__, value.__name__

                def bounded(*args, **kwargs):
                    given = args[0] if name == "format_map" and args else [*args, *kwargs.values()]
                    _refuse_past(_formatted_size(fmt, given, "{"), f"str.{name}")
                    return wrapped(*args, **kwargs)

                return bounded

        def finalize(value):  # every {{ value }}: a list or dict printed is its repr, built at once
            if not isinstance(value, str):
                _refuse_past(_text_size(value), "printing a value")
            return value

        env = Bounded(trim_blocks=True, lstrip_blocks=True, finalize=finalize)
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

