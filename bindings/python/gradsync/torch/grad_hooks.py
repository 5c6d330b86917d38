"""One way to learn that a parameter's gradient is complete for this backward pass."""

import inspect
import weakref

import torch


def register_grad_ready_hook(param, hook):
    """Calls ``hook(param)`` each time backward has finished accumulating into ``param.grad``.

    A bound method is held weakly, and does nothing once its object is gone: autograd keeps the
    hook, and a hook that kept its optimizer or module alive would leave them (with their
    batches and the runtime's lanes) to the garbage collector, which runs at another moment on
    every rank.

    PyTorch 2.1 and later say so directly (``register_post_accumulate_grad_hook``). Older ones run
    the hooks of the leaf's gradient accumulator node after it wrote ``param.grad``; that node
    lives only as long as something refers to it, so the returned handle must be kept.
    """
    hook = _weakly(hook)
    if hasattr(param, "register_post_accumulate_grad_hook"):
        return param.register_post_accumulate_grad_hook(hook)
    accumulator = accumulator_of(param)
    accumulator.register_hook(lambda *_: hook(param))
    return accumulator


def accumulator_of(param):
    """The autograd node that accumulates into ``param.grad``. It lives only as long as something
    refers to it, and a backward meets the same node only while it does. Found under enable_grad:
    inside no_grad() (a wrapper or optimizer made there) the expand would record no graph."""
    with torch.enable_grad():
        return param.expand_as(param).grad_fn.next_functions[0][0]


def _weakly(hook):
    if not inspect.ismethod(hook):
        return hook
    # The object weakly and its class's function: a ``WeakMethod`` builds a bound method at each
    # call, in Python, which took a hook's call from 0.12 to 0.34 us, once per gradient.
    owner = weakref.ref(hook.__self__)
    function = hook.__func__

    def call(param):
        obj = owner()
        if obj is not None:
            function(obj, param)

    return call


def queue_end_of_backward(callback):
    """Runs ``callback()`` once the current backward pass has finished, on its thread.

    Only valid from inside a backward pass (a hook), where the autograd engine accepts callbacks.
    """
    torch.autograd.Variable._execution_engine.queue_callback(callback)
