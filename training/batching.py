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
    used. Only the two length arrays are read, kept in the narrowest unsigned type that holds them; a batch is a list
    of row indices. An epoch's order is the one thing held per pair (4 bytes): at WMT14 English-French's 36M pairs,
    the sampler holds 2 x 72 MB of lengths and 144 MB of order (twice that while an epoch is sorted).

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
        self.source_lengths, self.target_lengths = np.asarray(source_lengths), np.asarray(target_lengths)
        if self.source_lengths.ndim != 1 or self.source_lengths.shape != self.target_lengths.shape:
            raise ValueError(
                f"source and target lengths must be two 1-D arrays of one size, not "
                f"{self.source_lengths.shape} and {self.target_lengths.shape}"
            )
        if len(self.source_lengths) == 0:
            raise ValueError("there are no pairs to batch")
        if min(self.source_lengths.min(), self.target_lengths.min()) < 1:
            raise ValueError("every source and target holds at least one token (</s>)")
        self.source_lengths, self.target_lengths = narrowest(self.source_lengths), narrowest(self.target_lengths)
        self.length_pairs = LengthPairs.count(self.source_lengths, self.target_lengths)
        longest = int((self.length_pairs.sources + self.length_pairs.targets).max())
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
        # The permutation rng.permutation(count) gives (an arange shuffled in place), in 4 bytes a pair rather than 8.
        order = np.arange(count, dtype=np.int32 if count < 2**31 else np.int64)
        if self.shuffle:
            rng.shuffle(order)
        order = self.length_pairs.sort(order, self.source_lengths, self.target_lengths)
        bounds = self.length_pairs.greedy_bounds(self.max_tokens)
        batch_order = np.arange(len(bounds) - 1)
        if self.shuffle:
            rng.shuffle(batch_order)
        return order, bounds, batch_order

    def _replica_batches(self, epoch):
        """This process's batches of an epoch (cached: the epoch under way is asked for at every iteration)."""
        if self._cached[0] != epoch:
            self._cached = (None, None)  # the last epoch's order goes before the next one's is built
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


def length_type(longest):
    """numpy's narrowest unsigned integer type for lengths up to `longest`: uint16 under the usual limits."""
    return np.min_scalar_type(int(longest))


def narrowest(lengths):
    """Lengths in `length_type`, without a copy where they already are."""
    return lengths.astype(length_type(lengths.max()), copy=False)


class LengthPairs:
    """The distinct (source length, target length) pairs of a corpus, ascending, and how many pairs have each: what
    sorting by length needs to know of the whole corpus, in a few thousand numbers.

    Reading the lengths a chunk at a time, sorting a million pairs holds only a million pairs' keys beyond the
    order itself (an argsort of the whole would hold 8-byte keys and indices for every pair: 576 MB at 36M pairs).
    """

    CHUNK = 1 << 20

    def __init__(self, width, keys, counts):
        self.width, self.keys, self.counts = width, keys, counts  # key = source length x width + target length
        self.sources, self.targets = np.divmod(keys, width)

    @classmethod
    def count(cls, source_lengths, target_lengths):
        width = int(target_lengths.max()) + 1
        keys, counts = np.empty(0, np.int64), np.empty(0, np.int64)
        for start in range(0, len(source_lengths), cls.CHUNK):
            rows = slice(start, start + cls.CHUNK)
            chunk_keys, chunk_counts = np.unique(
                source_lengths[rows].astype(np.int64) * width + target_lengths[rows], return_counts=True
            )
            merged = np.union1d(keys, chunk_keys)
            merged_counts = np.zeros(len(merged), np.int64)
            merged_counts[np.searchsorted(merged, keys)] += counts
            merged_counts[np.searchsorted(merged, chunk_keys)] += chunk_counts
            keys, counts = merged, merged_counts
        return cls(width, keys, counts)

    def sort(self, order, source_lengths, target_lengths):
        """`order` stably sorted by (source length, target length): a counting sort, a chunk of `order` at a time."""
        result = np.empty_like(order)
        next_slot = np.cumsum(self.counts) - self.counts  # where the next pair of each key goes
        for start in range(0, len(order), self.CHUNK):
            rows = order[start : start + self.CHUNK]
            key_index = np.searchsorted(
                self.keys, source_lengths[rows].astype(np.int64) * self.width + target_lengths[rows]
            )
            by_key = np.argsort(key_index, kind="stable")
            sorted_index = key_index[by_key]
            rank = np.arange(len(rows)) - np.searchsorted(sorted_index, sorted_index)  # among the chunk's same key
            result[next_slot[sorted_index] + rank] = rows[by_key]
            next_slot += np.bincount(key_index, minlength=len(self.keys))
        return result

    def greedy_bounds(self, max_tokens):
        """Cut the pairs, sorted by (source length, target length), into runs, each as long as its padded size allows:
        the bounds of the runs, computed from the counts of each length pair alone.

        A run of k pairs costs k x (longest source + longest target); with sources sorted, its longest source is its
        last. Within one length pair, runs of max_tokens // (its source + its target) pairs are cut all at once; a
        run that starts with what is left of one length pair takes pairs of the next ones while its cost allows.
        The loop is over distinct length pairs and the runs that cross them, not over pairs or batches.
        """
        sources, targets, counts = self.sources.tolist(), self.targets.tolist(), self.counts.tolist()
        cuts, position, group, used = [np.zeros(1, np.int64)], 0, 0, 0  # `used`: the group's pairs already cut
        while group < len(counts):
            width = max_tokens // (sources[group] + targets[group])
            left = counts[group] - used
            if left >= width:  # whole runs of this length pair alone
                runs = left // width
                cuts.append(position + width * np.arange(1, runs + 1, dtype=np.int64))
                position, used = position + runs * width, used + runs * width
                if used == counts[group]:
                    group, used = group + 1, 0
                continue
            size, longest_target, group, used = left, targets[group], group + 1, 0
            while group < len(counts):
                longest_target = max(longest_target, targets[group])
                fit = max_tokens // (sources[group] + longest_target) - size  # this length pair's pairs that fit
                if fit <= 0:
                    break
                if fit < counts[group]:
                    size, used = size + fit, fit
                    break
                size, group = size + counts[group], group + 1
            position += size
            cuts.append(np.array([position], np.int64))
        return np.concatenate(cuts)
