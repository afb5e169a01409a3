"""The hot paths never make the host wait for a GPU needlessly.

Reading a GPU tensor's values on the host (`.item()`, `.tolist()`, `bool(tensor)`, `.cpu()`, ...) makes the host wait
until the GPU has done all the work queued before it, so that the next kernels are queued late. Counted here on the
CPU by wrapping those methods: the model's training pass and cached decoding step read no more than MarianMTModel's
of the same sizes, and the recipe's `train_step` reads once per optimizer step, after its last backward pass.

On the CPU the model checks its ids, which it reads for free there (`on_host`); these tests make it see its tensors
as a GPU's (`device_tensors`), unless run on one (`--device cuda`).
"""

import contextlib
import traceback
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from helpers import VOCAB_SIZE, make_translation_pairs, pad_pairs, tiny_model_config
from transformers import MarianMTModel

from benchmarks.benchmark import marian_config
from vaswani import VaswaniForConditionalGeneration
from vaswani.modeling import generation_vaswani, modeling_vaswani
from vaswani.training.padding import batch_to_device, pair_batch
from vaswani.training.step import recipe_adam, train_step


# Every Tensor method that hands a tensor's values to Python or the host: on a GPU each waits for the device. (Boolean
# masks and torch.nonzero wait as well, in C++; on the CPU neither goes through a method that can be wrapped, which is
# why the model's own checks gate on `on_host` rather than on the methods they use.)
READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero")


@dataclass
class Event:
    kind: str  # a read's method name, "backward", or a marker of the test's own
    where: str  # the file and line that called it


@contextlib.contextmanager
def host_reads():
    """The reads (READS) and backward passes of every tensor while in the block, in order, as `Event`s; the test can
    add markers of its own to the list."""
    events = []

    def recording(name, method):
        def wrapper(self, *args, **kwargs):
            caller = traceback.extract_stack(limit=2)[0]
            events.append(Event(name, f"{caller.filename}:{caller.lineno}"))
            return method(self, *args, **kwargs)

        return wrapper

    originals = {name: getattr(torch.Tensor, name) for name in (*READS, "backward")}
    for name, method in originals.items():
        setattr(torch.Tensor, name, recording(name, method))
    try:
        yield events
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)


@pytest.fixture(autouse=True)
def fresh_accelerator_state():
    """Each test builds an Accelerator of its own settings, and leaves none behind: accelerate keeps one state per
    process, reset as accelerate's own test case (`accelerate.test_utils.AccelerateTestCase`) resets it."""
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def reads(events):
    return [event for event in events if event.kind in READS]


@pytest.fixture
def device_tensors(monkeypatch, device):
    """The model reads its tensors as on a GPU: on the CPU, as if they were a GPU's (it skips the checks of values
    it would have to wait for)."""
    if device.type == "cpu":
        for module in (modeling_vaswani, generation_vaswani):
            monkeypatch.setattr(module, "on_host", lambda tensor: False)
    return device


def both_models(device):
    config = tiny_model_config()
    torch.manual_seed(0)
    return {
        "vaswani": VaswaniForConditionalGeneration(config).to(device),
        "marian": MarianMTModel(marian_config(config)).to(device),
    }


def training_pass_reads(model, device):
    input_ids, attention_mask, labels = (tensor.to(device) for tensor in pad_pairs(make_translation_pairs()))
    model.train()
    with host_reads() as events:
        model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
    return reads(events)


def decoding_step_reads(model, device):
    input_ids, attention_mask, _ = (tensor.to(device) for tensor in pad_pairs(make_translation_pairs()))
    start = torch.full((len(input_ids), 1), model.config.decoder_start_token_id, device=device)
    model.eval()
    with torch.no_grad():
        first = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=start, use_cache=True)
        next_tokens = first.logits[:, -1].argmax(-1, keepdim=True)
        with host_reads() as events:
            model(
                encoder_outputs=(first.encoder_last_hidden_state,),
                attention_mask=attention_mask,
                decoder_input_ids=next_tokens,
                cache=first.cache,
                use_cache=True,
            )
    return reads(events)


def test_training_pass_reads_no_more_than_marian(device_tensors):
    """Forward with labels and backward: no more host reads than MarianMTModel doing the same work (transformers'
    padding-mask checks are all either makes)."""
    counts = {name: training_pass_reads(model, device_tensors) for name, model in both_models(device_tensors).items()}
    print({name: [event.where.rsplit("/", 1)[-1] for event in events] for name, events in counts.items()})
    assert len(counts["vaswani"]) <= len(counts["marian"]), counts


def test_cached_decoding_step_reads_no_more_than_marian(device_tensors):
    counts = {name: decoding_step_reads(model, device_tensors) for name, model in both_models(device_tensors).items()}
    print({name: [event.where.rsplit("/", 1)[-1] for event in events] for name, events in counts.items()})
    assert len(counts["vaswani"]) <= len(counts["marian"]), counts


def random_batch(rng, pairs=6):
    source_lengths, target_lengths = rng.integers(2, 9, pairs), rng.integers(2, 9, pairs)
    return pair_batch(
        rng.integers(3, VOCAB_SIZE, source_lengths.sum()),
        source_lengths,
        rng.integers(3, VOCAB_SIZE, target_lengths.sum()),
        target_lengths,
        0,
        1,
    )


def beam_search_reads(model, device, max_new_tokens, **options):
    """The host reads of one beam search (4 beams) of the test pairs, and its number of decoding steps."""
    input_ids, attention_mask, _ = (tensor.to(device) for tensor in pad_pairs(make_translation_pairs()))
    steps = []
    hook = model.lm_head.register_forward_hook(lambda *_: steps.append(1))
    model.eval()
    with torch.no_grad(), host_reads() as events:
        model.generate(input_ids, attention_mask=attention_mask, num_beams=4, max_new_tokens=max_new_tokens, **options)
    hook.remove()
    return len(reads(events)), len(steps)


def test_the_papers_beam_search_reads_no_more_per_step_than_transformers_beam_search_on_marian(device_tensors):
    """Each step of the default decoding waits for the device no more often than transformers' beam search does
    for MarianMTModel, and once at most (its read of the sentences done and the rows moved): counted over the steps
    that a longer decoding adds."""
    options = {"vaswani": {"paper_decoding": True}, "marian": {}}
    per_step = {}
    for name, model in both_models(device_tensors).items():
        (short_reads, short_steps), (long_reads, long_steps) = (
            beam_search_reads(model, device_tensors, tokens, **options[name]) for tokens in (4, 12)
        )
        assert long_steps > short_steps, name
        per_step[name] = (long_reads - short_reads) / (long_steps - short_steps)
    print(per_step)
    assert per_step["vaswani"] <= min(per_step["marian"], 1), per_step


def test_train_step_reads_once_per_step_after_its_last_backward(device_tensors):
    """Two steps of two accumulated batches: outside the model's forward passes (the test above counts those), the
    step reads the device once, after the step's last backward pass; before it, nothing waits."""
    accelerator = Accelerator(cpu=device_tensors.type == "cpu", gradient_accumulation_steps=2)
    model = VaswaniForConditionalGeneration(tiny_model_config())
    # Adam as the recipe runs it on CUDA, fused (torch runs it on the CPU too): its step counts live with the weights,
    # where the unfused Adam keeps them on the host and reads them there, which costs no wait.
    optimizer = torch.optim.Adam(model.parameters(), fused=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    rng = np.random.default_rng(0)
    with host_reads() as events:
        model.register_forward_pre_hook(lambda *_: events.append(Event("forward", "")))
        model.register_forward_hook(lambda *_: events.append(Event("forward done", "")))
        for _ in range(2):
            events.append(Event("step", ""))
            train_step(accelerator, model, optimizer, None, [random_batch(rng), random_batch(rng)], 0.1)

    steps, in_forward = [], False
    for event in events:
        if event.kind == "step":
            steps.append({"reads": [], "backward": 0, "read after backward": []})
        elif event.kind in ("forward", "forward done"):
            in_forward = event.kind == "forward"
        elif event.kind == "backward":
            steps[-1]["backward"] += 1
        elif not in_forward:
            steps[-1]["reads"].append(event.where)
            steps[-1]["read after backward"].append(steps[-1]["backward"])
    print(steps)
    for step in steps:
        assert len(step["reads"]) == 1, step
        assert step["read after backward"] == [2], step


def test_a_batch_bound_for_a_device_is_checked_on_the_host():
    """The ids of a batch that moves to a device are checked before it moves, with the model's own errors: the model
    skips the check of ids it would have to wait for."""
    rng = np.random.default_rng(0)
    batch = random_batch(rng)
    moved = batch_to_device(batch, "meta", VOCAB_SIZE)
    assert all(tensor.device.type == "meta" for tensor in moved.values())
    for name, value, message in (
        ("input_ids", VOCAB_SIZE, r"Token ids must be in \[0, 100\) \(vocab_size\), got ids from \d+ to 100"),
        ("decoder_input_ids", -1, r"Token ids must be in \[0, 100\) \(vocab_size\), got ids from -1 to"),
        ("labels", VOCAB_SIZE + 5, r"labels must be in \[0, 100\) \(vocab_size\) or -100 \(ignored\), got labels"),
    ):
        bad = {key: tensor.clone() for key, tensor in batch.items()}
        bad[name][0, 0] = value
        with pytest.raises(ValueError, match=message):
            batch_to_device(bad, "meta", VOCAB_SIZE)


def test_under_bf16_autocast_the_loss_takes_the_logits_as_autocast_made_them():
    """accelerate's prepared model returns a float32 copy of its bf16 logits; the step reads them as they are (the loss
    sums in float32 chunk by chunk), and its loss is the one the float32 copy gives."""
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(tiny_model_config())
    optimizer = recipe_adam(accelerator, model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    batch = random_batch(np.random.default_rng(0))
    with torch.no_grad():
        copied = model(**{key: value for key, value in batch.items() if key != "labels"}).logits
    assert copied.dtype == torch.float32  # accelerate's copy
    expected = modeling_vaswani.label_smoothed_cross_entropy(copied, batch["labels"], 0.1)[0].sum().item()

    seen = []  # the logits each forward pass of the prepared model hands back, as the loss reads them
    model.register_forward_hook(lambda module, inputs, output: seen.append(output.logits.dtype))
    result = train_step(accelerator, model, optimizer, None, [batch], 0.1)
    assert seen == [torch.bfloat16]
    assert result.loss == expected


@pytest.mark.parametrize(("device", "fused"), [("cpu", False), ("cuda", True)])
def test_the_recipes_adam_is_the_papers_and_fused_on_cuda(device, fused):
    """Section 5.3: beta1 0.9, beta2 0.98, epsilon 1e-9; one fused kernel per update on CUDA (the accelerator of a
    device that this machine may not have: only its device and its state are read)."""
    accelerator = SimpleNamespace(device=torch.device(device), state=SimpleNamespace(deepspeed_plugin=None))
    optimizer = recipe_adam(accelerator, [torch.nn.Parameter(torch.zeros(2))])
    assert isinstance(optimizer, torch.optim.Adam)
    assert (optimizer.defaults["betas"], optimizer.defaults["eps"]) == ((0.9, 0.98), 1e-9)
    assert optimizer.defaults["fused"] is fused and optimizer.defaults["weight_decay"] == 0
