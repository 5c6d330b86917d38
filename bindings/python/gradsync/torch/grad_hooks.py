"""One way to learn that a parameter's gradient is complete for this backward pass."""

import torch


def register_grad_ready_hook(param, hook):
    """Calls ``hook(param)`` each time backward has finished accumulating into ``param.grad``.

    PyTorch 2.1 and later say so directly (``register_post_accumulate_grad_hook``). Older ones run
    the hooks of the leaf's gradient accumulator node after it wrote ``param.grad``; that node
    lives only as long as something refers to it, so the returned handle must be kept.
    """
    if hasattr(param, "register_post_accumulate_grad_hook"):
        return param.register_post_accumulate_grad_hook(hook)
    accumulator = param.expand_as(param).grad_fn.next_functions[0][0]
    accumulator.register_hook(lambda *_: hook(param))
    return accumulator


def queue_end_of_backward(callback):
    """Runs ``callback()`` once the current backward pass has finished, on its thread.

    Only valid from inside a backward pass (a hook), where the autograd engine accepts callbacks.
    """
    torch.autograd.Variable._execution_engine.queue_callback(callback)
