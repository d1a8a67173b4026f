"""``litert_torch.config``: litert-torch 0.10's settings object, with its field names.

Each field reads (and its setter writes) the same environment variable as in litert-torch 0.10, so a setting made
either way is seen by both spellings. Values that ask for something this converter does not do are refused by name
when set, with the reason.
"""

from __future__ import annotations

import os

__all__ = ["config", "Config"]

_TRUE = ("y", "yes", "t", "true", "on", "1")
_FALSE = ("n", "no", "f", "false", "off", "0")


def _env_bool(name: str, default: bool) -> bool:
    v = os.environ.get(name, "").strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    return default


def _set_bool(name: str, value: bool) -> None:
    os.environ[name] = "y" if value else "n"


class Config:
    """litert-torch 0.10's ``litert_torch.config`` fields.

    ``show_progress`` (``LITERT_TORCH_SHOW_PROGRESS``, default off here): ``convert`` prints a line per long step,
    as ``progress=print`` does. ``silence_torch_logs`` (default on): torch's export logs are quiet during capture;
    they are always quiet here, so False is refused. ``resource_constant_numel_threshold``: accepted for
    compatibility; large weights are streamed by ``output_file_path``/``lightweight_conversion`` instead.
    ``enable_group_norm_composite`` and ``layout_optimize_partitioner`` tune litert-torch's own passes and
    accept only their defaults.

    Examples:
        >>> from tpu_export import litert_torch
        >>> litert_torch.config.in_oss
        True
        >>> litert_torch.config.layout_optimize_partitioner
        'DEFAULT'
    """

    @property
    def in_oss(self) -> bool:
        """Always True (the open-source build)."""
        return True

    @property
    def show_progress(self) -> bool:
        """Print a line per long conversion step (``LITERT_TORCH_SHOW_PROGRESS``; off unless set)."""
        return _env_bool("LITERT_TORCH_SHOW_PROGRESS", False)

    @show_progress.setter
    def show_progress(self, value: bool) -> None:
        _set_bool("LITERT_TORCH_SHOW_PROGRESS", bool(value))

    @property
    def silence_torch_logs(self) -> bool:
        """torch's export logs are quiet during capture (always True here)."""
        return True

    @silence_torch_logs.setter
    def silence_torch_logs(self, value: bool) -> None:
        if not value:
            raise NotImplementedError("litert_torch.config.silence_torch_logs = False: capture always quiets torch's "
                                      "export logs; set TORCH_LOGS (e.g. TORCH_LOGS=+export) to see them")

    @property
    def resource_constant_numel_threshold(self) -> int:
        """litert-torch's lazy-constant threshold (elements); kept for compatibility, it changes nothing here."""
        v = os.environ.get("RESOURCE_CONSTANT_NUMEL_THRESHOLD", "").strip()
        return int(v) if v.isdigit() else 1024 * 1024

    @resource_constant_numel_threshold.setter
    def resource_constant_numel_threshold(self, value: int) -> None:
        os.environ["RESOURCE_CONSTANT_NUMEL_THRESHOLD"] = str(int(value))

    @property
    def enable_group_norm_composite(self) -> bool:
        """Always False: group norm is lowered to LiteRT builtins, never as a composite."""
        return False

    @enable_group_norm_composite.setter
    def enable_group_norm_composite(self, value: bool) -> None:
        if value:
            raise NotImplementedError("litert_torch.config.enable_group_norm_composite = True: group norm is lowered "
                                      "to LiteRT builtins; to emit one op for it, mark it with "
                                      "litert_torch.hlfb.StableHLOCompositeBuilder and register a composite lowering")

    @property
    def layout_optimize_partitioner(self) -> str:
        """Always ``"DEFAULT"``: the edge backend chooses layouts itself."""
        return "DEFAULT"

    @layout_optimize_partitioner.setter
    def layout_optimize_partitioner(self, value: str) -> None:
        if str(value).upper() != "DEFAULT":
            raise NotImplementedError(f"litert_torch.config.layout_optimize_partitioner = {value!r}: the edge backend "
                                      "chooses channel-last layouts itself; use litert_torch.to_channel_last_io for "
                                      "the model's inputs and outputs")

    def __repr__(self) -> str:
        fields = ("in_oss", "show_progress", "silence_torch_logs", "resource_constant_numel_threshold",
                  "enable_group_norm_composite", "layout_optimize_partitioner")
        return "litert_torch.config(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in fields) + ")"


config = Config()
