"""PyTorch processor: a TorchScript module (``torch.jit.save``, ``model: net.pt``).

The module runs on the service's ``device`` (``cpu``, the default, or ``cuda``, ``cuda:1``...),
under ``torch.inference_mode``. TorchScript records the names of ``forward``'s arguments and
how many tensors it returns, not their dtypes or shapes:

* the inputs are ``forward``'s arguments, by name (a TorchRequest feeds them by position,
  as EAS's PyTorch processor does); a service declares their dtypes and shapes with
  ``inputs: {name: {dtype, shape}}``, one entry per argument, in order (the names may be
  the declaration's own). Undeclared, any tensor is accepted and the module itself refuses
  what it cannot take;
* the outputs are named ``output__0``, ``output__1``... (Triton's PyTorch backend's names);
  when every input is declared with all its dimensions but the first known, the module is
  run once at load on zeros, two rows of each input, to learn their dtypes and shapes.

A module returns a tensor or a tuple or list of tensors. Requests are batched (``batching``)
when every declared input and every output has a dynamic first dimension. ``intra_op_threads``
is ``torch.set_num_threads`` (one value per process). A run cannot be interrupted: a call
past its timeout is answered 504 while the run ends on its own.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from eas_sdk.codecs import eas
from gateway.core.metadata import DATATYPES
from gateway.worker.processors.base import LoadError, ProcessorError
from gateway.worker.processors.estimator import first_line
from gateway.worker.processors.model import ModelProcessor, Signature

log = logging.getLogger("gateway.worker")

OUTPUT_PREFIX = "output__"


def _return_count(return_type: Any) -> int | None:
    """How many tensors ``forward`` returns: 1 for a Tensor, n for a tuple of n, None when
    the schema does not say (a list, whose length is known only at run time)."""
    kind = return_type.kind()
    if kind == "TensorType":
        return 1
    if kind == "TupleType":
        elements = return_type.elements()
        if all(e.kind() == "TensorType" for e in elements):
            return len(elements)
    return None


def _writable(arr: np.ndarray) -> np.ndarray:
    """A contiguous array torch may share: one decoded in place from a request body is
    read-only, and torch would warn on every call that it cannot protect it (so: a copy)."""
    if arr.flags.writeable and arr.flags.c_contiguous:
        return arr
    return np.array(arr, order="C")


def _fixed_but_first(shape: tuple[Any, ...] | None) -> bool:
    """Whether every dimension is known but maybe the first (the batch): zeros of that shape
    are an input the module can be expected to take."""
    return shape is not None and all(isinstance(d, int) and d >= 0 for d in shape[1:])


class TorchProcessor(ModelProcessor):
    def open(self) -> Signature:
        import torch

        svc = self.service
        assert svc.model is not None  # ModelProcessor.load checked it
        self._torch = torch
        torch.set_num_threads(max(1, svc.intra_op_threads))
        self.device = self._device(svc.device)
        try:
            with warnings.catch_warnings():
                # PyTorch 2.13 deprecates TorchScript for torch.export; TorchScript files are
                # still what EAS's PyTorch processor and Triton's libtorch backend serve.
                warnings.simplefilter("ignore", DeprecationWarning)
                module = torch.jit.load(svc.model, map_location=self.device)
        except Exception as exc:
            raise LoadError(
                f"cannot load {Path(svc.model).name} as a TorchScript module (torch.jit.save's file): "
                f"{first_line(exc)}"
            ) from exc
        module.eval()
        self.module = module
        schema = module.forward.schema
        args = [a for a in schema.arguments if a.name != "self"]
        count = _return_count(schema.returns[0].type) if len(schema.returns) == 1 else None
        if count is None:
            shown = ", ".join(str(r.type) for r in schema.returns)
            raise LoadError(
                f"{Path(svc.model).name}: forward returns {shown}; the torch processor serves a module "
                "that returns a tensor or a tuple of tensors"
            )
        inputs = self._inputs([a.name for a in args])
        outputs = tuple(eas.TensorSpec(f"{OUTPUT_PREFIX}{i}", None, None) for i in range(count))
        self.inputs = list(inputs)  # run() reads them; the probe runs before load() sets them
        if all(s.dtype is not None and _fixed_but_first(s.shape) for s in inputs):
            outputs = self._probe(inputs, outputs)
        return Signature(inputs, outputs, "pytorch_libtorch")

    def _device(self, name: str) -> Any:
        torch = self._torch
        try:
            device = torch.device(name)
        except RuntimeError as exc:
            raise LoadError(f"device {name!r}: {first_line(exc)}") from exc
        if device.type == "cuda" and not torch.cuda.is_available():
            raise LoadError(f"device {name!r}: this PyTorch build sees no CUDA device")
        if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
            raise LoadError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) here")
        return device

    def _inputs(self, args: list[str]) -> tuple[eas.TensorSpec, ...]:
        decls = self.service.inputs
        if not decls:
            return tuple(eas.TensorSpec(a, None, None) for a in args)
        if len(decls) != len(args):
            raise LoadError(
                f"inputs: the module's forward takes {len(args)} tensor(s) ({', '.join(args)}), "
                f"the service declares {len(decls)}"
            )
        return tuple(eas.TensorSpec(d.name, DATATYPES[d.dtype] if d.dtype else None, d.shape) for d in decls)

    def _probe(
        self, inputs: tuple[eas.TensorSpec, ...], outputs: tuple[eas.TensorSpec, ...]
    ) -> tuple[eas.TensorSpec, ...]:
        """The outputs' dtypes and shapes, from one run on zeros (two rows where the first
        dimension is free); a module that fails on zeros still loads, its outputs unknown."""
        feeds = {}
        for s in inputs:
            dims = [2 if i == 0 and d < 0 else d for i, d in enumerate(s.shape or ())]
            feeds[s.name] = np.zeros(dims, dtype=s.dtype)
        try:
            results = self.run([o.name for o in outputs], feeds)
        except ProcessorError as exc:
            log.warning("service %s: the module failed on zeros (%s)", self.service.name, exc.message)
            return outputs
        firsts = {s.shape[0] if s.shape else None for s in inputs}
        batched = len(firsts) == 1 and next(iter(firsts)) == -1
        specs = []
        for o, r in zip(outputs, results, strict=True):
            shape = tuple(r.shape)
            if batched and r.ndim and r.shape[0] == 2:
                shape = (-1, *shape[1:])
            specs.append(eas.TensorSpec(o.name, r.dtype, shape))
        return tuple(specs)

    def run(self, wanted: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        torch = self._torch
        try:
            args = [torch.from_numpy(_writable(feeds[s.name])) for s in self.inputs]
        except TypeError as exc:  # an object (string) array: TorchScript tensors hold numbers
            raise ProcessorError(f"the module takes numeric tensors: {first_line(exc)}") from None
        if self.device.type != "cpu":
            args = [a.to(self.device, non_blocking=True) for a in args]
        try:
            with torch.inference_mode():
                out = self.module(*args)
        except Exception as exc:  # the module refuses what no declaration checked
            raise ProcessorError(f"model run failed: {first_line(exc)}") from None
        results = list(out) if isinstance(out, (tuple, list)) else [out]
        index = {f"{OUTPUT_PREFIX}{i}": i for i in range(len(results))}
        arrays = []
        for name in wanted:
            if name not in index:
                raise ProcessorError(
                    f"the module returned {len(results)} tensor(s), no {name!r}",
                    status=500,
                    code="InternalError",
                )
            arrays.append(results[index[name]].detach().cpu().numpy())
        return arrays


__all__ = ["OUTPUT_PREFIX", "TorchProcessor"]
