"""targets: named deployment targets (tpu-v5e ... android, web, iot) and their checks."""

from .registry import TARGETS, Target, UnknownTargetError, get_target

__all__ = ["TARGETS", "Target", "UnknownTargetError", "get_target"]
