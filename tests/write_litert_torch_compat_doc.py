"""Regenerate docs/litert_torch_compat.md: ``python -m tests.write_litert_torch_compat_doc``.

ROWS are litert-torch 0.10-style calls, run against tpu_export.litert_torch (bound to the name ``litert_torch``).
Each row says whether the call works here or is refused (NotImplementedError naming what was asked for); the page
shows each call, its outcome and, for a refusal, the message the user gets. tests/test_litert_torch_compat.py runs
every row and checks that the page is current.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import tempfile

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "litert_torch_compat.md")

WORKS, REFUSED = "works", "refused"


@dataclasses.dataclass(frozen=True)
class Row:
    area: str
    code: str  # run with: litert_torch, torch, m (Linear+ReLU), x (sample), tmp (a folder), check(model)
    outcome: str  # WORKS or REFUSED
    name: str = ""  # a refusal's message names this
    note: str = ""  # for a working call: what it does here


_M = "m, (x,)"
ROWS = [
    # the package
    Row("package", "assert isinstance(litert_torch.__version__, str)", WORKS, note="tpu-export's version"),
    Row("package", f"check(litert_torch.convert({_M}))", WORKS),
    Row("package", f"check(litert_torch.signature('a', {_M}).signature('b', {_M}).convert(), 'a')", WORKS),
    Row("package", f"litert_torch.convert({_M}).export(tmp + '/m.tflite'); check(litert_torch.load(tmp + "
                   "'/m.tflite'))", WORKS),
    Row("package", "litert_torch.to_channel_last_io(torch.nn.Conv2d(3, 4, 1), args=[0])", WORKS),
    Row("package", "litert_torch.experimental_add_compilation_backend()", REFUSED,
        "experimental_add_compilation_backend"),
    Row("package", f"litert_torch.signature('a', {_M}).experimental_add_compilation_backend()", REFUSED,
        "experimental_add_compilation_backend"),
    *[Row("package", f"litert_torch.{n}", REFUSED, f"litert_torch.{n}")
      for n in ("converter_v2", "backend", "fx_infra", "examples", "testing", "cli", "progress", "version",
                "model")],
    # litert_torch.config
    Row("config", "assert litert_torch.config.in_oss", WORKS),
    Row("config", "litert_torch.config.show_progress = True; check(litert_torch.convert(m, (x,)))", WORKS,
        note="convert prints a line per long step"),
    Row("config", "litert_torch.config.resource_constant_numel_threshold = 1 << 20", WORKS,
        note="accepted; weights stream with output_file_path / lightweight_conversion"),
    Row("config", "litert_torch.config.enable_group_norm_composite = True", REFUSED, "enable_group_norm_composite"),
    Row("config", "litert_torch.config.layout_optimize_partitioner = 'MINCUT'", REFUSED,
        "layout_optimize_partitioner"),
    Row("config", "litert_torch.config.silence_torch_logs = False", REFUSED, "silence_torch_logs"),
    # convert() arguments
    Row("convert", f"check(litert_torch.convert({_M}, strict_export=False, enable_x64=False, "
                   "lightweight_conversion=True))", WORKS),
    Row("convert", f"check(litert_torch.convert({_M}, output_file_path=tmp + '/o.tflite', "
                   "delete_in_memory_params=False))", WORKS),
    Row("convert", f"check(litert_torch.convert({_M}, enable_debug=True, debug_dir=tmp + '/dbg')); "
                   "assert os.path.isfile(tmp + '/dbg/model.tflite')", WORKS,
        note="writes the captured graphs, each stage's program and the .tflite to debug_dir"),
    Row("convert", f"check(litert_torch.convert({_M}, use_v2=False))", WORKS),
    Row("convert", f"litert_torch.convert({_M}, use_v2=True)", REFUSED, "use_v2"),
    Row("convert", f"check(litert_torch.convert({_M}, runtime_constant_folding=True))", WORKS,
        note="constants are always folded"),
    Row("convert", f"litert_torch.convert({_M}, runtime_constant_folding=False)", REFUSED, "runtime_constant_folding"),
    Row("convert", f"litert_torch.convert({_M}, export_dir=tmp)", REFUSED, "export_dir"),
    Row("convert", f"check(litert_torch.convert({_M}, fold_fp16_resource_casts=False))", WORKS,
        note="converter V2 only in litert-torch too: no effect"),
    Row("convert", f"litert_torch.convert({_M}, allow_reuse_intermediates=True)", REFUSED,
        "allow_reuse_intermediates"),
    Row("convert", f"litert_torch.convert({_M}, enable_timing=True)", REFUSED, "enable_timing"),
    Row("convert", f"litert_torch.convert({_M}, print_ir_after='.*')", REFUSED, "print_ir_after"),
    Row("convert", f"litert_torch.convert({_M}, print_ir_before='.*')", REFUSED, "print_ir_before"),
    Row("convert", f"litert_torch.convert({_M}, elide_elementsattrs_if_larger=16)", REFUSED,
        "elide_elementsattrs_if_larger"),
    # _litert_converter_flags
    Row("flags", f"check(litert_torch.convert({_M}, _litert_converter_flags="
                 "{'enable_composite_direct_lowering': False}))", WORKS, note="composites lowered op by op"),
    Row("flags", f"check(litert_torch.convert({_M}, _litert_converter_flags={{'model_origin_framework': "
                 "'PYTORCH'}))", WORKS),
    Row("flags", f"check(litert_torch.convert({_M}, _litert_converter_flags={{'debug_dir': tmp + '/d2'}}))", WORKS,
        note="the same as debug_dir="),
    Row("flags", f"litert_torch.convert({_M}, _litert_converter_flags={{'_experimental_unfold_batch_matmul': "
                 "False})", REFUSED, "_experimental_unfold_batch_matmul"),
    Row("flags", f"litert_torch.convert({_M}, _litert_converter_flags={{'allow_custom_ops': True}})", REFUSED,
        "allow_custom_ops"),
    Row("flags", f"litert_torch.convert({_M}, _litert_converter_flags={{'debug_options': {{'enable_timing': "
                 "True}})", REFUSED, "debug_options"),
    # litert_torch.quantize: PT2E (torchao's prepare_pt2e / convert_pt2e with litert-torch's quantizer)
    Row("quantize", "from litert_torch.quantize.pt2e_quantizer import PT2EQuantizer, "
                    "get_symmetric_quantization_config\n"
                    "from litert_torch.quantize.quant_config import QuantConfig\n"
                    "from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e, convert_pt2e\n"
                    "q = PT2EQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))\n"
                    "p = prepare_pt2e(torch.export.export(m, (x,)).module(), q); p(x)\n"
                    "check(litert_torch.convert(convert_pt2e(p, fold_quantize=False), (x,), "
                    "quant_config=QuantConfig(pt2e_quantizer=q)), atol=0.05)", WORKS,
        note="int8 kernels with the observed scales"),
    Row("quantize", "from litert_torch.quantize.quant_config import QuantConfig\n"
                    "litert_torch.convert(m, (x,), quant_config=QuantConfig(generative_recipe=object()))", REFUSED,
        "generative_recipe"),
    # generative.quantize
    Row("quant_recipes", f"check(litert_torch.convert({_M}, quant_config=quant_recipes.full_dynamic_recipe()), "
                         "atol=0.05)", WORKS, note="dynamic_int8"),
    Row("quant_recipes", f"check(litert_torch.convert({_M}, quant_config=quant_recipes.full_weight_only_recipe()), "
                         "atol=0.05)", WORKS, note="weight_only_int8"),
    Row("quant_recipes", f"check(litert_torch.convert({_M}, quant_config=quant_recipes.full_fp16_recipe()), "
                         "atol=0.01)", WORKS, note="fp16"),
    Row("quant_recipes", f"check(litert_torch.convert({_M}, quant_config=quant_recipes.full_dynamic_recipe("
                         "weight_dtype=quant_attrs.Dtype.INT4, granularity=quant_attrs.Granularity.BLOCKWISE_32)), "
                         "atol=0.3)", WORKS, note="dynamic_int4_block32"),
    Row("quant_recipes", "quant_recipes.full_dynamic_recipe(weight_dtype=quant_attrs.Dtype.INT4, "
                         "granularity=quant_attrs.Granularity.BLOCKWISE_64)", WORKS,
        note="int4 blocks of 64 (also 128, 256), an ai-edge-quantizer recipe"),
    Row("quant_recipes", "quant_recipes.full_weight_only_recipe(weight_dtype=quant_attrs.Dtype.INT4)", WORKS,
        note="weight_only_int4"),
    Row("quant_recipes", "quant_recipes.full_dynamic_recipe(granularity=quant_attrs.Granularity.BLOCKWISE_32)",
        REFUSED, "LayerQuantRecipe"),
    Row("quant_recipes", "quant_recipe.GenerativeQuantRecipe(default=quant_recipe_utils.create_layer_quant_fp16())"
                         ".quant_config()", WORKS, note="fp16"),
    Row("quant_recipes", "quant_recipe.GenerativeQuantRecipe(default=quant_recipe_utils.create_layer_quant_dynamic(),"
                         " attention={0: quant_recipe_utils.create_layer_quant_fp16()}).quant_config()", REFUSED,
        "attention="),
    Row("quant_recipes", "assert len(supported_schemes.get_supported_layer_schemes()) == 9", WORKS),
    # hlfb
    Row("hlfb", "check(litert_torch.convert(Marked().eval(), (x,)), ref=Marked()(x))", WORKS,
        note="one op where a composite lowering is registered, op by op otherwise"),
    Row("hlfb", "litert_torch.hlfb.mark_pattern", REFUSED, "hlfb.mark_pattern"),
    # debug
    Row("debug", "assert list(litert_torch.debug.find_culprits(m, (x,))) == []", WORKS,
        note="bisects the graph; `tpu-export debug MODEL` on the command line"),
    # generative
    Row("generative", "from litert_torch.generative.layers import kv_cache", REFUSED, "generative.layers"),
    Row("generative", "from litert_torch.generative.examples import gemma", REFUSED, "generative.examples"),
    Row("generative", "from litert_torch.generative.utilities import model_builder", REFUSED, "generative.utilities"),
    Row("generative", "import litert_torch.generative.examples.gemma3.gemma3", REFUSED, "generative.examples"),
    Row("generative", "import litert_torch.generative.layers.attention", REFUSED, "generative.layers"),
    *[Row("generative", f"litert_torch.generative.{n}", REFUSED, f"generative.{n}")
      for n in ("custom_ops", "fx_passes", "tools")],
    Row("generative", "assert callable(litert_torch.generative.export_hf.export)", WORKS,
        note="export_hf.export(..., quantization_recipe=quant_recipes.full_dynamic_recipe()) too"),
]


def _namespace(tmp: str) -> dict:
    import torch

    from tpu_export import litert_torch
    from tpu_export.litert_torch.generative.quantize import (
        quant_attrs,
        quant_recipe,
        quant_recipe_utils,
        quant_recipes,
        supported_schemes,
    )

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU()).eval()
    x = torch.randn(2, 32)

    class Marked(torch.nn.Module):
        def forward(self, x):
            b = litert_torch.hlfb.StableHLOCompositeBuilder("odml.compat_demo", attr={"k": 1})
            return b.mark_outputs(torch.tanh(b.mark_inputs(x)) * 2) + 1

    def check(model, signature_name=None, atol=1e-5, ref=None):
        """The converted model against torch eager on the LiteRT interpreter."""
        kw = {"signature_name": signature_name} if signature_name else {}
        want = (m(x) if ref is None else ref).detach()
        got = model(x, **kw)
        torch.testing.assert_close(got, want, atol=atol, rtol=0)

    return {"torch": torch, "os": os, "litert_torch": litert_torch, "m": m, "x": x, "tmp": tmp, "check": check,
            "Marked": Marked, "quant_attrs": quant_attrs, "quant_recipe": quant_recipe,
            "quant_recipe_utils": quant_recipe_utils, "quant_recipes": quant_recipes,
            "supported_schemes": supported_schemes}


def _run(code: str, ns: dict) -> None:
    # the page shows `from litert_torch...` as 0.10 users write it; here the facade answers to that name
    code = code.replace("from litert_torch.", "from tpu_export.litert_torch.")
    code = code.replace("import litert_torch.", "import tpu_export.litert_torch.")
    exec(compile(code, "<row>", "exec"), ns)  # noqa: S102 - the rows are this file's own code


@functools.lru_cache(maxsize=None)
def run_row(i: int) -> tuple[str, str]:
    """(outcome, message): WORKS and "", or REFUSED and the NotImplementedError's text; another exception is
    returned as ("error", its type and text)."""
    saved = dict(os.environ)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            ns = _namespace(tmp)
            try:
                _run(ROWS[i].code, ns)
            except NotImplementedError as e:
                return REFUSED, str(e).replace(tmp, "tmp")
            except Exception as e:  # noqa: BLE001 - reported as the row's outcome
                return "error", f"{type(e).__name__}: {e}".replace(tmp, "tmp")
            return WORKS, ""
    finally:  # config setters write environment variables; a row leaves none behind
        os.environ.clear()
        os.environ.update(saved)


_GUIDE = """
## Guide

**Quantization recipes.** `litert_torch.generative.quantize.quant_recipes.full_*_recipe()` return a
`litert_torch.QuantConfig` of one of this project's schemes, for `convert(..., quant_config=...)` and
`export_hf.export(..., quantization_recipe=...)`:

```python
from litert_torch.generative.quantize import quant_attrs, quant_recipes

model = litert_torch.convert(module, args, quant_config=quant_recipes.full_dynamic_recipe())   # dynamic_int8
int4 = quant_recipes.full_dynamic_recipe(weight_dtype=quant_attrs.Dtype.INT4,
                                         granularity=quant_attrs.Granularity.BLOCKWISE_32)   # dynamic_int4_block32
```

**Composites.** `litert_torch.hlfb.StableHLOCompositeBuilder(name, attr)` marks a region of the model (identity
custom ops that `torch.export` keeps). Where a lowering is registered for the composite's name the region becomes
that lowering's ops; otherwise it is lowered op by op, with the same numbers:

```python
import numpy as np
from litert_torch import hlfb

class Block(torch.nn.Module):
    def forward(self, x):
        b = hlfb.StableHLOCompositeBuilder(name="odml.gelu_tanh", attr={"approximate": "tanh"})
        x = b.mark_inputs(x)
        y = 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))
        return b.mark_outputs(y)

@hlfb.composite_lowering("odml.gelu_tanh")           # the LiteRT backend (backend="tpu": see below)
def gelu(lw, x, *, approximate):                     # marked inputs in order, attributes by name
    return lw.op("GELU", [lw.tensor(x)], x.shape, x.dtype, x.perm,
                 lw.options("Gelu", approximate=approximate == "tanh"))
```

The lowering sees only the marked inputs and the attributes (mark the weights the region reads, if it needs
them). `_litert_converter_flags={"enable_composite_direct_lowering": False}` lowers every region op by op;
`hlfb.composite_op(name)` is the region's op, for `@edge.lowering(...)` directly. For the TPU backend, register
with `backend="tpu"` (a jax function) and convert with
`tpu_backend.export_program(hlfb.apply_composites(converter.prepare(m, args), "tpu"))`.

**Finding what fails.** `litert_torch.debug.find_culprits(model, args)` bisects the captured graph: each part is
cut out as a module of its own, converted and run on the LiteRT interpreter against torch's values; it yields the
smallest parts that fail to convert, fail to run, or differ past `atol` + `rtol`, each with your source lines and
a runnable snippet (`culprit.print_code()`). On the command line: `tpu-export debug package.module:factory`
(or a `.pt2` file). `convert(..., enable_debug=True, debug_dir=folder)` writes the torch.export graph, the
decomposed graph, the program after each shared pass and the `.tflite` to the folder.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def expected_doc() -> str:
    lines = [
        "# litert-torch 0.10 compatibility",
        "",
        "Generated by `python -m tests.write_litert_torch_compat_doc`; `tests/test_litert_torch_compat.py` runs "
        "every call below against `tpu_export.litert_torch` (imported as `litert_torch`) and checks that this page "
        "is current. A working call that returns a model is checked against torch eager on the LiteRT "
        "interpreter. A refused call raises `NotImplementedError` with the message shown, which names what was "
        "asked for and what to use instead.",
        "",
        "In the calls, `m` is a small `Linear` + `ReLU` module, `x` its sample input, `check(model)` compares the "
        "converted model with `m(x)`, and `Marked` is a module with one `StableHLOCompositeBuilder` region.",
        "",
    ]
    lines += _GUIDE.strip("\n").splitlines() + [""]
    areas: dict[str, list[int]] = {}
    for i, r in enumerate(ROWS):
        areas.setdefault(r.area, []).append(i)
    works = sum(run_row(i)[0] == WORKS for i in range(len(ROWS)))
    lines += [f"{len(ROWS)} calls: {works} work, {len(ROWS) - works} are refused by name.", ""]
    for area, idx in areas.items():
        lines += [f"## {area}", "", "| call | here |", "|---|---|"]
        for i in idx:
            outcome, msg = run_row(i)
            what = ROWS[i].note if outcome == WORKS else msg
            label = "works" if outcome == WORKS else ("refused" if outcome == REFUSED else "ERROR")
            lines.append(f"| `{_cell(ROWS[i].code)}` | {label}{': ' + _cell(what) if what else ''} |")
        lines.append("")
    return "\n".join(lines)


README = os.path.join(os.path.dirname(DOCS), os.pardir, "README.md")
_BEGIN, _END = "<!-- litert-torch-compat: generated by tests/write_litert_torch_compat_doc.py -->", \
    "<!-- /litert-torch-compat -->"


def readme_block() -> str:
    """The README's drop-in summary: how many 0.10-style calls the test runs, how many work, how many are refused."""
    works = sum(r.outcome == WORKS for r in ROWS)
    areas = ", ".join(dict.fromkeys(r.area for r in ROWS if r.outcome == WORKS))
    return (f"{_BEGIN}\nOf {len(ROWS)} litert-torch 0.10 calls the tests run, {works} work ({areas}) and "
            f"{len(ROWS) - works} are refused by name with the alternative: [the list](docs/litert_torch_compat.md).\n"
            f"{_END}")


def readme_with_block(readme: str) -> str:
    start, end = readme.index(_BEGIN), readme.index(_END) + len(_END)
    return readme[:start] + readme_block() + readme[end:]


def main() -> int:
    text = expected_doc()
    with open(DOCS, "w", encoding="utf-8") as f:
        f.write(text)
    with open(README, encoding="utf-8") as f:
        readme = f.read()
    with open(README, "w", encoding="utf-8") as f:
        f.write(readme_with_block(readme))
    print(f"wrote {DOCS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
