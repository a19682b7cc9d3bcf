"""The one eager autograd path of every family.

An op's gradient is written once, as the ``setup_context`` / ``backward`` pair given to
``torch.library.register_autograd`` in its family's ``ops`` module; that registration is what
torch.compile traces. Eager calls go through :func:`call_op` instead:

* nothing to differentiate (inference, ``torch.no_grad``): the op runs below the Autograd
  dispatch key. The formulas are registered from Python, so passing through that key costs a
  Python round trip (about 10 us a call) even when nothing is recorded.
* an input needs a gradient: a plain ``torch.autograd.Function`` built once per op around the
  same two functions. torch.library's registered-autograd wrapper costs about 0.2 ms a call in
  Python (it fills the schema's defaults), more than the op itself on small inputs.
* under torch.compile: the op is called as is, so the registered formula is traced.

A family's composite whose forward is not one op (an in-place update, a gather whose backward
is an SpMM, ...) is eager-only by nature: :func:`composite` builds its Function from a plain
forward and backward, so every ``torch.autograd.Function`` of the package is made here
(tests/python/core/test_layout.py checks that no family defines its own).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Dict, Optional

import torch


def needs_grad(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether autograd records a call on `tensors` (grad mode on, one of them requires grad)."""
    return torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in tensors
    )


def without_autograd(*tensors: Optional[torch.Tensor]):
    """A context that runs raw op calls below the Autograd dispatch key when none of `tensors`
    needs a gradient (see the module docstring); under torch.compile, or when one does, a
    context that changes nothing."""
    if torch.compiler.is_compiling() or needs_grad(*tensors):
        return contextlib.nullcontext()
    return torch._C._AutoDispatchBelowAutograd()


def _below_autograd_unless_recording():
    """A backward runs below the Autograd key unless it is itself recorded (create_graph:
    grad mode is on inside it) or traced (a composite under torch.compile); the ops it calls
    then skip the Python round trip too."""
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        return contextlib.nullcontext()
    return torch._C._AutoDispatchBelowAutograd()


def _function(name: str, forward: Callable, backward: Callable) -> type:
    """A torch.autograd.Function subclass named `name` whose forward and backward are the
    given plain functions (``forward(ctx, *args)``, ``backward(ctx, *grads)``)."""

    def fwd(ctx, *args):
        return forward(ctx, *args)

    def bwd(ctx, *grads):
        with _below_autograd_unless_recording():
            return backward(ctx, *grads)

    meta = type(torch.autograd.Function)  # its metaclass builds the backward node class
    return meta(name, (torch.autograd.Function,),
                {"forward": staticmethod(fwd), "backward": staticmethod(bwd),
                 "__doc__": forward.__doc__, "__module__": forward.__module__})


_EAGER_FUNCTIONS: Dict[object, type] = {}


def call_op(op, setup: Callable, backward: Callable, args: tuple, grad_inputs: tuple):
    """``op(*args)`` (`args`: every schema argument, positionally) with the autograd formula
    registered for it (`setup`, `backward`, as given to torch.library.register_autograd);
    `grad_inputs` are the arguments a gradient may flow to. See the module docstring for the
    three paths."""
    if torch.compiler.is_compiling():
        return op(*args)
    if not needs_grad(*grad_inputs):
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args)
    fn = _EAGER_FUNCTIONS.get(op)
    if fn is None:
        fn = _EAGER_FUNCTIONS[op] = _op_function(op, setup, backward)
    return fn.apply(*args)


def _op_function(op, setup: Callable, backward: Callable) -> type:
    def forward(ctx, *args):
        with torch._C._AutoDispatchBelowAutograd():
            out = op(*args)
        setup(ctx, args, out)
        outs = out if isinstance(out, tuple) else (out,)
        integer = [o for o in outs if isinstance(o, torch.Tensor) and
                   not (o.is_floating_point() or o.is_complex())]
        if integer:
            ctx.mark_non_differentiable(*integer)
        return out

    name = f"Eager_{op}".replace(".", "_").replace(":", "_")
    return _function(name, forward, backward)


def composite(name: str, forward: Callable, backward: Callable) -> Callable:
    """The ``apply`` of a torch.autograd.Function made of `forward(ctx, *args)` and
    `backward(ctx, *grads)`: for a family's eager-only composite (one that is not a single
    registered op; its callers take the plain path under torch.compile). The backward runs
    below the Autograd key unless it is recorded (double backward)."""
    return _function(name, forward, backward).apply
