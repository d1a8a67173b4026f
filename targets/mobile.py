"""android / ios: NHWC image I/O by default, float16 weights on request for the GPU delegates."""

from __future__ import annotations

__all__ = ["channel_last_io", "lower_edge", "write_edge"]


def channel_last_io(prog) -> dict:
    """{signature: (input indices, output indices)} of the 4-D float tensors (image-like) at the boundary.

    Those are laid out NHWC in the .tflite (``to_channel_last_io`` semantics: the graph keeps torch's
    math, only the boundary tensors change layout), as camera frames and GPU delegates expect.
    """
    out = {}
    for name, sig in prog.signatures.items():
        def image(spec):
            return len(spec.shape) == 4 and spec.dtype.is_floating_point

        out[name] = (tuple(i for i, s in enumerate(sig.inputs) if image(s)),
                     tuple(i for i, s in enumerate(sig.outputs) if image(s)))
    return out


def _io(prog, channel_last):
    if channel_last is True:
        return channel_last_io(prog)
    if channel_last is False or channel_last is None:
        return None
    return channel_last


def lower_edge(prog, *, channel_last: bool | dict | tuple = False) -> bytes:
    """Program -> float .tflite via the edge backend; ``channel_last``: True = every image I/O (above),
    False = torch's layout, or an explicit to_channel_last_io spec passed through."""
    from tpu_export import edge

    return edge.convert_program(prog, to_channel_last_io=_io(prog, channel_last))


def write_edge(prog, path, *, channel_last: bool | dict | tuple = False, progress=None) -> str:
    """``lower_edge`` written straight into ``path`` (atomically), the weights streamed from where they
    live: no whole-model bytes object, and past 2 GiB the schema's large-model form. A model under 2 GiB
    gets the same bytes as ``lower_edge``. Returns the absolute path."""
    from tpu_export.edge.convert import write_program

    return write_program(prog, path, to_channel_last_io=_io(prog, channel_last), progress=progress)
