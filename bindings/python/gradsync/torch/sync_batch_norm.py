"""SyncBatchNorm: batch normalization over the global batch, as ``horovod.torch`` has it.

In training every rank normalizes its own rows with the mean and variance of all ranks' rows
together, so the output, the gradients and the running statistics are those of
``torch.nn.BatchNorm*d`` on the concatenated batch. Ranks may hold different numbers of rows, none
included. A training forward costs one allreduce and its backward one more; eval mode is plain
batch normalization and does not communicate.
"""

import warnings

import torch
from torch.autograd.function import once_differentiable
from torch.nn.modules.batchnorm import _BatchNorm

from gradsync.torch.allreduce import allreduce_
from gradsync.torch.process_sets import _collective_prefix, global_process_set
from gradsync.torch.wire import Sum



def _reduced_dims(x):
    """Every dimension but the channels (dimension 1)."""
    return [0] + list(range(2, x.dim()))


def _per_channel(values, x):
    """A (C,) tensor shaped to broadcast against ``x`` and cast to its dtype."""
    return values.to(x.dtype).view([1, -1] + [1] * (x.dim() - 2))


class _SyncBatchNormFunction(torch.autograd.Function):
    """Normalizes with given global statistics; backward accounts for every rank's rows.

    The mean and inverse standard deviation depend on all ranks' inputs, so the input gradient
    needs two per-channel sums over the global batch, sum(dy) and sum(dy * xhat), which backward
    reduces in one allreduce. Their local parts are the weight and bias gradients.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, mean, invstd, count, name, process_set):
        ctx.count = count
        ctx.name = name
        ctx.process_set = process_set
        ctx.save_for_backward(x, weight, mean, invstd)
        y = (x - _per_channel(mean, x)) * _per_channel(invstd, x)
        if weight is not None:
            y = y * _per_channel(weight, x) + _per_channel(bias, x)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, weight, mean, invstd = ctx.saved_tensors
        need_x, need_weight, need_bias = ctx.needs_input_grad[:3]
        dims = _reduced_dims(x)
        channels = x.shape[1]
        xhat = (x - _per_channel(mean, x)) * _per_channel(invstd, x)
        # In float64: these run over the whole global batch, where float32 sums lose digits.
        sums = torch.cat([torch.sum(dy, dims, dtype=torch.float64),
                          torch.sum(dy * xhat, dims, dtype=torch.float64)])
        # Copies: the allreduce below overwrites ``sums``, and ``to`` may return a view of it.
        grad_weight = grad_bias = None
        if need_weight:
            grad_weight = sums[channels:].to(weight.dtype, copy=True)
        if need_bias:
            grad_bias = sums[:channels].to(weight.dtype, copy=True)
        grad_x = None
        # Whether the input needs a gradient is a property of the model, the same on every rank,
        # so skipping the allreduce here cannot leave another rank waiting for it.
        if need_x:
            allreduce_(sums, name=ctx.name + ".backward", op=Sum, process_set=ctx.process_set)
            mean_dy = sums[:channels] / ctx.count
            mean_dy_xhat = sums[channels:] / ctx.count
            scale = invstd if weight is None else invstd * weight.to(invstd.dtype)
            grad_x = (dy - _per_channel(mean_dy, x) - xhat * _per_channel(mean_dy_xhat, x)) \
                * _per_channel(scale, x)
        return grad_x, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalization whose training statistics span the batches of all ranks of a set.

    Takes inputs of shape (N, C), (N, C, L), (N, C, H, W) or more dimensions, like
    ``torch.nn.BatchNorm1d/2d/3d``. In training mode the mean and (biased) variance used to
    normalize come from every rank's rows together, and ``running_mean`` and ``running_var``
    (unbiased) are updated as ``torch.nn.BatchNorm*d`` would update them on the concatenated
    batch, so they stay identical on all ranks. Every rank of ``process_set`` must call a
    training forward (and its backward) together, even one that holds no rows. In eval mode it is
    ``torch.nn.BatchNorm*d`` and does not communicate.

    Statistics are accumulated in float64, as sums and sums of squares; the variance loses
    precision only when the mean exceeds the standard deviation by many orders of magnitude.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set
        self._collective_name = None

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got {}D input)".format(input.dim()))

    def _name(self):
        # Taken the first time the layer communicates, which every rank does in the same order.
        if self._collective_name is None:
            self._collective_name = _collective_prefix("sync_batch_norm.", self.process_set)
        return self._collective_name

    def _global_stats(self, x):
        """Per-channel mean and biased variance (float64) and values per channel, over all ranks."""
        channels = x.shape[1]
        x64 = x.detach().double()
        dims = _reduced_dims(x64)
        # Sums rather than means: they add up across ranks whatever each rank's batch size, and
        # one tensor carries them all in a single allreduce.
        stats = torch.cat([x64.sum(dims), (x64 * x64).sum(dims),
                           x64.new_tensor([x64.numel() // channels])])
        allreduce_(stats, name=self._name() + ".forward", op=Sum, process_set=self.process_set)
        count = stats[-1].item()
        if count <= 1:
            # Every rank sees the same global count, so every rank raises here together.
            raise ValueError("Expected more than 1 value per channel when training, got %d over "
                             "all ranks (input size %s on this rank)" % (count, list(x.shape)))
        mean = stats[:channels] / count
        var = (stats[channels:2 * channels] / count - mean * mean).clamp_(min=0)
        return mean, var, count

    def forward(self, input):
        self._check_input_dim(input)
        if input.shape[1] != self.num_features:
            raise ValueError("expected %d channels, got input of size %s"
                             % (self.num_features, list(input.shape)))
        if not self.training:
            return super().forward(input)

        factor = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked)

        mean, var, count = self._global_stats(input)
        if self.track_running_stats:
            with torch.no_grad():
                unbiased_var = var * (count / (count - 1))
                self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype),
                                                        alpha=factor)
                self.running_var.mul_(1 - factor).add_(unbiased_var.to(self.running_var.dtype),
                                                       alpha=factor)
        invstd = torch.rsqrt(var + self.eps)
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, mean, invstd, count,
                                            self._name(), self.process_set)

    @classmethod
    def convert_sync_batchnorm(cls, module, process_set=global_process_set):
        """Returns ``module`` with every ``torch.nn.BatchNorm*d`` in it replaced by a SyncBatchNorm.

        Parameters and buffers are carried over; the model's other layers are kept as they are.
        """
        converted = module
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            converted = cls(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, process_set)
            if module.affine:
                converted.weight = module.weight
                converted.bias = module.bias
            converted.running_mean = module.running_mean
            converted.running_var = module.running_var
            converted.num_batches_tracked = module.num_batches_tracked
            converted.train(module.training)
        for child_name, child in module.named_children():
            converted.add_module(child_name, cls.convert_sync_batchnorm(child, process_set))
        return converted


def warn_of_torch_sync_batch_norm(module, process_set):
    """Warns where ``module`` holds torch.nn.SyncBatchNorm layers that cannot synchronize: they
    go through torch.distributed, and without its process group they normalize each rank's batch
    alone (PyTorch 2) or raise in training (1.13), which a DDP script moved to gradsync's
    DistributedDataParallel would not expect. The warning names the layers and the fix."""
    if process_set.size() < 2 or (torch.distributed.is_available()
                                  and torch.distributed.is_initialized()):
        return
    layers = [name or "the module" for name, m in module.named_modules()
              if isinstance(m, torch.nn.SyncBatchNorm)]
    if layers:
        warnings.warn("DistributedDataParallel: %s %s torch.nn.SyncBatchNorm, which "
                      "synchronizes through torch.distributed, not initialized here: each rank "
                      "would normalize its own batch. Convert them with "
                      "gradsync.torch.SyncBatchNorm.convert_sync_batchnorm(model)."
                      % (", ".join(layers), "is" if len(layers) == 1 else "are"))
