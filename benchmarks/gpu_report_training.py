"""The GPU report's training measurements beyond benchmarks/benchmark.py's: where one step's time goes
(`profile_training`) and how soon the paper's recipe translates well (`time_to_bleu`). Not a tool:
`python -m benchmarks.gpu_report_measure` runs them.
"""

import contextlib
import copy
import json
import re
import statistics
import time
from pathlib import Path

import torch

from vaswani.checks import UsageError, tokenizer_ids


# What a step's time is spent on, by the name of the kernel (on a CPU, of the operator) that spends it; the first
# pattern that matches wins. Eager kernels of the loss are told by the operator that launched them (`LOSS_RANGE`).
KERNEL_KINDS = (
    ("loss", r"logsumexp|log_?softmax|nll_loss|cross_?entropy"),
    ("attention", r"flash|fmha|attention|sdpa"),
    ("matrix products", r"gemm|cutlass|xmma|nvjet|cublas|wgmma|^aten::(mm|addmm|bmm|baddbmm|linear|matmul)$"),
    ("optimizer", r"multi_tensor|foreach|adam"),
    ("normalisation and reductions", r"norm|reduce|triton_red|triton_per|softmax|amax|sum|mean"),
    (
        "elementwise",
        r"elementwise|triton_poi|vectorized|unrolled|copy|fill|dropout|relu|add|sub|mul|div|exp|where|cat",
    ),
)
LOSS_RANGE = "label-smoothed loss"


def kernel_kind(name: str, in_loss: bool) -> str:
    if in_loss:
        return "loss"
    return next((kind for kind, pattern in KERNEL_KINDS if re.search(pattern, name, re.I)), "other")


@contextlib.contextmanager
def loss_ranged():
    """The loss's forward and backward, each run under a `LOSS_RANGE` profiler range, for the block's time."""
    from torch.profiler import record_function

    from vaswani.modeling.modeling_vaswani import VaswaniLabelSmoothedCrossEntropy as Loss

    originals = {name: getattr(Loss, name) for name in ("forward", "backward")}
    for name, original in originals.items():

        def ranged(*inputs, original=original):
            with record_function(LOSS_RANGE):
                return original(*inputs)

        setattr(Loss, name, staticmethod(ranged))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(Loss, name, staticmethod(original))


def profile_training(measure, args) -> dict:
    """Where the time of one training step goes (torch.profiler), `measure(args)` running the steps `args` asks for:
    on CUDA each kernel's device time, on a CPU each operator's own time, grouped into KERNEL_KINDS (`shares`, of the
    step's profiled total) and the `top` kernels.
    Eager, the loss's kernels are those launched under its forward and backward (timed in a `LOSS_RANGE` range);
    compiled, those whose fused names say so."""
    from torch.profiler import ProfilerActivity, profile

    warm, once = copy.copy(args), copy.copy(args)  # copies keep the worker's memory baseline
    warm.repeats, once.warmup, once.repeats = 1, 0, 1
    on_cuda = args.device == "cuda"
    # A range around the loss, eager only: a compiled graph would break at it.
    with contextlib.nullcontext() if args.compile_training else loss_ranged():
        measure(warm)  # warm-up (and compilation)
        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])) as profiler:
            measure(once)
    spent = {}  # (kernel name, kind) -> [calls, microseconds]
    for event in profiler.events():
        parents, parent = set(), event
        while parent is not None:
            parents.add(parent.name)
            parent = parent.cpu_parent
        pieces = (
            [(k.name, k.duration) for k in event.kernels] if on_cuda else [(event.name, event.self_cpu_time_total)]
        )
        for name, microseconds in pieces:
            entry = spent.setdefault((name, kernel_kind(name, LOSS_RANGE in parents)), [0, 0.0])
            entry[0] += 1
            entry[1] += microseconds
    total = sum(microseconds for _, microseconds in spent.values())
    if not total:
        raise RuntimeError("the profiler recorded no kernel time")
    shares = {}
    for (_, kind), (_, microseconds) in spent.items():
        shares[kind] = shares.get(kind, 0.0) + microseconds / total
    top = sorted(spent.items(), key=lambda item: -item[1][1])[:12]
    return {
        "total_ms": total / 1000,
        "timed": "device time of each kernel" if on_cuda else "each operator's own CPU time",
        "shares": dict(sorted(shares.items(), key=lambda item: -item[1])),
        "top": [
            {"kernel": name[:120], "kind": kind, "calls": calls, "ms": us / 1000, "share": us / total}
            for (name, kind), (calls, us) in top
        ],
    }


def time_to_bleu(args, sizes, deadline, publish) -> dict:
    """The paper's recipe on the prepared corpus for the time left (at most `sizes.bleu_minutes` of training), test
    BLEU of the paper's beam search every `sizes.bleu_every_minutes`, evaluations not counted as training. The warmup is
    the paper's 4% of the steps the run will take (timed on 10 calibration steps), the peak the paper's; the untrained
    model's decoding of the longest sentences sets the time kept for each evaluation. Eager: compiling would cost a
    minute of a few minutes' run."""
    import sacrebleu
    from accelerate import Accelerator
    from transformers import AutoTokenizer

    from benchmarks.gpu_report_prepare import CarriedPairs
    from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
    from vaswani.modeling.pipeline_vaswani import longest_first, translate_batch
    from vaswani.training.batching import StepBatches, TokenBucketSampler
    from vaswani.training.checkpoints import TrainState
    from vaswani.training.schedule import inverse_sqrt_schedule, paper_peak_lr
    from vaswani.training.step import recipe_adam, train_step

    corpus_dir = Path(args.corpus_dir)
    if not (corpus_dir / "train.npz").exists():
        raise UsageError(f"{corpus_dir} holds no corpus: run `python -m benchmarks.gpu_report_prepare` first.")
    device = torch.device(args.device)
    accelerator = Accelerator(cpu=device.type == "cpu", mixed_precision="bf16" if device.type == "cuda" else "no")
    tokenizer = AutoTokenizer.from_pretrained(corpus_dir / "tokenizer")
    test = json.loads((corpus_dir / "test.json").read_text())
    test_sources, references = test["sources"][: sizes.bleu_pairs], test["references"][: sizes.bleu_pairs]
    by_length = longest_first([len(text) for text in test_sources])  # less padding
    size = sizes.bleu_eval_batch
    batches = [by_length[start : start + size] for start in range(0, len(by_length), size)]
    config = VaswaniConfig.from_preset(sizes.bleu_preset, **tokenizer_ids(tokenizer))
    pairs = CarriedPairs(corpus_dir / "train.npz", config.pad_token_id, config.decoder_start_token_id)
    sampler = TokenBucketSampler(
        pairs.lengths["source"], pairs.lengths["target"], sizes.bleu_batch_tokens, seed=0, batches_per_step=1
    )
    loader = torch.utils.data.DataLoader(pairs, sampler=sampler, batch_size=None)

    def fresh_run(warmup=None, peak=None):
        """A new model from the same seed, prepared with Adam and, given a warmup, the paper's schedule; a new
        `TrainState`, and the batches from its start."""
        torch.manual_seed(0)
        model = VaswaniForConditionalGeneration(config)
        optimizer = recipe_adam(accelerator, model.parameters(), lr=1.0 if warmup else 1e-4)
        scheduler = inverse_sqrt_schedule(optimizer, warmup, peak) if warmup else None
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
        state = TrainState()
        return model.train(), optimizer, scheduler, state, StepBatches(loader, state, 1)

    def step(model, optimizer, scheduler, state, batches):
        """One step of the recipe, counted in `state`; its loss per target token."""
        start = time.perf_counter()
        result = train_step(accelerator, model, optimizer, scheduler, next(batches), 0.1)
        state.add_step(result, time.perf_counter() - start)  # train_step ends in a sync: the time is its own
        return result.loss / result.target_tokens

    # translate_batch, not vaswani.evaluation's translate(): that imports `evaluate`, which the carry leaves out.
    def translated(model, rows) -> list[str]:
        model.eval()
        with torch.no_grad(), accelerator.autocast():
            sources = [test_sources[i] for i in rows]
            answers = translate_batch(model, tokenizer, sources, num_beams=4, length_penalty=0.6, do_sample=False)
        model.train()
        return [hypotheses[0]["translation_text"] for hypotheses in answers]

    calibration, step_times = fresh_run(), []
    for _ in range(10):
        before = calibration[3].train_seconds
        step(*calibration)
        step_times.append(calibration[3].train_seconds - before)
    started = time.perf_counter()
    translated(accelerator.unwrap_model(calibration[0]), batches[0])
    evaluation_seconds = (time.perf_counter() - started) * len(batches)  # at most: untrained, the longest batch
    del calibration
    accelerator.free_memory()  # the calibration's model and optimizer

    # Training time: what is left once every evaluation (one every bleu_every_minutes, and the last) is kept aside.
    every = 60 * sizes.bleu_every_minutes
    available = deadline.left() - evaluation_seconds
    available -= int(available / (every + evaluation_seconds)) * evaluation_seconds
    seconds = min(60 * sizes.bleu_minutes, available)
    step_seconds = statistics.median(step_times[2:])
    planned_steps = max(1, int(seconds / step_seconds))
    warmup = max(1, round(0.04 * planned_steps))
    peak = paper_peak_lr(config.d_model, 4000)
    metric = sacrebleu.metrics.BLEU()
    results = {
        "points": [],
        "preset": sizes.bleu_preset,
        "batch_tokens": sizes.bleu_batch_tokens,
        "planned_minutes": seconds / 60,
        "planned_steps": planned_steps,
        "warmup_steps": warmup,
        "peak_lr": peak,
        "test_pairs": len(test_sources),
        "evaluation_seconds_kept": evaluation_seconds,
        "stopped_by_deadline": False,
        "signature": "n/a (no evaluation yet)",
    }

    run = fresh_run(warmup, peak)
    model, state = accelerator.unwrap_model(run[0]), run[3]
    losses, next_evaluation = [], every

    def evaluate():
        hypotheses = [None] * len(test_sources)
        for rows in batches:
            for row, hypothesis in zip(rows, translated(model, rows)):
                hypotheses[row] = hypothesis
        score = metric.corpus_score(hypotheses, [references])
        results["points"].append(
            {
                "minutes": state.train_seconds / 60,
                "steps": state.step,
                "bleu": score.score,
                "train_loss": statistics.mean(losses[-50:]),
            }
        )
        results["signature"] = str(metric.get_signature())
        publish(results)

    while state.train_seconds < seconds:
        if deadline.left() < evaluation_seconds + step_seconds:
            results["stopped_by_deadline"] = True
            break
        losses.append(step(*run))
        if state.train_seconds >= next_evaluation:
            evaluate()
            next_evaluation += every
    if losses and (not results["points"] or results["points"][-1]["steps"] != state.step):
        evaluate()
    return results
