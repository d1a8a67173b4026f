"""Reading a written .tflite back: its op histogram, and running it in the LiteRT interpreter."""

from __future__ import annotations

import numpy as np

from .builder import builtin_names, schema

__all__ = ["op_histogram", "run_tflite", "read_model"]


def read_model(data: bytes):
    s = schema()
    return s.ModelT.InitFromObj(s.Model.GetRootAs(data, 0))


def op_histogram(data: bytes, subgraph: int | None = None) -> dict[str, int]:
    """Builtin op name -> count, over one subgraph or all of them."""
    s = schema()
    m = s.Model.GetRootAs(data, 0)
    names = builtin_names()
    codes = [max(m.OperatorCodes(i).BuiltinCode(), m.OperatorCodes(i).DeprecatedBuiltinCode())
             for i in range(m.OperatorCodesLength())]
    hist: dict[str, int] = {}
    for g in range(m.SubgraphsLength()):
        if subgraph is not None and g != subgraph:
            continue
        sg = m.Subgraphs(g)
        for i in range(sg.OperatorsLength()):
            k = names[codes[sg.Operators(i).OpcodeIndex()]]
            hist[k] = hist.get(k, 0) + 1
    return hist


def run_tflite(data: bytes, inputs: dict, signature: str | None = None, num_threads: int | None = None) -> dict:
    """Run one signature in the LiteRT interpreter (XNNPACK); inputs/outputs by name."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=data, num_threads=num_threads)
    runner = interp.get_signature_runner(signature)
    return runner(**{k: np.asarray(v) for k, v in inputs.items()})
