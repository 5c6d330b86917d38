"""ElasticSampler: Horovod's sampler for elastic training. Within an epoch it remembers how far the
job has got; after a restart with another number of ranks, the samples left are divided among the
new ranks, so every sample of the epoch is processed once (but for the padding that gives every
rank as many samples in the epoch's last batch, as Horovod's and PyTorch's samplers pad).
"""

import math
import random

import torch.utils.data

from gradsync.torch.basics import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    """Partitions ``dataset``'s indices among the ranks, skipping those processed this epoch.

    The epoch's order is fixed by ``seed + epoch`` (shuffled, or in order). Rank r of R takes
    every R-th index of what is left, so after k batches of b the job as a whole has processed
    the first k * b * R of them, whatever the rank: ``record_batch`` records that without asking
    the other ranks, and a commit holds the whole job's progress. Call ``set_epoch(epoch)`` at the
    start of every epoch (not when a restarted world resumes within one) and
    ``record_batch(batch_idx, batch_size)`` after each step, ``batch_idx`` counting from 0 since
    this world started the epoch (as ``enumerate`` over the loader does); commit the sampler with
    the rest of the state (``TorchState(sampler=...)``). ``record_indices`` records indices this
    rank alone processed: the next commit gathers them from every rank (a collective, then).
    """

    def __init__(self, dataset, shuffle=True, seed=0):
        self._set_up(dataset, shuffle, seed)
        self.reset()

    @classmethod
    def undivided(cls, dataset, shuffle=True, seed=0):
        """A sampler whose samples are not divided among gradsync's ranks yet: for ``partition``
        by hand, as a replay of a job's sampling in one process does (gradsync not started)."""
        sampler = cls.__new__(cls)
        sampler._set_up(dataset, shuffle, seed)
        return sampler

    def _set_up(self, dataset, shuffle, seed):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0         # the first this many of the epoch's order are done
        self.processed_indices = set()  # and these, recorded by record_indices
        self._local_only = False       # record_indices was used since the last gathering
        self._base = 0                 # processed_num when the indices were last divided
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.indices = []

    def set_epoch(self, epoch):
        """Starts ``epoch``: nothing processed yet, in the order this epoch's seed gives."""
        self.epoch = epoch
        self.processed_num = 0
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Records batches 0 to ``batch_idx`` of every rank, since the last division, as done."""
        done = (batch_idx + 1) * batch_size * self.num_replicas
        self.processed_num = self._base + min(done, len(self.remaining_indices))

    def record_indices(self, indices):
        """Records ``indices``, processed by this rank only."""
        self.processed_indices.update(indices)
        self._local_only = True

    def get_indices(self, batch_idx, batch_size):
        """This rank's indices of batch ``batch_idx``."""
        start = batch_idx * batch_size
        return self.indices[start:start + batch_size]

    def state_dict(self):
        return {"epoch": self.epoch, "processed_num": self.processed_num,
                "processed_indices": set(self.processed_indices)}

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.processed_indices = set(state_dict["processed_indices"])
        self._local_only = False
        self.reset()

    def reset(self):
        """Divides the samples not yet processed this epoch among the ranks there are now."""
        self.partition(size(), rank())

    def partition(self, num_replicas, rank):
        """What ``reset`` does, for ``num_replicas`` ranks of which this is ``rank``: usable
        without gradsync, to replay a job's sampling in one process."""
        self.num_replicas = num_replicas
        self.rank = rank
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self._base = self.processed_num
        self.remaining_indices = [i for i in order[self.processed_num:]
                                  if i not in self.processed_indices]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / num_replicas))
        self.total_size = self.num_samples * num_replicas
        # Every rank gets num_samples, so that each runs as many steps (their collectives pair
        # up): the padding repeats the samples left in turn, more than once where fewer are left
        # than ranks lack.
        padding = self.total_size - len(self.remaining_indices)
        padded = self.remaining_indices + \
            [self.remaining_indices[k % len(self.remaining_indices)] for k in range(padding)]
        self.indices = padded[rank:self.total_size:num_replicas]

    def __iter__(self):
        return iter(list(self.indices))

    def __len__(self):
        return self.num_samples
