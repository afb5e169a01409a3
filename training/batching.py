"""Section 5.1's batches: "Sentence pairs were batched together by approximate sequence length. Each training batch
contained a set of sentence pairs containing approximately 25000 source tokens and 25000 target tokens."

`TokenBucketSampler` groups pairs of similar length from the two length arrays alone (numpy: no corpus in Python
objects) and deals the batches out to the processes; `StepBatches` takes them a step at a time, epoch after epoch,
from where a run stands (its `TrainState`: epoch and batch, the one record of the position, which checkpoints save).
Both need only numpy and torch, so that a loop over data of its own can batch without `datasets`
(vaswani.training.data reads and pads the Arrow pairs).
"""

import numpy as np
import torch


PAPER_STEP_TOKENS = 50_000  # section 5.1: about 25,000 source and 25,000 target tokens a step


def paper_batch_tokens(processes: int, accumulated: int = 1) -> int:
    """The padded tokens per batch and process that make the paper's step: 50,000 on one GPU, 6,250 on each of 8.

    One GPU takes the step in one batch rather than accumulating small ones: at 65,536 tokens a batch it trained 1.8x
    the tokens a second it did at 16,384 (docs/speed.md, "GPU")."""
    return max(1, PAPER_STEP_TOKENS // (processes * accumulated))


class TokenBucketSampler(torch.utils.data.Sampler):
    """Batches of pairs of similar length whose padded size, pairs x (longest source + longest target), stays within
    `max_tokens`, dealt out to `num_replicas` processes.

    An epoch's batches depend only on (seed, epoch): pairs are sorted by (source length, target length) with ties in
    a random order, cut greedily into batches, and the batches shuffled. Process `rank` takes every
    `num_replicas`-th batch. With `drop_remainder` (training), the epoch is first cut to a multiple of
    num_replicas x batches_per_step batches, so that every process takes the same number of optimizer steps (a
    process waiting for a gradient exchange that never comes would hang DDP); without it (validation), every batch is
    used. Only the two length arrays are read; a batch is a list of row indices.

    `set_epoch(epoch, position)` starts the iteration over an epoch at the position-th batch of this process, which
    is how a resumed run continues with exactly the batches an uninterrupted run would have used; the sampler keeps no
    other state.
    """

    def __init__(
        self,
        source_lengths,
        target_lengths,
        max_tokens,
        *,
        seed=0,
        shuffle=True,
        num_replicas=1,
        rank=0,
        batches_per_step=1,
        drop_remainder=True,
    ):
        self.source_lengths = np.asarray(source_lengths, dtype=np.int32)
        self.target_lengths = np.asarray(target_lengths, dtype=np.int32)
        if self.source_lengths.ndim != 1 or self.source_lengths.shape != self.target_lengths.shape:
            raise ValueError(
                f"source and target lengths must be two 1-D arrays of one size, not "
                f"{self.source_lengths.shape} and {self.target_lengths.shape}"
            )
        if len(self.source_lengths) == 0:
            raise ValueError("there are no pairs to batch")
        if min(self.source_lengths.min(), self.target_lengths.min()) < 1:
            raise ValueError("every source and target holds at least one token (</s>)")
        longest = int((self.source_lengths + self.target_lengths).max())
        if longest > max_tokens:
            raise ValueError(
                f"the batch size of {max_tokens} tokens is smaller than the longest pair ({longest} "
                "tokens); raise it or lower the maximum lengths"
            )
        if not 0 <= rank < num_replicas or batches_per_step < 1:
            raise ValueError(
                f"rank {rank} of {num_replicas} processes, {batches_per_step} batches per step: impossible"
            )
        self.max_tokens, self.seed, self.shuffle = max_tokens, seed, shuffle
        self.num_replicas, self.rank, self.batches_per_step = num_replicas, rank, batches_per_step
        self.drop_remainder = drop_remainder
        self.epoch, self.position = 0, 0
        self._cached = (None, None)

    def epoch_batches(self, epoch):
        """All processes' batches of an epoch, in the order they are dealt: (pair order, batch bounds, batch order).

        Batch k holds `order[bounds[k]:bounds[k + 1]]`.
        """
        rng = np.random.default_rng([self.seed, epoch])
        count = len(self.source_lengths)
        order = rng.permutation(count) if self.shuffle else np.arange(count)
        # Stable: pairs of equal lengths keep the random order.
        order = order[np.lexsort((self.target_lengths[order], self.source_lengths[order]))]
        bounds = greedy_bounds(self.source_lengths[order], self.target_lengths[order], self.max_tokens)
        batch_order = np.arange(len(bounds) - 1)
        if self.shuffle:
            rng.shuffle(batch_order)
        return order, bounds, batch_order

    def _replica_batches(self, epoch):
        """This process's batches of an epoch (cached: the epoch under way is asked for at every iteration)."""
        if self._cached[0] != epoch:
            order, bounds, batch_order = self.epoch_batches(epoch)
            usable = len(batch_order)
            if self.drop_remainder:
                group = self.num_replicas * self.batches_per_step
                usable = usable // group * group
            self._cached = (epoch, (order, bounds, batch_order[self.rank : usable : self.num_replicas]))
        return self._cached[1]

    def set_epoch(self, epoch, position=0):
        """Iterate over `epoch` from this process's `position`-th batch on."""
        if not 0 <= position <= self.batches_in_epoch(epoch):
            raise ValueError(
                f"position {position} is outside epoch {epoch}, which has "
                f"{self.batches_in_epoch(epoch)} batches on this process"
            )
        self.epoch, self.position = epoch, position

    def batches_in_epoch(self, epoch):
        """This process's number of batches in `epoch` (epochs differ slightly: ties fall differently)."""
        return len(self._replica_batches(epoch)[2])

    def __len__(self):
        return self.batches_in_epoch(self.epoch)

    def __iter__(self):
        order, bounds, mine = self._replica_batches(self.epoch)
        for batch in mine[self.position :]:
            yield order[bounds[batch] : bounds[batch + 1]].tolist()


class StepBatches:
    """The batches of each optimizer step, `per_step` at a time, from a DataLoader over a `TokenBucketSampler`, epoch
    after epoch, starting where `state` stands.

    `state` (a `TrainState`: `epoch`, `batch_index`) is the one record of the position: each step's batches advance
    it, and an epoch too short for another step starts the next epoch's new order of new batches. A sampler built
    with `batches_per_step=per_step` cuts every epoch to whole steps.
    """

    def __init__(self, loader, state, per_step):
        self.loader, self.state, self.per_step = loader, state, per_step
        loader.sampler.set_epoch(state.epoch, state.batch_index)
        self.stream = iter(loader)

    def __iter__(self):
        return self

    def __next__(self):
        batches = [next(self.stream) for _ in range(self.per_step)]
        self.state.batch_index += self.per_step
        if self.state.batch_index + self.per_step > len(self.loader.sampler):
            self.state.epoch, self.state.batch_index = self.state.epoch + 1, 0
            self.loader.sampler.set_epoch(self.state.epoch)
            self.stream = iter(self.loader)
        return batches


def greedy_bounds(source_lengths, target_lengths, max_tokens):
    """Cut pairs sorted by source length into runs, each as long as its padded size allows: the bounds of the runs.

    A run of k pairs from position s costs k x (longest source + longest target); with sources sorted, its longest
    source is its last, and the cost only grows with k, so the longest run that fits is found by a binary search
    over the window of pairs that could possibly fit. The loop is over batches, not pairs.
    """
    bounds, start, count = [0], 0, len(source_lengths)
    while start < count:
        width = max(1, max_tokens // (int(source_lengths[start]) + int(target_lengths[start])))
        window = slice(start, start + width)
        longest = source_lengths[window].astype(np.int64) + np.maximum.accumulate(target_lengths[window])
        cost = np.arange(1, len(longest) + 1) * longest
        start += max(1, int(np.searchsorted(cost, max_tokens, side="right")))
        bounds.append(start)
    return np.array(bounds)
