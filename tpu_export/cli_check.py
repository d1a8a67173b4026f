"""The words of the tpu-export command line, checked before any model is imported.

Target names, the keys of ``--target NAME:KEY=VALUE`` (the same words as the ``--KEY`` flags) and the
``--quantize`` schemes are checked against the registry first: a typo fails at once, in one line, with
"did you mean". Then each target's options go through ``targets.options_for`` (the library's own check,
the one ``convert`` makes again) and whatever it refuses is said in the CLI's words (``--calibration``,
``--target NAME:key=value``), never in the Python API's (``calibration_data``, ``channel_last_io=``).
"""

from __future__ import annotations

import dataclasses
import difflib
import re

__all__ = ["CliError", "RefusedOptionsError", "KEY_OPTION", "did_you_mean", "check_target_name", "check_key",
           "check_scheme", "check_options", "cli_words", "keys_of"]


class CliError(Exception):
    """A mistake on the command line (an unknown word, a malformed value): printed as one line, exit code 2."""

    exit_code = 2


class RefusedOptionsError(CliError):
    """Well-formed options a target refuses (a scheme its runtime cannot run, static int8 without calibration
    samples, a topology the chip does not come in): the library's own check, made before the model is imported
    and said in the CLI's words; exit code 1, as a refusal of the conversion."""

    exit_code = 1


_Refused = RefusedOptionsError


# CLI key -> the option's Python name (targets/options.py). A --target NAME:KEY=VALUE item and the --KEY flag
# share these words.
KEY_OPTION = {
    "topology": "topology",
    "use-pallas": "use_pallas",
    "dtype": "dtype",
    "precision": "precision",
    "aot": "aot",
    "quantize": "quant_config",
    "calibration": "calibration_data",
    "verify": "verify_inputs",
    "strict": "strict_ops",
    "channel-last": "channel_last_io",
    "flash-kib": "flash_kib",
    "ram-kib": "ram_kib",
    "slots": "slots",
}
OPTION_KEY = {v: k for k, v in KEY_OPTION.items()}

# The schemes the CLI names: edge/quantize.py's SCHEMES (every edge runtime), and the TPU backend's one
# (tpu_backend/quant.py; its "int8" alias is refused here, see check_scheme). Spelled out, not imported:
# tpu_backend.quant imports torch, and these checks run before anything heavy is imported.
EDGE_SCHEMES = ("dynamic_int8", "weight_only_int8", "weight_only_int4", "dynamic_int4_block32", "fp16",
                "static_int8")
TPU_SCHEMES = ("weight_only_int8",)
# the Python API's other spellings (edge/quantize.py _ALIASES) -> the one name the CLI takes
_SCHEME_ALIASES = {"float16": "fp16", "full_int8": "static_int8", "dynamic": "dynamic_int8"}


def did_you_mean(word: str, choices) -> str:
    """``"; did you mean X?"`` for the closest of ``choices`` (difflib), else ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _targets():
    from tpu_export.targets.registry import TARGETS  # light: no torch, no jax

    return TARGETS


def check_target_name(item: str, name: str):
    """The Target named by ``--target ITEM``; an unknown name fails with the closest known one."""
    targets = _targets()
    if name in targets:
        return targets[name]
    what = f"--target {item}" if item else "--target"
    hint = did_you_mean(name.lower(), targets)
    raise CliError(f"{what}: unknown target {name!r}; targets: {', '.join(targets)}{hint}")


def _fields(target) -> set:
    return {f.name for f in dataclasses.fields(target.options_type)}


def keys_of(target) -> list[str]:
    """The CLI keys ``target`` takes, in the table's order."""
    mine = _fields(target)
    return [k for k, opt in KEY_OPTION.items() if opt in mine]


def _who_takes(option: str) -> str:
    names = [t.name for t in _targets().values() if option in _fields(t)]
    return ", ".join(names) if names else "no target"


def check_key(item: str, key: str, target) -> None:
    """``--target ITEM``'s ``key``: one of the CLI's keys, and one ``target`` takes."""
    if key not in KEY_OPTION:
        # the closest CLI key; a Python name (channel_last_io) or an underscore spelling (ram_kib) points to its key
        spellings = {k: k for k in KEY_OPTION}
        spellings.update({k.replace("-", "_"): k for k in KEY_OPTION})
        spellings.update(OPTION_KEY)
        close = difflib.get_close_matches(key.replace("-", "_"), list(spellings), n=1, cutoff=0.6)
        hint = f"; did you mean {spellings[close[0]]}?" if close else ""
        raise CliError(f"--target {item}: unknown key {key!r}; keys: {', '.join(KEY_OPTION)}{hint}")
    option = KEY_OPTION[key]
    if option not in _fields(target):
        raise CliError(f"--target {item}: {target.name} does not take {key} (a key of {_who_takes(option)}); "
                       f"{target.name} takes {', '.join(keys_of(target))}")


def check_scheme(value: str) -> str:
    """A ``--quantize`` / ``quantize=`` scheme: one of the CLI's names (raises CliError without a location)."""
    if value in EDGE_SCHEMES or value in TPU_SCHEMES:
        return value
    if value.lower() == "int8":
        raise CliError("int8 is ambiguous (full-integer on edge, weight-only on TPU); name the scheme: "
                       "static_int8 (weights and activations, needs --calibration), dynamic_int8 or weight_only_int8")
    schemes = list(dict.fromkeys(EDGE_SCHEMES + TPU_SCHEMES))
    alias = _SCHEME_ALIASES.get(value.lower())
    hint = f"; did you mean {alias}?" if alias else did_you_mean(value.lower(), schemes)
    raise CliError(f"unknown scheme {value!r}; schemes: {', '.join(schemes)}{hint}")


def check_options(items, shared: dict, *, llm: bool = False) -> None:
    """Every target's options as ``convert`` will check them, before the model is imported.

    ``items``: ``[(item text, target name, {option: value})]`` from the --target items; ``shared``:
    ``{option: (flag text, value)}`` from the --KEY flags, given to every target that takes them. ``llm``:
    convert-lm (no static int8, no iot). Raises CliError in the CLI's words."""
    targets = _targets()
    resolved = [targets[name] for _, name, _ in items]
    names = ", ".join(t.name for t in resolved)
    for option, (flag, _) in shared.items():
        if not any(option in _fields(t) for t in resolved):
            raise _Refused(f"{flag}: no target of this call ({names}) takes it; it is for {_who_takes(option)}")
    for (item, _, own), t in zip(items, resolved):
        if llm and t.name == "iot":
            raise _Refused("--target iot: TFLite Micro cannot hold an LLM with its KV cache; convert-lm targets: "
                           "android, ios, web, cpu and the TPU/XLA targets")
        fields = _fields(t)
        mine = {o: v for o, (_, v) in shared.items() if o in fields}
        origin = {o: f for o, (f, _) in shared.items() if o in fields}
        mine.update(own)
        origin.update({o: f"--target {item}" for o in own})
        if not llm and mine.get("slots") is not None:
            raise _Refused(f"--target {item}: slots is for convert-lm (an LM's decode_slots); convert exports no KV "
                           "cache: drop it")
        _check_quant(t, mine, origin, llm, len(resolved) > 1)
        from tpu_export.targets.options import options_for

        try:
            options_for(t, mine)
        except (TypeError, ValueError) as e:  # OptionsError, QuantizationError, InvalidTopologyError...
            raise _Refused(f"--target {item}: {cli_words(str(e))}") from None


def _check_quant(t, mine: dict, origin: dict, llm: bool, several: bool) -> None:
    """The scheme each target's runtime runs and the calibration it needs, said with the flag that set it."""
    q = mine.get("quant_config")
    where = origin.get("quant_config")
    if q is not None and t.backend == "tpu" and q not in TPU_SCHEMES:
        shared = several and where and not where.startswith("--target")
        also = "; give each target its own: --target NAME:quantize=SCHEME" if shared else ""
        raise _Refused(f"{where}: {t.name} (TPU/XLA) quantizes weight_only_int8 only, not {q} (or bfloat16 "
                       f"weights: --target {t.name}:dtype=bfloat16){also}")
    if t.backend != "edge":
        return
    iot = t.name == "iot"
    if llm and q == "static_int8":
        raise _Refused(f"{where}: static_int8 of an LLM (calibrating prefill and decode) is not supported; use "
                       "dynamic_int8, weight_only_int8, weight_only_int4, dynamic_int4_block32 or fp16")
    if iot and q not in (None, "static_int8"):
        raise _Refused(f"{where}: iot (TFLite Micro) runs full-integer int8 only, not {q}; use static_int8 "
                       "(the default there) with --calibration FILE.npz")
    static = q == "static_int8" or (iot and q is None)
    cal = mine.get("calibration_data")
    if static and cal is None:
        what = "iot (TFLite Micro) runs full-integer int8, which" if q is None else "static_int8"
        raise _Refused(f"--target {t.name}: {what} needs calibration samples: add --calibration FILE.npz or "
                       f"--target {t.name}:calibration=FILE.npz (a .npz of the model's inputs, first dim = sample)")
    if cal is not None and not static:
        where = origin["calibration_data"]
        fix = ("; give it only to the targets that quantize static_int8 (--target iot:calibration=FILE.npz)"
               if not where.startswith("--target") else "")
        raise _Refused(f"{where}: calibration samples are for quantize static_int8; {t.name} has "
                       f"{'no --quantize' if q is None else f'quantize {q}'}{fix}")


# The Python API's words -> the CLI's, for the messages of the library checks the CLI passes on.
_WORDS = [
    (re.compile(r"\bquant_config='?([A-Za-z0-9_]+)'?"), r"--quantize \1"),
    (re.compile(r"\bquant_config\b"), "--quantize"),
    (re.compile(r"\bcalibration_data\b"), "--calibration"),
    (re.compile(r"\bverify_inputs\b"), "verify"),
    # "android: ... channel_last_io=False keeps ..." (a progress line names its target first)
    (re.compile(r"^([\w-]+): (.*)\bchannel_last_io=False\b"), r"\1: \2--target \1:channel-last=off"),
    (re.compile(r"\bchannel_last_io\b"), "channel-last"),
    (re.compile(r"\bstrict_ops\b"), "strict"),
    (re.compile(r"\bmax_rel_err\b"), "--max-rel-err"),
    (re.compile(r"\buse_pallas\b"), "use-pallas"),
    (re.compile(r"\bflash_kib\b"), "flash-kib"),
    (re.compile(r"\bram_kib\b"), "ram-kib"),
    (re.compile(r"\bdtype='(\w+)'"), r"dtype=\1"),
]


def cli_words(text: str) -> str:
    """A library message about options, with each Python option name replaced by its CLI key or flag."""
    for pattern, repl in _WORDS:
        text = pattern.sub(repl, text)
    return text
