"""Chat templates are jinja a stranger wrote: rendered sandboxed with a time and an output limit, at conversion
(a sample user turn) and at `generate --chat`. The two classic bombs, a 3 GB string and two nested
range(100000) loops, are refused within seconds, in one line naming the template's file, with memory bounded
and nothing written."""

from __future__ import annotations

import json
import os
import resource
import shutil
import time

import pytest

pytest.importorskip("jinja2")

from tpu_export.edge.chat_template import TIME_LIMIT_S, ChatTemplateError, render_chat_template  # noqa: E402

BOMBS = {
    "3gb_string": ("{{ 'a' * 3000000000 }}", "times 3000000000 is past"),
    "nested_ranges": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                      f"rendering took longer than {TIME_LIMIT_S:g} s"),
}
USER = [{"role": "user", "content": "hi"}]


def _bounded(fn):
    """fn() within 5 s and 300 MB more peak memory than before; returns what it raised."""
    peak, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.monotonic()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - returned for the caller's assertions
        err = e
    else:
        raise AssertionError("accepted a template bomb")
    assert time.monotonic() - t0 < 5
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) * 1024 < 300 << 20
    return err


@pytest.mark.parametrize("bomb", list(BOMBS))
def test_the_renderer_stops_each_bomb_quickly(bomb):
    template, says = BOMBS[bomb]
    e = _bounded(lambda: render_chat_template(template, USER, where="t/chat_template.jinja"))
    assert isinstance(e, ChatTemplateError) and str(e).startswith("t/chat_template.jinja: ") and says in str(e)
    assert "\n" not in str(e)


@pytest.mark.parametrize("template,says", [
    ("{{ 'x' | center(3000000000) }}", "filter 'center' was given 3000000000"),
    ("{{ 10 ** 100000000 }}", "past the template's number limit"),
    ("{% set r = range(100000) %}{% for i in r %}{% for j in r %}{{ j }}{% endfor %}{% endfor %}", "was stopped"),
    ("{{ messages.__class__.__mro__ }}", "failed as it ran"),
    ("{% for m in messages %}", "jinja syntax error on line 1"),
])
def test_other_runaway_or_broken_templates_are_refused(template, says):
    e = _bounded(lambda: render_chat_template(template, USER, where="T"))
    assert isinstance(e, ChatTemplateError) and says in str(e), e


# Each builds gigabytes in one step (a '~' or '%' or join in C) while printing little: refused before the step runs.
ONE_STEP_BOMBS = {
    "concat_doubling": ("{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                        "{% endfor %}{{ ns.s|length }}", "'~' would make more than"),
    "format_width": ("{{ '%9999999999s' % 'a' }}", "'%' formatting would make more than"),
    "format_doubling": ("{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = '%s%s' % (ns.s, ns.s) %}"
                        "{% endfor %}{{ ns.s|length }}", "'%' formatting would make more than"),
    "join_of_a_huge_list": ("{% set s = 'a' * 4000000 %}{{ ([s] * 1000)|join|length }}",
                            "filter 'join' would make more than"),
    "str_join_method": ("{% set s = 'a' * 4000000 %}{{ '-'.join([s] * 1000)|length }}", "str.join would make"),
    "format_method_width": ("{{ '{:{w}}'.format(1, w=9999999999) }}", "str.format would make"),
    "printed_list": ("{% set s = 'a' * 4000000 %}{{ [s] * 1000 }}", "printing a value would make"),
    "tojson_of_a_list": ("{% set s = 'a' * 4000000 %}{{ ([s] * 1000)|tojson|length }}", "filter 'tojson' would"),
    "indent_per_line": ("{{ ('\\n' * 1000000)|indent(1000000)|length }}", "filter 'indent' would make"),
    "replace_empty": ("{{ ('a' * 4000000)|replace('', 'bbbb')|length }}", "filter 'replace' would make"),
    "ljust_method": ("{{ 'a'.ljust(3000000000)|length }}", "str.ljust would make"),
    "expandtabs_method": ("{{ ('\\t' * 1000000).expandtabs(1000000)|length }}", "str.expandtabs would make"),
}


@pytest.mark.parametrize("bomb", list(ONE_STEP_BOMBS))
def test_a_one_step_bomb_is_refused_before_it_runs(bomb):
    template, says = ONE_STEP_BOMBS[bomb]
    t0 = time.monotonic()
    e = _bounded(lambda: render_chat_template(template, USER, where="t/chat_template.jinja"))
    assert time.monotonic() - t0 < 3
    assert isinstance(e, ChatTemplateError) and str(e).startswith("t/chat_template.jinja: the chat template was "
                                                                  "stopped: ") and says in str(e), e
    assert "\n" not in str(e)


@pytest.mark.parametrize("template", [
    "{{ 'ab' ~ messages[0]['content'] ~ 3 }}|{{ '%s: %5.2f %r' % (messages[0]['role'], 1.5, 'x') }}",
    "{{ messages|map(attribute='content')|join(', ') }}|{{ '%(a)s-%(b)d'|format(a='x', b=2) }}|{{ messages }}",
    "{{ 'a\\nb'|indent(2, first=True) }}|{{ 'one two three'|wordwrap(4) }}|{{ 'aXbX'|replace('X', '--') }}",
    "{{ '{}/{:>4}'.format(messages[0]['role'], 7) }}|{{ '-'.join(['a', 'b']) }}|{{ messages|tojson }}",
    "{{ 'q'|center(5) }}|{{ 'a\\tb'.expandtabs(4) }}|{{ 'x'.ljust(3) }}|{{ [[1], [2]]|sum(start=[]) }}",
])
def test_bounded_operations_render_as_plain_jinja_does(template):
    import jinja2

    want = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(template).render(messages=USER)
    assert render_chat_template(template, USER, where="T") == want


def test_the_memory_guard_reads_the_resident_size_now_not_the_peak():
    """A process that once held more (a model loaded and freed) must not give a template that gap for free."""
    from tpu_export.edge.chat_template import _rss_bytes

    before = _rss_bytes()
    block = bytearray(400 << 20)  # zero pages: touched so they are resident
    block[::4096] = b"x" * len(block[::4096])
    held = _rss_bytes()
    del block
    after = _rss_bytes()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert held - before > 350 << 20 and held - after > 350 << 20 and peak - after > 350 << 20


def test_a_real_template_renders_as_transformers_does():
    from tests.llm_models import CHAT_TEMPLATE, tiny_tokenizer

    want = tiny_tokenizer().apply_chat_template(USER, add_generation_prompt=True, tokenize=False)
    assert render_chat_template(CHAT_TEMPLATE, USER, where="T") == want


@pytest.mark.slow
@pytest.mark.parametrize("bomb", list(BOMBS))
def test_generate_chat_refuses_a_bomb_in_lm_json_naming_it(tmp_path_factory, tmp_path, capsys, bomb):
    from tests.security.lm_outputs import PROMPT, copy_target
    from tpu_export.cli import main

    folder = copy_target(tmp_path_factory, "android", tmp_path / "android")
    meta = json.loads((folder / "lm.json").read_text())
    meta["chat_template"] = BOMBS[bomb][0]
    (folder / "lm.json").write_text(json.dumps(meta))
    before = sorted(os.listdir(folder))
    capsys.readouterr()  # the conversion's own progress, when this test built it
    e = _bounded(lambda: _raise_on_failure(main(["generate", str(folder / "model.tflite"), "--prompt", PROMPT,
                                                 "--chat", "--max-new-tokens", "2"])))
    assert isinstance(e, _Failed) and e.args == (1,)
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"tpu-export: error: {folder / 'lm.json'}'s chat_template: the chat template was "
                          "stopped: ") and BOMBS[bomb][1] in err and len(err.splitlines()) == 1, err
    assert sorted(os.listdir(folder)) == before


class _Failed(Exception):
    pass


def _raise_on_failure(rc):
    if rc:
        raise _Failed(rc)


def test_a_bundle_carrying_a_bomb_is_refused_by_the_check(tmp_path_factory, tmp_path):
    """In a .litertlm the template is in LlmMetadata: write_litertlm refuses to write it, and a bundle built
    around our writer is refused before the engine (which renders it for a templated session) loads it."""
    from tests.security.lm_outputs import converted, rebuilt_bundle
    from tpu_export.edge.litertlm import LitertLmError, write_litertlm
    from tpu_export.edge.litertlm_check import BundleFormatError, check_litertlm

    out = converted(tmp_path_factory)
    src = out / "android/model.litertlm"
    from tpu_export.converter.llm import CacheSpec

    spec = CacheSpec(2, 2, 64, 16)
    for template, says in BOMBS.values():
        e = _bounded(lambda t=template: write_litertlm(tmp_path / "x.litertlm", out / "android/model.tflite",
                                                       tokenizer_json=out / "android/tokenizer.json",
                                                       stop_token_ids=[2], max_num_tokens=64, cache_spec=spec,
                                                       prompt_template=t))
        assert isinstance(e, LitertLmError) and str(e).startswith("prompt_template: ") and says in str(e), e
        assert not (tmp_path / "x.litertlm").exists()
    bundle = rebuilt_bundle(src, tmp_path / "bomb.litertlm",
                            lambda llm: setattr(llm, "jinja_prompt_template", BOMBS["nested_ranges"][0]))
    e = _bounded(lambda: check_litertlm(bundle))
    assert isinstance(e, BundleFormatError) and "section 0 (LlmMetadataProto): jinja_prompt_template: the chat " \
        "template was stopped: rendering took longer" in str(e), e


@pytest.mark.parametrize("bomb", list(BOMBS))
def test_convert_lm_refuses_a_bomb_naming_chat_template_jinja(tmp_path_factory, tmp_path, bomb):
    from tests.security.lm_outputs import model_dir
    from tpu_export.targets.lm import convert_lm
    from tpu_export.targets.lm_source import LmSourceError

    d = tmp_path / "model"
    shutil.copytree(model_dir(tmp_path_factory), d)
    (d / "chat_template.jinja").write_text(BOMBS[bomb][0])
    t0 = time.monotonic()
    with pytest.raises(LmSourceError) as e:
        convert_lm(d, ["android"], tmp_path / "out", prefill_lengths=(8,), cache_len=64)
    assert str(e.value).startswith(f"{d / 'chat_template.jinja'}: the chat template was stopped: ")
    assert BOMBS[bomb][1] in str(e.value) and "\n" not in str(e.value)
    assert time.monotonic() - t0 < 60 and not (tmp_path / "out").exists()
