"""A batch of translation pairs as the model's inputs, from the pairs' token ids alone (numpy and torch, no
`datasets`): `PairCollator` pads the Arrow pairs of `vaswani.training.data` with it, and a loop over data of its own
(numpy arrays of ids) can call it directly; `batch_to_device` moves such a batch to the device it trains on.
"""

import numpy as np
import torch

from ..modeling.modeling_vaswani import check_labels, check_token_ids, shift_tokens_right


def padded(values, lengths, fill):
    """`len(lengths)` rows of `lengths[i]` ids each, read in order from the flat array `values`, as one int64 matrix
    right-padded with `fill`."""
    lengths = np.asarray(lengths)
    matrix = np.full((len(lengths), int(lengths.max())), fill, dtype=np.int64)
    matrix[np.arange(matrix.shape[1]) < lengths[:, None]] = values  # row by row, in order
    return matrix


def pair_batch(source_ids, source_lengths, target_ids, target_lengths, pad_token_id, decoder_start_token_id):
    """The model's inputs for a batch of pairs whose ids (each side ending with </s>) are given flat, in order, with
    each pair's lengths: source ids right-padded and their mask, the targets as labels (-100 on padding), and the
    decoder input, the labels shifted right behind the decoder start token (the model's `shift_tokens_right`)."""
    source_lengths = np.asarray(source_lengths)
    input_ids = torch.from_numpy(padded(source_ids, source_lengths, pad_token_id))
    labels = torch.from_numpy(padded(target_ids, target_lengths, -100))
    attention_mask = torch.from_numpy((np.arange(input_ids.shape[1]) < source_lengths[:, None]).astype(np.int64))
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "decoder_input_ids": shift_tokens_right(labels, pad_token_id, decoder_start_token_id),
        "labels": labels,
    }


def batch_to_device(batch, device, vocab_size):
    """`batch` (the model's inputs and labels) on `device`; `vocab_size` is the model's (needed unless `device` is the
    CPU).

    Ids are checked while they are on the host, where reading them costs no wait: the model checks only ids it can
    read for free (`on_host`), so a batch bound for a GPU is checked here, with the model's own errors, before it
    moves. Tensors in pinned memory (the DataLoader's `pin_memory`) are copied without blocking the host.
    """
    device = torch.device(device)
    if device.type != "cpu":
        for name in ("input_ids", "decoder_input_ids"):
            if name in batch:
                check_token_ids(batch[name], vocab_size)
        if "labels" in batch:
            check_labels(batch["labels"], vocab_size)
    return {name: value.to(device, non_blocking=True) for name, value in batch.items()}
