"""Capture: nn.Module / ExportedProgram / .pt2 file -> torch.export.ExportedProgram."""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import sys
import warnings

import torch

from ._torch_compat import innermost_user_frames, is_export_user_error, module_children, replace_module_children
from .detection import static_roi_pools
from .errors import ExportFailedError, UnsupportedModelError

__all__ = ["capture", "explain_export_error"]


def _as_tuple(args):
    if args is None:
        return ()
    if isinstance(args, tuple):
        return args
    if isinstance(args, list):
        return tuple(args)
    return (args,)


def capture(module, sample_args=None, sample_kwargs=None, *, dynamic_shapes=None, strict="auto"):
    """Export ``module`` with torch.export.

    ``module`` may be an nn.Module (exported here), an ExportedProgram (used as is) or the path
    of a ``.pt2`` file saved by ``torch.export.save``. ``strict="auto"`` tries non-strict first
    (it accepts more Python), then strict; the first error is the one explained to the user.
    """
    if isinstance(module, (str, os.PathLike)):
        path = os.fspath(module)
        if not os.path.isfile(path):
            raise ExportFailedError(
                f"{path}: no such file. Fix: pass an nn.Module or a .pt2 saved by torch.export.save"
            )
        from .pt2_load import load_pt2

        # never torch.export.load: it unpickles and evaluates parts of the file (see pt2_load)
        with _quiet_torch_logs():
            return load_pt2(path)
    if isinstance(module, torch.export.ExportedProgram):
        return module
    if not isinstance(module, torch.nn.Module):
        if callable(module):
            raise ExportFailedError(
                f"got a {type(module).__name__}, not an nn.Module. "
                "Fix: wrap the function in an nn.Module whose forward calls it"
            )
        raise ExportFailedError(
            f"cannot convert a {type(module).__name__}; pass an nn.Module, an ExportedProgram or a .pt2 path"
        )
    args = _as_tuple(sample_args)
    kwargs = dict(sample_kwargs or {})
    if module.training:
        warnings.warn(
            f"{type(module).__name__} is in training mode; converting a copy of it in eval mode "
            "(dropout off, BatchNorm using running stats). Call module.eval() to silence this.",
            stacklevel=3,
        )
        module = _eval_copy(module)
    modes = {"auto": (False, True), True: (True,), False: (False,), "strict": (True,), "non_strict": (False,)}
    if strict not in modes:
        raise ValueError(f"strict must be 'auto', True or False, not {strict!r}")
    first_error = None
    for s in modes[strict]:
        try:
            # innermost_user_frames: an unsupported op is reported at the line that calls it, also inside a helper;
            # static_roi_pools: torchvision's MultiScaleRoIAlign pools in static shapes (converter.detection)
            with torch.no_grad(), _quiet_torch_logs(), innermost_user_frames(), static_roi_pools(module):
                return torch.export.export(module, args, kwargs, dynamic_shapes=dynamic_shapes, strict=s)
        except UnsupportedModelError:
            raise  # our own refusal from inside forward: already one line naming the feature
        except Exception as e:  # noqa: BLE001
            if first_error is None:
                first_error = e
            if _is_user_error(e):
                break  # wrong inputs or dynamic_shapes fail the same way in strict mode: don't trace twice
    raise explain_export_error(first_error, module) from first_error


@contextlib.contextmanager
def _quiet_torch_logs():
    """Keep torch's own diagnostics off stderr while it traces: a failing export logs warnings
    and prints a partial graph (~40 lines) before the one-line explanation raised here.

    torch's loggers are raised to CRITICAL for the duration and its direct prints to stderr
    are held: written out after a successful export, dropped (kept on the error as
    ``torch_output``) after a failed one. With TORCH_LOGS set the user asked for torch's logs,
    so nothing is touched. The stderr swap is process-wide, as every redirect of sys.stderr is.
    """
    if os.environ.get("TORCH_LOGS"):
        yield
        return
    import io
    import logging

    names = ["torch"] + [n for n in logging.root.manager.loggerDict if n.startswith("torch.")]
    saved = {}
    for n in names:
        lg = logging.getLogger(n)
        if n == "torch" or lg.level != logging.NOTSET:
            saved[n] = lg.level
            lg.setLevel(logging.CRITICAL)
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            yield
    except BaseException as e:
        if held.getvalue():
            try:
                e.torch_output = held.getvalue()
            except AttributeError:  # an exception type without a __dict__
                pass
        raise
    else:
        if held.getvalue():
            sys.stderr.write(held.getvalue())
    finally:
        for n, level in saved.items():
            logging.getLogger(n).setLevel(level)


def _is_user_error(e: BaseException) -> bool:
    return is_export_user_error(e) or isinstance(e, TypeError)


def _eval_copy(module):
    import copy

    from torch.nn.utils import parametrize

    if parametrize.is_parametrized(module):
        # torch refuses to copy a parametrized module (weight_norm: Wav2Vec2's positional conv) through
        # copy.copy's pickling protocol; its state is all in __dict__, so copy that
        m = module.__class__.__new__(module.__class__)
        m.__dict__.update(module.__dict__)
    else:
        m = copy.copy(module)  # shallow: shares parameters; only the training flags differ
    children = module_children(module)
    replace_module_children(m, {k: _eval_copy(v) if v is not None else None for k, v in children.items()})
    m.training = False
    return m


# (pattern in the torch error, cause, fix)
_KNOWN = [
    (
        r"data.dependent|GuardOnDataDependentSymNode|Could not guard on data-dependent"
        r"|could not extract specialized integer",
        "the model branches (if/while) or sizes a tensor on a value computed from its inputs",
        "use torch.cond(pred, true_fn, false_fn, operands) for the branch, "
        "torch._check(...) to state the value's range, or compute the size from input shapes instead of tensor values",
    ),
    (
        r"specialized it to be a constant \(1\)|specialized it to be a constant \(0\)",
        "the sample input has size 0 or 1 in a dim marked dynamic, and torch.export specializes sizes 0 and 1",
        "give a sample with size >= 2 in that dim (e.g. a batch of 2); the converted model still accepts batch 1",
    ),
    (
        r"Constraints violated|specialized.*(to|be) a constant|ConstraintViolation|not all values of",
        "a dimension you marked dynamic is forced to a fixed value (or a range) by the model's code",
        "drop that dim from dynamic_shapes, "
        "or give the Dim the min/max the error names (torch.export.Dim(name, min=..., max=...))",
    ),
    (
        r"Unsupported: .*(call_function|builtin|method)|torch\._dynamo\.exc\.Unsupported",
        "strict tracing met Python it cannot trace",
        "convert with strict_export=False (non-strict), or move that Python code out of forward",
    ),
    (
        r"missing \d+ required positional argument|missing a required argument|takes \d+ positional argument|"
        r"unexpected keyword argument|too many positional arguments",
        "the sample inputs do not match forward's parameters",
        "pass sample_args / sample_kwargs exactly as you would call model(*args, **kwargs)",
    ),
    (
        r"Expected.*dynamic_shapes|dynamic_shapes.*(structure|match)",
        "dynamic_shapes does not have the structure of the inputs",
        "give dynamic_shapes the same structure as (args, kwargs), e.g. ({0: Dim('batch')},) for one tensor input",
    ),
]


def _user_frame(exc) -> str:
    """The user's line: from torch's own report when it names one, else the traceback."""
    import sysconfig
    import traceback

    lines = str(exc).splitlines()
    found = ""
    for i, ln in enumerate(lines):
        m = re.search(r'File "([^"]+)", line (\d+)', ln)
        if m and "/torch/" not in m.group(1):
            code = re.sub(r".*code: ", "", ln) if "code:" in ln else ""
            if not code and i + 1 < len(lines) and "File " not in lines[i + 1]:
                code = lines[i + 1].strip()
            found = f'File "{m.group(1)}", line {m.group(2)}' + (f": {code.strip()}" if code else "")
    if found:
        return found
    stdlib = sysconfig.get_paths()["stdlib"]
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    for fr in reversed(frames):
        f = fr.filename
        if "/torch/" in f or "/converter/" in f or f.startswith(stdlib) or "site-packages" in f:
            continue
        return f'File "{f}", line {fr.lineno}: {fr.line}'
    return ""


def explain_export_error(exc: BaseException, module=None) -> ExportFailedError:
    text = f"{type(exc).__name__}: {exc}"
    name = type(module).__name__ if module is not None else "the model"
    cause, fix = "torch.export could not trace the model", (
        "see the chained exception for torch's report; try strict_export=False, or simplify forward"
    )
    for pattern, c, f in _KNOWN:
        if re.search(pattern, text, flags=re.IGNORECASE | re.DOTALL):
            cause, fix = c, f
            break
    first = text.strip().splitlines()[0][:300].rstrip(" .") if text.strip() else type(exc).__name__
    where = _user_frame(exc)
    # one line: the CLI prints it as is, and a log line stays greppable
    msg = f"torch.export failed on {name}: {cause} (torch says: {first})"
    if where:
        msg += f" at {where}"
    return ExportFailedError(f"{msg}. Fix: {fix}.")


def forward_params(module) -> list[str]:
    if not isinstance(module, torch.nn.Module):
        return []
    try:
        return [p for p in inspect.signature(module.forward).parameters]
    except (TypeError, ValueError):
        return []
