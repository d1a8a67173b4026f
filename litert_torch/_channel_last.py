"""to_channel_last_io: take chosen inputs and give chosen outputs channel-last (NHWC).

The wrapper permutes at the module boundary in torch; the edge layout pass runs convolutions
in NHWC anyway, so those permutes cancel and the written model has no TRANSPOSE at all.
"""

from __future__ import annotations

import torch

__all__ = ["to_channel_last_io", "ChannelLastIOWrapper"]


def _to_first(x):  # (N, *spatial, C) -> (N, C, *spatial)
    return x.permute(0, x.dim() - 1, *range(1, x.dim() - 1))


def _to_last(x):  # (N, C, *spatial) -> (N, *spatial, C)
    return x.permute(0, *range(2, x.dim()), 1)


class ChannelLastIOWrapper(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, args=(), outputs=()):
        super().__init__()
        self.module = module
        self._args = set(args or ())
        self._outputs = set(outputs or ())

    def forward(self, *args, **kwargs):
        args = [_to_first(a) if i in self._args else a for i, a in enumerate(args)]
        out = self.module(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            return _to_last(out) if 0 in self._outputs else out
        if isinstance(out, (tuple, list)):
            return type(out)(_to_last(o) if i in self._outputs else o for i, o in enumerate(out))
        return out


def to_channel_last_io(module: torch.nn.Module, args=None, outputs=None) -> torch.nn.Module:
    """Wrap ``module``: inputs at indices ``args`` are taken NHWC (N, H, W, C), outputs at indices
    ``outputs`` are returned NHWC. Convert the wrapper with channel-last sample inputs."""
    return ChannelLastIOWrapper(module, args or [], outputs or [])
