"""Run an artifact through PJRT: ``tpu_backend.load(path)(*args, signature_name=...)``.

Weights go to the device once, at load. Each call converts the inputs (torch tensors or numpy
arrays, in the dtypes torch uses: int64 ids become the signature's int32) and returns torch
tensors in the output's pytree. The program runs on jax's default backend (TPU, GPU, else
CPU). By default the StableHLO is compiled here. Stored executables are machine code, so
loading one is opt-in (``load(path, use_compiled=True)``): then an executable compiled for
platform "tpu", for exactly this chip's device kind, jaxlib/libtpu versions and input shapes
is loaded and run. Why none was used is logged once per program.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from tpu_export.converter.input_check import InputValueError, bind_inputs, check_inputs

from .artifact import structure
from .artifact.dtypes import numpy_to_torch, torch_to_numpy_array
from .artifact.versions import runtime_versions
from .host import x64_scope
from .sharding import MeshSpec, named_sharding

__all__ = ["load", "TpuProgram", "current_platform"]

log = logging.getLogger(__name__)


def load(path: str | os.PathLike[str], *, verify: bool = True, use_compiled: bool = False, isolate: bool = False,
         isolate_timeout: float = 30.0) -> TpuProgram:
    """Load a TPU artifact (a ``.tpuexp`` directory or ``.zip``) and put its weights on the device.

    The program runs on jax's default backend: a TPU, else a GPU, else this machine's CPU (the artifact must
    have been exported for that platform; the default export covers TPU and CPU). The StableHLO is compiled
    here, on the first call of each signature and input shape. Nothing in the artifact is executed while it is
    read: weights are safetensors, the manifest is checked field by field and every file against its sha256.

    Args:
        path: The artifact: a directory, or a ``.zip`` of one.
        verify: Check every file against the sha256 recorded in the manifest (on by default).
        use_compiled: Run the stored TPU executables made for exactly this chip, these jaxlib/libtpu versions and
            these input shapes instead of compiling here. They are machine code: pass True only for artifacts
            you trust as much as code you run.
        isolate: For artifacts from untrusted sources: parse each export in a child process first, so that one
            that crashes or hangs jaxlib's parser is an ``ArtifactCorruptError`` here (about 1-2 s per load).
        isolate_timeout: Seconds each child parse may take (with ``isolate``).

    Returns:
        The loaded program, called like the PyTorch module it was exported from.

    Raises:
        tpu_export.tpu_backend.ArtifactError: ``path`` is not a readable artifact directory or ``.zip``.
        tpu_export.tpu_backend.ArtifactVersionError: The artifact's format version is outside the window this
            release reads.
        tpu_export.tpu_backend.ArtifactCorruptError: A file is missing, truncated or does not match its sha256.
        tpu_export.tpu_backend.ManifestError: ``manifest.json`` is malformed or was edited.
        RuntimeError: The artifact was not exported for the platform jax runs on here.

    Examples:
        >>> import os, tempfile
        >>> import torch
        >>> from tpu_export import converter, tpu_backend
        >>> m = torch.nn.Linear(4, 2).eval()
        >>> path = os.path.join(tempfile.mkdtemp(), "m.tpuexp")
        >>> _ = tpu_backend.export_program(converter.prepare(m, (torch.ones(1, 4),))).save(path)
        >>> prog = tpu_backend.load(path)          # on a machine without a TPU: jax's CPU backend
        >>> prog(torch.ones(1, 4)).shape
        torch.Size([1, 2])
        >>> prog.signature_names
        ['serving_default']
    """
    from .artifact.load import read_artifact
    from .host import prepare_cpu_host

    prepare_cpu_host()  # the first jax use of a process that only loads: libtpu starts quiet
    art = read_artifact(path, verify=verify, load_executables=use_compiled, isolate=isolate,
                        isolate_timeout=isolate_timeout)
    return TpuProgram(
        signatures=art.signatures, weights=art.weights, manifest=art.manifest, compiled=art.compiled,
        source=os.fspath(path), use_compiled=use_compiled,
    )


def current_platform(devices) -> str:
    p = devices[0].platform
    return {"gpu": "cuda"}.get(p, p)


class TpuProgram:
    """A loaded TPU artifact, called like the PyTorch module it was exported from (and like the edge ``Model``).

    ``tpu_backend.load(path)`` makes one from an artifact on disk, ``ExportedBundle.to_program()`` (or calling
    the bundle) from one in memory. ``prog(*args, signature_name=..., **kwargs)`` checks the inputs against the
    signature (names, rank, dims and their ranges, dtype; int64 ids become the signature's int32), runs it and
    returns torch tensors in the structure the module returned.

    Attributes:
        source: The artifact's path (``"<in-memory bundle>"`` for a bundle).
        manifest: The artifact's checked ``manifest.json``.
        platform: The platform it runs on here (``"tpu"``, ``"cuda"``, ``"cpu"``...).
        devices: The jax devices it runs on.

    Examples:
        >>> import torch
        >>> from tpu_export import converter, tpu_backend
        >>> m = torch.nn.Linear(4, 2).eval()
        >>> bundle = tpu_backend.export_program(converter.prepare(m, (torch.ones(1, 4),)))
        >>> prog = bundle.to_program()             # or tpu_backend.load(path) for a saved artifact
        >>> out = prog(torch.ones(1, 4))
        >>> out.shape, out.dtype
        (torch.Size([1, 2]), torch.float32)
        >>> prog(torch.ones(1, 5))
        Traceback (most recent call last):
        ...
        tpu_export.converter.input_check.InputValueError: input 'input' has shape [1, 5]; ...
    """

    def __init__(self, *, signatures, weights, manifest, compiled, source, use_compiled=False,
                 stored_platforms=("tpu",)):
        import jax

        self.source = source
        self.manifest = manifest
        self._sigs = signatures
        self._compiled = compiled
        self._use_compiled = use_compiled
        # Platforms whose stored executables may run: "tpu" only for anything read from a file.
        # None (any) is for an in-memory bundle, whose executables this process compiled itself.
        self._stored_platforms = stored_platforms
        self._x64 = bool(manifest.get("enable_x64"))
        self.mesh_spec = MeshSpec.from_json(manifest["mesh"]) if manifest.get("mesh") else None
        self.devices = jax.devices()
        self.platform = current_platform(self.devices)
        if self.platform not in manifest["platforms"]:
            raise RuntimeError(
                f"{source}: exported for platforms {manifest['platforms']}, but jax runs on {self.platform} here. "
                f"Re-export with platforms including {self.platform!r}."
            )
        self.mesh = self.mesh_spec.concrete(self.devices) if self.mesh_spec else None
        table = manifest["weights"]["tensors"]
        with x64_scope(self._x64):
            self._weights = {
                name: jax.device_put(np.asarray(a), self._placement(table[name].get("sharding")), may_alias=False)
                for name, a in weights.items()
            }
        self._runners: dict = {}
        self._weight_lists: dict = {}
        self._check_specs: dict = {}  # signature name -> (input names, input_check's plain specs)
        self._said = False

    @classmethod
    def from_bundle(cls, bundle) -> "TpuProgram":
        """Run an in-memory ExportedBundle (no disk round trip) exactly as a loaded artifact."""
        manifest = {
            "platforms": list(bundle.platforms), "enable_x64": bundle.enable_x64,
            "mesh": bundle.mesh.to_json() if bundle.mesh else None,
            "weights": {"tensors": {n: {"sharding": bundle.weight_shardings.get(n)} for n in bundle.weights}},
        }
        weights = {n: torch_to_numpy_array(t) for n, t in bundle.weights.items()}
        return cls(signatures=bundle.signatures, weights=weights, manifest=manifest, compiled=bundle.compiled,
                   source="<in-memory bundle>", use_compiled=True, stored_platforms=None)

    # ------------------------------------------------------------------ public

    @property
    def quant(self) -> dict | None:
        """The artifact's quantization record (scheme and the int8/scale tensors of each weight), or None."""
        return self.manifest.get("quant")

    @property
    def signature_names(self) -> list[str]:
        """The names of the artifact's signatures."""
        return list(self._sigs)

    def signature(self, name: str | None = None) -> Any:
        """One signature of the artifact: its inputs, outputs and dim ranges.

        Args:
            name: The signature's name; None: ``"serving_default"`` if there is one, else the first.

        Returns:
            The loaded signature (``.inputs`` and ``.outputs`` are specs with ``name``, ``shape`` and ``dtype``).

        Raises:
            KeyError: The artifact has no signature of that name (the message lists the ones it has).
        """
        if name is None:
            name = "serving_default" if "serving_default" in self._sigs else next(iter(self._sigs))
        try:
            return self._sigs[name]
        except KeyError:
            raise KeyError(f"no signature {name!r}; this artifact has {sorted(self._sigs)}") from None

    def uses_stored_executable(self, signature_name: str | None = None) -> bool:
        """Whether the signature's last calls ran a stored TPU executable (``use_compiled=True``) rather than
        StableHLO compiled here.

        Args:
            signature_name: The signature; None: the default one.

        Returns:
            True when a stored executable runs it; False when it was compiled here or has not run yet.
        """
        sig = self.signature(signature_name)
        r = self._runners.get(sig.name)
        return bool(r and r.stored)

    def __call__(self, *args: Any, signature_name: str | None = None, **kwargs: Any) -> Any:
        """Run a signature on the device and return torch tensors.

        Args:
            *args: The positional inputs, as the module took them (torch tensors or numpy arrays).
            signature_name: The signature to run; None: the default one.
            **kwargs: The keyword inputs, as the module took them.

        Returns:
            The outputs as torch tensors, in the structure the module returned (a tensor, a tuple, a dict...).

        Raises:
            tpu_export.converter.input_check.InputValueError: An input's name, rank, dims, dim range or dtype does
                not match the signature (a ValueError; the message names the input and what it takes).
            KeyError: There is no signature of that name.
        """
        sig = self.signature(signature_name)
        leaves = [numpy_to_torch(np.asarray(o)) for o in self._run(sig, args, kwargs)]
        return structure.unflatten(sig.output_structure, leaves)

    def run_on_device(self, *args: Any, signature_name: str | None = None, **kwargs: Any) -> Any:
        """Like calling the program, but the outputs stay jax arrays on the device.

        An input given as a jax array (e.g. a KV cache this returned) is passed as it is, with no host round
        trip; its shape and dtype are checked, its values are not. Inputs the module aliases to outputs (state,
        such as KV caches) are donated: a jax array given for one is consumed (deleted) and its output reuses the
        buffer, the cache updated in place.

        Args:
            *args: The positional inputs (host arrays, tensors or jax arrays).
            signature_name: The signature to run; None: the default one.
            **kwargs: The keyword inputs.

        Returns:
            The outputs as jax arrays, in the structure the module returned.

        Raises:
            tpu_export.converter.input_check.InputValueError: An input does not match the signature.
        """
        sig = self.signature(signature_name)
        return structure.unflatten(sig.output_structure, list(self._run(sig, args, kwargs)))

    def _run(self, sig, args, kwargs) -> list:
        import jax

        flat = self._flatten(sig, args, kwargs)
        on_dev = {i: x for i, x in enumerate(flat) if isinstance(x, jax.Array)}
        for i, x in on_dev.items():  # the device arrays' shapes and dtypes are checked, their values are not
            spec = sig.inputs[i]
            want = (tuple(spec.shape), spec.dtype)
            if spec.is_dynamic or (tuple(x.shape), str(x.dtype)) != want:
                raise InputValueError(f"input {spec.name!r} is a device array {list(x.shape)} {x.dtype}; signature "
                                      f"{sig.name!r} takes {list(spec.shape)} {spec.dtype} (pass a host array "
                                      f"to have it checked and cast)")
        xs = self._convert(sig, flat, skip=set(on_dev))
        for i, x in on_dev.items():
            xs[i] = x
        with x64_scope(self._x64):
            runner = self._runner(sig, [list(x.shape) for x in xs])
            if runner.stored or self.mesh is not None:
                xs = [x if i in on_dev else self._put_input(spec, x) for i, (spec, x) in enumerate(zip(sig.inputs, xs))]
            # else: jit's C++ dispatch moves numpy inputs to the (single) device itself, cheaper
            # than a Python-level device_put per input (a third of a small model's call time).
            return runner(self._weight_list(sig), xs)

    def _weight_list(self, sig) -> list:
        ws = self._weight_lists.get(sig.name)
        if ws is None:
            ws = self._weight_lists[sig.name] = [self._weights[w] for w in sig.weight_names]
        return ws

    # ------------------------------------------------------------------ inputs

    def _flatten(self, sig, args, kwargs) -> list:
        top = sig.input_structure
        kw = top["items"][1] if top.get("kind") == "tuple" and len(top.get("items", ())) == 2 else {}
        return bind_inputs(sig.name, self._input_checks(sig)[0], args, kwargs,
                           flatten=lambda a, k: structure.flatten(top, (tuple(a), dict(k))),
                           keywords=kw.get("keys", ()) if kw.get("kind") == "dict" else ())

    def _input_checks(self, sig) -> tuple:
        """The input names and the plain specs converter.input_check takes, made once per signature."""
        got = self._check_specs.get(sig.name)
        if got is None:
            got = self._check_specs[sig.name] = ([s.name for s in sig.inputs], [s.check_spec for s in sig.inputs])
        return got

    def _convert(self, sig, flat, skip=frozenset()) -> list:
        """The one input check the edge Model runs too (names, rank, dims, dim ranges, dtype casts,
        embedding ids), then what only a mesh adds: each sharded dim splits over its mesh axis.
        ``skip``: indices of device arrays, checked by the caller (their values stay on the device)."""
        specs = self._input_checks(sig)[1]
        if skip:
            keep = [i for i in range(len(flat)) if i not in skip]
            checked = iter(check_inputs(sig.name, [specs[i] for i in keep], [flat[i] for i in keep], sig.dim_ranges))
            xs = [flat[i] if i in skip else next(checked) for i in range(len(flat))]
        else:
            xs = check_inputs(sig.name, specs, flat, sig.dim_ranges)
        if self.mesh_spec is not None:
            for spec, a in zip(sig.inputs, xs):
                for i, e in enumerate(spec.sharding or ()):
                    if e is not None and a.shape[i] % self.mesh_spec.axis_size(e):
                        raise InputValueError(f"input {spec.name!r}: dim {i} is {a.shape[i]}, which does not split "
                                              f"over mesh axis {e!r} ({self.mesh_spec.axis_size(e)} devices)")
        return xs

    def _placement(self, sharding):
        if self.mesh is None:
            return self.devices[0]
        return named_sharding(self.mesh, sharding if sharding is not None else [])

    def _put_input(self, spec, a):
        import jax

        return jax.device_put(a, self._placement(spec.sharding))

    # ------------------------------------------------------------------ execution

    def _runner(self, sig, shapes):
        key = (sig.name, tuple(map(tuple, shapes)))
        r = self._runners.get(key)
        if r is None:
            stored, reason = self._find_stored(sig, shapes)
            if stored is not None:
                r = _StoredRunner(stored, self, sig)
                log.info("%s: signature %r runs the stored executable for %s", self.source, sig.name, stored[0].key)
            else:
                r = _JitRunner(sig)
                if not self._said:
                    self._said = True
                    level = logging.WARNING if self.platform == "tpu" and self._use_compiled else logging.INFO
                    log.log(level, "%s: compiling the StableHLO for %s (%s); no stored executable used: %s",
                            self.source, self.platform, self.devices[0].device_kind, reason)
            self._runners[key] = r
            self._runners[sig.name] = r
        return r

    def _find_stored(self, sig, shapes):
        if not self._compiled:
            return None, "the artifact has no compiled executables"
        if not self._use_compiled:
            return None, ("stored executables are machine code and are loaded only on request "
                          "(tpu_backend.load(path, use_compiled=True), tpu-export run --use-compiled)")
        here = runtime_versions()
        reasons = []
        for c in self._compiled:
            cs = c.signatures.get(sig.name)
            why = None
            keys = ("jaxlib", "libtpu") if c.platform == "tpu" else ("jaxlib",)
            if self._stored_platforms is not None and c.platform not in self._stored_platforms:
                why = f"{c.key} is for {c.platform}; only TPU executables are ever loaded from an artifact"
            elif c.platform != self.platform:
                why = f"{c.key} is for {c.platform}, this host runs {self.platform}"
            elif c.device_kind != self.devices[0].device_kind:
                why = f"{c.key} is for {c.device_kind}, this device is {self.devices[0].device_kind}"
            elif any(c.versions.get(k) is None or c.versions.get(k) != here.get(k) for k in keys):
                why = f"{c.key} was built with {c.versions}, this host has {here}"
            elif c.num_devices > len(self.devices) or (self.mesh_spec and c.num_devices != self.mesh_spec.size):
                why = f"{c.key} needs {c.num_devices} devices"
            elif cs is None or cs.executable is None:
                why = f"{c.key} has no executable for {sig.name!r}"
            elif cs.input_shapes[len(sig.weight_names):] != shapes:
                why = f"{c.key} was compiled for input shapes {cs.input_shapes[len(sig.weight_names):]}, got {shapes}"
            if why is None:
                return (c, cs), ""
            reasons.append(why)
        return None, "; ".join(reasons)


class _JitRunner:
    stored = False

    def __init__(self, sig):
        import jax

        from .export import donated_inputs

        # Inputs the module aliases to outputs (KV caches) are donated: updated in place, no second buffer.
        donate = tuple(1 + i for i in donated_inputs(sig.exported, len(sig.weight_names)))
        self.fn = jax.jit(sig.exported.call, keep_unused=True, donate_argnums=donate)

    def __call__(self, weights, xs):
        return self.fn(weights, *xs)


class _StoredRunner:
    """Runs raw PJRT executable bytes (no pickle): deserialize for the devices, execute."""

    stored = True

    def __init__(self, stored, prog: TpuProgram, sig):
        from jax._src.lib import xla_client as xc

        target, cs = stored
        devices = list(prog.mesh.devices.flat) if prog.mesh is not None else prog.devices[: target.num_devices]
        self.loaded = devices[0].client.deserialize_executable(cs.executable, xc.DeviceList(tuple(devices)))
        self.prog, self.sig = prog, sig

    def __call__(self, weights, xs):
        import jax

        results = self.loaded.execute_sharded(list(weights) + list(xs))
        shards = results.disassemble_into_single_device_arrays()
        if self.prog.mesh is None:
            return [s[0] for s in shards]
        outs = []
        for spec, parts in zip(self.sig.outputs, shards):
            sh = list(spec.sharding or ())
            local = parts[0].shape
            shape = tuple(n * (self.prog.mesh_spec.axis_size(e) if i < len(sh) and sh[i] else 1)
                          for i, (n, e) in enumerate(zip(local, sh + [None] * len(local))))
            outs.append(jax.make_array_from_single_device_arrays(shape, named_sharding(self.prog.mesh, sh), parts))
        return outs

