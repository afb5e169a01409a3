"""Validation during training (sections 5 and 6.1): the cross-entropy per target token and BLEU, shared out over the
processes in step."""

import itertools
import math

import torch
from accelerate.utils import gather_object

from ..evaluation.bleu import load_metric, translate
from ..modeling import label_smoothed_cross_entropy
from .padding import batch_to_device


@torch.no_grad()
def validate(
    accelerator,
    model,
    valid_loader,
    tokenizer=None,
    bleu_pairs=((), ()),
    batch_size=64,
    num_beams=1,
    length_penalty=0.6,
    max_source_length=None,
):
    """Validation during training, shared out over the processes: the cross-entropy per target token (no label
    smoothing) over `valid_loader` (each process's share of the batches), and BLEU of `bleu_pairs` (sources,
    references), each process translating a contiguous share.

    Every process makes the same number of forward passes and `generate()` calls, and decodes until all of them are
    done (`synced_gpus`): under FSDP every forward pass gathers the weights from all processes, so one that stopped
    early would leave the others waiting. A process with fewer batches runs one-token filler batches that count
    nothing; one with fewer sentences translates copies of the first and drops them.
    """
    was_training = model.training
    model.eval()
    config = model.config
    filler = {
        "input_ids": torch.tensor([[config.eos_token_id]]),
        "attention_mask": torch.tensor([[1]]),
        "decoder_input_ids": torch.tensor([[config.decoder_start_token_id]]),
        "labels": torch.tensor([[-100]]),
    }
    batches_each = accelerator.gather(torch.tensor([len(valid_loader)], device=accelerator.device))
    batches = itertools.chain(valid_loader, itertools.repeat(filler, int(batches_each.max()) - len(valid_loader)))
    totals = torch.zeros(2, dtype=torch.float64, device=accelerator.device)  # loss sum, target tokens
    for batch in batches:
        batch = batch_to_device(batch, accelerator.device, config.vocab_size)
        with accelerator.autocast():
            logits = model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                decoder_input_ids=batch["decoder_input_ids"],
            ).logits
        totals[0] += label_smoothed_cross_entropy(logits, batch["labels"])[1].sum().double()
        totals[1] += batch["labels"].ne(-100).sum()
    totals = accelerator.reduce(totals, reduction="sum")
    result = {"val_loss": (totals[0] / totals[1]).item()}
    result["val_ppl"] = math.exp(min(result["val_loss"], 50.0))

    sources, references = bleu_pairs
    if len(sources):
        share = math.ceil(len(sources) / accelerator.num_processes)
        mine = list(sources[accelerator.process_index * share : (accelerator.process_index + 1) * share])
        with accelerator.autocast():
            hypotheses = translate(
                model,
                tokenizer,
                mine + [sources[0]] * (share - len(mine)),
                batch_size=batch_size,
                num_beams=num_beams,
                length_penalty=length_penalty,
                max_source_length=max_source_length,
                synced_gpus=accelerator.num_processes > 1,
            )
        hypotheses = gather_object(hypotheses[: len(mine)])  # in process order, so in the order of the pairs
        bleu = load_metric().compute(predictions=hypotheses, references=list(references))
        result.update(bleu=bleu["score"], bleu_signature=bleu["signature"], example=hypotheses[0])
    model.train(was_training)
    return result
