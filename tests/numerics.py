"""The one relative-error metric of the test suite: the library's own (tpu_export.converter.numerics, which
convert-lm's check of its artifacts uses too), so that a test and the shipped check measure alike."""

from __future__ import annotations

from tpu_export.converter.numerics import FLOOR, rel_err

__all__ = ["FLOOR", "rel_err"]
