"""Regenerate docs/torch_compat.md from converter/_torch_compat.py: ``python -m tests.write_torch_compat_doc``."""

from __future__ import annotations

import os
import sys

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "torch_compat.md")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    from tpu_export.converter import _torch_compat as c

    lines = [
        "# Torch compatibility",
        "",
        "tpu-export runs on a range of torch releases. Every private torch name it relies on (a leading",
        "underscore anywhere in the path, and `torch.fx.experimental`) is reached through one internal module,",
        "`tpu_export/converter/_torch_compat.py` (`converter/_torch_compat.py` in the repository).",
        "`tests/test_no_private_torch.py` keeps every other shipped file off them, and",
        "`tests/converter/test_torch_compat.py` calls each function on the running torch, so a release that moves",
        "a private name fails there, in one place.",
        "",
        f"Checked on torch {' and '.join(c.CHECKED_ON)}.",
        "",
        "## Private torch APIs we depend on",
        "",
        "| function | private torch API | why | public alternative |",
        "| --- | --- | --- | --- |",
    ]
    for u in c.USES:
        lines.append(f"| `{u.function}` | `{_cell(u.private)}` | {_cell(u.why)} | {_cell(u.public)} |")
    lines += [
        "",
        "## Replaced by public APIs",
        "",
        "| private torch API (no longer used) | public API used instead | where |",
        "| --- | --- | --- |",
    ]
    for r in c.REPLACED:
        lines.append(f"| `{_cell(r.private)}` | `{_cell(r.public)}` | {_cell(r.where)} |")
    lines += ["", "Regenerate this page with `python -m tests.write_torch_compat_doc`.", ""]
    return "\n".join(lines)


def main() -> int:
    from tpu_export.converter.atomic import write_file

    write_file(DOCS, render().encode())
    print(f"wrote {DOCS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
