"""`tpu-export --help` and each subcommand's: every flag says what it does and its default, each subcommand shows
its own examples, and the top-level help lists the subcommands one line each."""

from __future__ import annotations

import re

import pytest

from tpu_export.cli import build_parser, main

PARSER = build_parser()
COMMANDS = dict(PARSER.commands)


def _options(sub):
    return [a for a in sub._actions if a.option_strings and a.dest != "help"]


def test_every_subcommand_is_there():
    assert set(COMMANDS) >= {"convert", "convert-lm", "generate", "run", "inspect", "demo", "targets", "ops", "doctor"}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_flag_has_help_and_shows_its_default(name):
    sub = COMMANDS[name]
    fmt = sub.formatter_class(prog=sub.prog)
    for action in _options(sub):
        flag = "/".join(action.option_strings)
        assert (action.help or "").strip(), f"{name} {flag}: no help"
        shown = fmt._get_help_string(action)
        assert action.required or "default" in shown, f"{name} {flag}: its help does not show the default: {shown!r}"
        if action.required:
            assert shown.startswith("required"), f"{name} {flag}: a required flag says so: {shown!r}"
    for action in sub._actions:
        if not action.option_strings:
            assert (action.help or "").strip(), f"{name} {action.dest}: no help"


def test_the_flags_the_users_asked_about_show_their_defaults(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    text = capsys.readouterr().out
    blocks = re.split(r"\n(?=  -)", text.partition("\noptions:\n")[2].partition("\n\n")[0])
    lines = {re.search(r"--[a-z0-9-]+", b).group(0): " ".join(b.split()) for b in blocks}
    assert "(default: 1024)" in lines["--max-batch"]
    assert "(default: float32)" in lines["--dtype"] and "bfloat16" in lines["--dtype"]
    assert "(default: auto on TPU chips" in lines["--use-pallas"]
    assert "(default: off)" in lines["--quiet"] and "(default: off" in lines["--enable-x64"]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_subcommand_shows_its_own_examples(name, capsys):
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    _, _, examples = text.partition("\nexamples:\n")
    ours = [line for line in examples.splitlines() if line.startswith(f"  tpu-export {name}")]
    assert ours, f"{name} --help has no example of itself:\n{text}"
    others = {c for c in COMMANDS if c != name and not c.startswith(name)}
    assert not any(re.match(rf"  tpu-export ({'|'.join(map(re.escape, others))})\b(?!-)", line)
                   for line in examples.splitlines()), examples


def test_examples_name_the_files_the_commands_write():
    convert = COMMANDS["convert"].epilog
    assert "out/android/android.tflite" in convert and "out/tpu-v6e/model.tpuexp" in convert
    assert "out/android/model.litertlm" in COMMANDS["convert-lm"].epilog
    assert "tpu-export inspect out/android/android.tflite" in COMMANDS["inspect"].epilog


def test_top_level_help_lists_each_subcommand_on_one_line(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for name in COMMANDS:
        assert re.search(rf"^    {re.escape(name)} +\S", text, re.M), f"{name} is not on one line:\n{text}"
    assert "--prefill" not in text and "iot:calibration" not in text  # the subcommands' own examples stay there
    assert "tpu-export COMMAND --help" in text


def test_a_typo_of_a_subcommand_a_choice_or_a_flag_names_the_closest(capsys):
    for argv, says in ((["conver", "m.pt2"], "did you mean convert?"),
                       (["convert", "m.pt2", "--target", "cpu", "-o", "o", "--dtype", "bf16"],
                        "did you mean bfloat16?"),
                       (["convert", "m.pt2", "--target", "cpu", "-o", "o", "--quantise", "fp16"],
                        "--quantise: did you mean --quantize?")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and says in err, err


def test_the_cli_scheme_words_are_the_quantizers():
    """cli_check spells the schemes out (it runs before torch is imported): they must be the quantizers' own."""
    from tpu_export import cli_check
    from tpu_export.edge import quantize

    assert set(cli_check.EDGE_SCHEMES) == set(quantize.SCHEMES)
    # the aliases the CLI points to their one name; "int8" it refuses as ambiguous
    assert {a: s for a, s in quantize._ALIASES.items() if a != "int8"} == cli_check._SCHEME_ALIASES
