"""Regenerate docs/ops.md from the op-test rows: ``python -m tests.write_ops_doc``.

The rows live in the test suite, so the writer does too: shipped code (tpu_export/op_support.py)
takes them as an argument and never imports tests/.
"""

from __future__ import annotations

import functools
import os
import sys

from tests.op_rows import ROWS, OpModule, row_inputs

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "ops.md")


@functools.lru_cache(maxsize=None)
def op_row_scan():
    """The rows' scan, once per process (exporting every row is the expensive part)."""
    from tpu_export.op_support import scan_rows

    return scan_rows(ROWS, lambda row: (OpModule(row), row_inputs(row)))


def main() -> int:
    from tpu_export.converter.atomic import write_file
    from tpu_export.op_support import render_markdown

    write_file(DOCS, render_markdown(op_row_scan()).encode())
    print(f"wrote {DOCS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
