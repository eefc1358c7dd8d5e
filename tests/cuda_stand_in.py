"""A stand-in for CUDA on a CPU-only build: tensors that compute on the CPU but say they live on
``cuda:0``, and refuse to be mixed with CPU tensors the way CUDA does.

Why not PyTorch's fake tensors: on a CPU-only build a fake CUDA tensor cannot be sliced
(Python indexing takes a CUDA device guard: "PyTorch is not linked with support for cuda
devices") and a leaf on a CUDA device kills the process when autograd builds its gradient
accumulator. Here the values are real and live on the CPU, so indexing, autograd, ``.item()``
and sampling work, and a whole distillation run can go through.

- ``OnCuda``: a tensor subclass whose ``device`` is ``cuda:0``. Every torch function called with
  an ``OnCuda`` argument and a CPU tensor of one or more dimensions raises CUDA's "Expected all
  tensors to be on the same device" error (0-dim CPU tensors are allowed, as on CUDA; index
  tensors too). ``.cpu()`` / ``.to("cpu")`` give plain tensors.
- ``CudaStandIn``: a torch-function mode in which a call that asks for cuda (``device="cuda"``,
  ``.to("cuda")``, ``.cuda()``) gets ``OnCuda`` tensors, and ``torch.Generator(device="cuda")``
  gives a generator that says it is a CUDA one (sampling with a generator of the other device
  raises, as on CUDA).
- ``to_stand_in(model)``: a module's parameters and buffers as ``OnCuda`` (in place).

What it does not model: streams, asynchronous errors, memory, CUDA graphs and kernels' numerics.
"""
from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

CUDA = torch.device("cuda", 0)
_REAL_GENERATOR = torch.Generator
# ops whose tensor arguments may sit on the CPU next to CUDA tensors (indices, as on CUDA)
_MIX_ALLOWED = {"__getitem__", "__setitem__", "index_select", "index_put_", "index_put", "device", "is_cuda"}


def _is_cuda(x) -> bool:
    if isinstance(x, torch.device):
        return x.type == "cuda"
    return isinstance(x, str) and x.split(":")[0] == "cuda"


class StandInGenerator(_REAL_GENERATOR):
    """A CPU generator that says it is ``cuda:0``'s (``torch.Generator(device="cuda")``)."""

    @property
    def device(self):  # noqa: D401
        return CUDA


def _check_generator(kwargs: dict, on_cuda: bool, name: str) -> dict:
    gen = kwargs.get("generator")
    if gen is None:
        return kwargs
    gen_cuda = isinstance(gen, StandInGenerator)
    if gen_cuda != on_cuda:
        raise RuntimeError(f"Expected a '{'cuda' if on_cuda else 'cpu'}' device type for generator but found "
                           f"'{'cuda' if gen_cuda else 'cpu'}' (in {name})")
    return kwargs


def _plain(x):
    return x.as_subclass(torch.Tensor) if isinstance(x, OnCuda) else x


def _adopt(x):
    """A plain tensor as an ``OnCuda`` one (a leaf that needs a gradient stays a leaf)."""
    if type(x) is not torch.Tensor:
        return x
    if x.is_leaf and x.requires_grad:
        return x.detach().as_subclass(OnCuda).requires_grad_()
    return x.as_subclass(OnCuda)


def _targets_cpu(args, kwargs) -> bool:
    for x in list(args) + [kwargs.get("device")]:
        if isinstance(x, (str, torch.device)):
            return torch.device(x).type == "cpu"
        if isinstance(x, torch.Tensor):
            return x.device.type == "cpu"
    return False


class OnCuda(torch.Tensor):
    """A CPU tensor (real values, CPU autograd) that says it lives on ``cuda:0``."""

    @property
    def device(self):  # noqa: D401
        return CUDA

    @property
    def is_cuda(self):
        return True

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        with torch._C.DisableTorchFunctionSubclass():
            data = torch.Tensor.detach(self).clone()
        new = data.as_subclass(OnCuda).requires_grad_(self.requires_grad)
        new.__dict__.update(self.__dict__)  # e.g. nn.Parameter's _is_param
        memo[id(self)] = new
        return new

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if func is torch.Tensor.device.__get__:
            return CUDA
        if func is torch.Tensor.is_cuda.__get__:
            return True
        flat, _ = tree_flatten((args, kwargs))
        if name not in _MIX_ALLOWED:
            cpu = [t for t in flat if isinstance(t, torch.Tensor) and not isinstance(t, OnCuda) and t.dim() > 0]
            if cpu:
                raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, "
                                   f"cuda:0 and cpu! (stand-in, in {name})")
        kwargs = _check_generator(kwargs, True, name)
        to_cpu = name in ("cpu", "numpy", "tolist") or (name == "to" and _targets_cpu(args[1:], kwargs))
        if name == "to":  # .to(other_tensor) / .to(device): the data stays where it is
            args = tuple(a if not isinstance(a, OnCuda) or i == 0 else _plain(a) for i, a in enumerate(args))
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if to_cpu:  # the data is on the CPU already: the same values, as a plain tensor
            return tree_map(_plain, out)
        return tree_map(_adopt, out)


class CudaStandIn(TorchFunctionMode):
    """Calls that ask for cuda get ``OnCuda`` tensors; see the module docstring."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "cuda":
            return args[0] if isinstance(args[0], OnCuda) else _adopt(args[0])
        flat, _ = tree_flatten((args, kwargs))
        if not any(_is_cuda(x) for x in flat):
            if not any(isinstance(t, OnCuda) for t in flat):
                kwargs = _check_generator(kwargs, False, name)
            return func(*args, **kwargs)
        cpu = lambda x: torch.device("cpu") if _is_cuda(x) else x  # noqa: E731
        out = func(*tree_map(cpu, args), **tree_map(cpu, kwargs))
        return tree_map(_adopt, out)


def _generator(device=None):
    if device is not None and _is_cuda(device):
        return StandInGenerator()
    return _REAL_GENERATOR(device) if device is not None else _REAL_GENERATOR()


@contextlib.contextmanager
def cuda_stand_in():
    """The stand-in for the duration of a ``with`` block (and ``torch.Generator`` patched)."""
    torch.Generator = _generator
    try:
        with CudaStandIn():
            yield
    finally:
        torch.Generator = _REAL_GENERATOR


def to_stand_in(model: torch.nn.Module) -> torch.nn.Module:
    """``model``'s parameters and buffers as ``OnCuda`` tensors, in place; returns ``model``."""
    moved: dict[int, torch.nn.Parameter] = {}  # a tied parameter (embedding = head) stays one parameter
    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is not None and not isinstance(p, OnCuda):
                if id(p) not in moved:
                    moved[id(p)] = torch.nn.Parameter(p.detach().as_subclass(OnCuda), requires_grad=p.requires_grad)
                mod._parameters[name] = moved[id(p)]
        for name, b in list(mod._buffers.items()):
            if b is not None and not isinstance(b, OnCuda):
                mod._buffers[name] = b.as_subclass(OnCuda)
    return model
