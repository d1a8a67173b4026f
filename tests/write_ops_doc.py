"""Regenerate docs/ops.md from the op-test rows: ``python -m tests.write_ops_doc``.

The rows live in the test suite, so the writer does too: shipped code (tpu_export/op_support.py)
takes them as an argument and never imports tests/.

The table is written against one torch minor release (REFERENCE_TORCH) and names no patch release. Where another
tested minor release renders rows differently (torch 2.14 decomposes ``norm`` into other LiteRT builtins), the doc
records those rows, as that release renders them, in a section per release; run the writer on that release to
update its section. tests/test_op_support.py checks the doc on whichever torch it runs on.
"""

from __future__ import annotations

import functools
import os
import sys

from tests.op_rows import ROWS, OpModule, row_inputs

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "ops.md")

# The torch minor release the main table is rendered against.
REFERENCE_TORCH = "2.13"
OTHER_RELEASES = "## Rows that differ on other torch releases"
_INTRO = ("The table above is rendered on torch {ref}. On the releases below these rows read differently (each as "
          "that release renders it; `tests/test_op_support.py` checks them when it runs there, and "
          "`python -m tests.write_ops_doc` run on that release rewrites its section).")


@functools.lru_cache(maxsize=None)
def op_row_scan():
    """The rows' scan, once per process (exporting every row is the expensive part)."""
    from tpu_export.op_support import scan_rows

    return scan_rows(ROWS, lambda row: (OpModule(row), row_inputs(row)))


def torch_minor() -> str:
    import torch

    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def _rendered(scan) -> str:
    """op_support's rendering, its header naming the minor release only (a patch release changes no row)."""
    import torch

    from tpu_export.op_support import render_markdown

    full = torch.__version__.split("+")[0]
    return render_markdown(scan).replace(f"against torch {full};", f"against torch {torch_minor()};", 1)


def _row_key(line: str) -> str | None:
    """The overload a table row is about (`| `aten.x.y` | ...`), else None."""
    if line.startswith("| `"):
        return line.split("|", 2)[1].strip()
    return None


def split_doc(text: str) -> tuple[str, dict[str, dict[str, str]]]:
    """docs/ops.md -> (the main table as rendered on REFERENCE_TORCH, {minor release: {overload: row}})."""
    main, _, rest = text.partition("\n" + OTHER_RELEASES + "\n")
    releases: dict[str, dict[str, str]] = {}
    current = None
    for line in rest.splitlines():
        if line.startswith("### torch "):
            current = releases.setdefault(line.removeprefix("### torch ").strip(), {})
        elif current is not None and _row_key(line):
            current[_row_key(line)] = line
    return main, releases


def join_doc(main: str, releases: dict[str, dict[str, str]]) -> str:
    if not releases:
        return main
    out = [main.rstrip("\n"), "", OTHER_RELEASES, "", _INTRO.format(ref=REFERENCE_TORCH)]
    header = next(line for line in main.splitlines() if line.startswith("| overload |"))
    for minor in sorted(releases, key=lambda v: tuple(int(p) for p in v.split("."))):
        out += ["", f"### torch {minor}", "", header, "|---|---|---|---|---|---|", *releases[minor].values()]
    return "\n".join(out) + "\n"


def as_on(main: str, minor: str, rows: dict[str, str]) -> str:
    """The main table as `minor` renders it: its header names that release, and the recorded rows replace theirs."""
    lines = main.replace(f"against torch {REFERENCE_TORCH};", f"against torch {minor};", 1).splitlines()
    return "\n".join(rows.get(_row_key(line), line) for line in lines) + "\n"


def differing_rows(reference: str, rendered: str) -> dict[str, str]:
    """The rows `rendered` (another release's table) has differently from `reference`; anything but a changed row
    (an overload added or dropped, a changed count) is a ValueError: the doc records per-release rows only."""
    ref, new = reference.splitlines(), rendered.splitlines()
    ref_rows = {_row_key(line): line for line in ref if _row_key(line)}
    new_rows = {_row_key(line): line for line in new if _row_key(line)}
    if list(ref_rows) != list(new_rows):
        added, dropped = sorted(set(new_rows) - set(ref_rows)), sorted(set(ref_rows) - set(new_rows))
        raise ValueError(f"{DOCS}: torch {torch_minor()} lists other overloads than torch {REFERENCE_TORCH} "
                         f"(added {added}, dropped {dropped}): the per-release section records changed rows only")
    others = [(a, b) for a, b in zip(ref, new) if not _row_key(a) and a != b and "against torch" not in a]
    if len(ref) != len(new) or others:
        raise ValueError(f"{DOCS}: torch {torch_minor()} changes lines other than table rows ({others[:2]}): "
                         "the per-release section records rows only")
    return {key: line for key, line in new_rows.items() if ref_rows[key] != line}


def expected_doc(scan, current: str) -> str:
    """docs/ops.md as it should read after a run on this torch: on REFERENCE_TORCH the main table is re-rendered
    and the other releases' sections are kept; on another release only that release's section is rewritten."""
    main, releases = split_doc(current)
    minor = torch_minor()
    if minor == REFERENCE_TORCH:
        return join_doc(_rendered(scan), releases)
    rows = differing_rows(as_on(main, minor, {}), _rendered(scan))
    return join_doc(main, {**releases, minor: rows} if rows else {k: v for k, v in releases.items() if k != minor})


def main() -> int:
    from tpu_export.converter.atomic import write_file

    with open(DOCS) as f:
        current = f.read()
    write_file(DOCS, expected_doc(op_row_scan(), current).encode())
    print(f"wrote {DOCS} (torch {torch_minor()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
