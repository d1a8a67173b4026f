"""The one input check both runtimes run before a call (the TPU artifact's and the .tflite's).

It works on plain specs, as a TPU manifest's input dicts and a .tflite's structure metadata
hold them: ``{"name", "dtype" (numpy's name, or None: not checked), "shape" (ints, dim-name
strings, None for a free dim), "index_bound"?, "channel_last"?}`` plus the signature's dim
ranges ``{dim name: (min, max)}``. A compiled program trusts its inputs: a wrong shape or an id
past the table would run and give garbage (or a clamped gather), so what torch would refuse is
refused here first, with a one-line error naming the input, what was given and what is expected.
"""

from __future__ import annotations

import numpy as np
import torch

from .dtypes import numpy_narrow, numpy_of, to_numpy

__all__ = ["InputTypeError", "InputValueError", "InputIndexError", "bind_inputs", "check_inputs", "to_numpy"]

# Casts the TPU path has always made: the 32-bit dtype the program runs for torch's 64-bit one.
_CASTS: dict = {}  # (given np.dtype, wanted np.dtype) -> how (see _cast)
_LAYOUTS = {3: ("NCW", "NWC"), 4: ("NCHW", "NHWC"), 5: ("NCDHW", "NDHWC")}


class InputTypeError(TypeError):
    """Wrong input names, count or dtype (torch raises TypeError for these)."""


class InputValueError(ValueError):
    """Wrong rank or size, a dim outside its exported range, or a value the program's dtype cannot hold."""


class InputIndexError(IndexError):
    """An id outside its embedding table (torch: "index out of range in self")."""


def bind_inputs(sig: str, names: list, args, kwargs: dict, *, flatten=None, keywords=()) -> list:
    """The call's values in ``names`` order. ``flatten(args, kwargs)`` lays them out by the
    signature's own pytree (TypeError when they do not fit it); else, or when it refuses, they
    bind as Python binds a call to ``f(*names)``. ``keywords``: the top-level keyword names of
    that pytree, valid besides ``names``."""
    if not kwargs and len(args) == len(names) and all(isinstance(a, (torch.Tensor, np.ndarray)) for a in args):
        return list(args)  # one tensor per input, in order: the common call, without a pytree walk
    if kwargs:
        valid = list(dict.fromkeys([*keywords, *names]))
        bad = [k for k in kwargs if k not in valid]
        if bad:
            raise InputTypeError(f"signature {sig!r} got unexpected keyword argument(s) {bad}; valid names: {valid}")
    why = ""
    if flatten is not None:
        try:
            flat = flatten(args, kwargs)
        except TypeError as e:
            why = f" ({e})"
        else:
            if len(flat) == len(names):
                return flat
            why = f" ({len(flat)} tensors)"
    n = len(args)
    if n > len(names):
        why = f": {n} positional values for {len(names)} inputs"
    elif not any(isinstance(a, (tuple, list, dict)) for a in args):
        missing = [k for k in names[n:] if k not in kwargs]
        twice = [k for k in names[:n] if k in kwargs]
        if not missing and not twice:
            return list(args) + [kwargs[k] for k in names[n:]]
        why = f": missing {missing}" if missing else f": {twice} given by position and by name"
    raise InputTypeError(f"signature {sig!r} takes inputs {names}; got {n} positional and keywords "
                         f"{list(kwargs)}{why}")


def check_inputs(sig: str, specs, values, dim_ranges) -> list:
    """Each value checked against its spec and cast to its dtype; numpy arrays in spec order."""
    sizes: dict = {}  # dim name -> (size, input, axis): inputs that share a dim must agree on it
    return [_check(sig, spec, to_numpy(x), dim_ranges, sizes) for spec, x in zip(specs, values)]


def _cast(given, want) -> str:
    """How a ``given`` array becomes ``want``: "same", "cast", "narrow" (integers that may not fit:
    int64 -> int32, uint64 -> int32, ...) or "refuse" (not a cast torch would make implicitly)."""
    how = _CASTS.get((given, want))
    if how is None:
        if given == want:
            how = "same"
        elif numpy_narrow(given) != want and not np.can_cast(given, want, "same_kind"):
            how = "refuse"
        elif given.kind in "iu" and want.kind in "iu" and not np.can_cast(given, want):
            how = "narrow"
        else:
            how = "cast"
        _CASTS[(given, want)] = how
    return how


def _check(sig, spec, a, ranges, sizes) -> np.ndarray:
    name, want = spec["name"], spec.get("dtype")
    want = numpy_of(want) if want is not None else a.dtype
    how = _cast(a.dtype, want)
    if how == "refuse":
        raise InputTypeError(f"input {name!r} is {a.dtype}; signature {sig!r} takes {want}")
    _check_shape(sig, spec, a.shape, ranges, sizes)
    bound = spec.get("index_bound")
    if (bound is not None or how == "narrow") and a.size:
        lo, hi = int(a.min()), int(a.max())
        if bound is not None and (lo < 0 or hi >= bound):
            raise InputIndexError(f"index out of range in self: input {name!r} holds ids from {lo} to {hi}; the "
                                  f"embedding it feeds has {bound} rows (valid ids 0 to {bound - 1})")
        if how == "narrow" and not np.iinfo(want).min <= lo <= hi <= np.iinfo(want).max:
            raise InputValueError(f"input {name!r}: {a.dtype} values outside the {want} range the program uses "
                                  f"([{lo}, {hi}])")
    return a if how == "same" else a.astype(want)


def _check_shape(sig, spec, got, ranges, sizes) -> None:
    name, shape = spec["name"], spec["shape"]
    if len(got) != len(shape):
        raise InputValueError(f"input {name!r} has shape {list(got)}; signature {sig!r} takes {list(shape)} "
                              f"(rank {len(shape)})")
    for i, (d, n) in enumerate(zip(shape, got)):
        if d == n or d is None:  # the static size, or a free dim
            continue
        if not isinstance(d, str):
            raise InputValueError(_static_mismatch(sig, spec, got, i))
        lo, hi = ranges.get(d, (0, None))
        if n < lo or (hi is not None and n > hi):
            raise InputValueError(f"input {name!r}: dim {i} ({d}) is {n}, outside its range [{lo}, {hi}]")
        seen = sizes.setdefault(d, (n, name, i))
        if seen[0] != n:
            raise InputValueError(f"input {name!r}: dim {i} ({d}) is {n}, but input {seen[1]!r} has "
                                  f"{d} = {seen[0]} (dim {seen[2]}); inputs sharing a dim must agree")


def _static_mismatch(sig, spec, got, i) -> str:
    name, shape = spec["name"], list(spec["shape"])
    msg = f"input {name!r} has shape {list(got)}; signature {sig!r} takes {shape} (dim {i} must be {shape[i]})"
    if not spec.get("channel_last") or len(shape) not in _LAYOUTS:
        return msg
    first, last = _LAYOUTS[len(shape)]
    as_last = [got[0], *got[2:], got[1]]  # the given tensor, permuted channel-last
    if all(not isinstance(d, int) or d == n for d, n in zip(shape, as_last)):
        perm = ", ".join(map(str, [0, *range(2, len(shape)), 1]))
        return (f"input {name!r} has shape {list(got)}, laid out {first}; the model takes {last} (channel-last) "
                f"{shape}. Fix: pass {name}.permute({perm})")
    return f"{msg}; the model takes {last} (channel-last)"
