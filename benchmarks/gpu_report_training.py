"""The GPU report's training measurements beyond benchmarks/benchmark.py's: where one step's time goes
(`profile_training`) and how soon the paper's recipe translates well (`time_to_bleu`). Not a tool:
`python -m benchmarks.gpu_report_measure` runs them.
"""

import contextlib
import copy
import json
import math
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from vaswani.checks import UsageError, tokenizer_ids


# What a step's time is spent on, by the name of the kernel (on a CPU, of the operator) that spends it; the first
# pattern that matches wins. Eager kernels of the loss are told by the operator that launched them (`LOSS_RANGE`),
# compiled ones by their fused names.
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
    """Where the time of one training step (`measure(args)`) goes: each kernel's device time on CUDA, each operator's
    own time on a CPU, as shares of KERNEL_KINDS and the top kernels."""
    from torch.profiler import ProfilerActivity, profile

    warm, once = copy.copy(args), copy.copy(args)  # copies keep the worker's memory baseline
    warm.repeats, once.warmup, once.repeats = 1, 0, 1
    on_cuda = args.device == "cuda"
    # A range around the loss, compiled or not: the loss is computed outside the model, which is what is compiled.
    with loss_ranged():
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
            kind = next((kind for kind, pattern in KERNEL_KINDS if re.search(pattern, name, re.I)), "other")
            entry = spent.setdefault((name, "loss" if LOSS_RANGE in parents else kind), [0, 0.0])
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


@dataclass
class BleuRun:
    """What time to BLEU trains and scores: `begin(warmup)` starts a run from the same seed (with the paper's schedule
    of that warmup; None: a calibration run without one), `step()` trains one step of it (its loss per target token
    and its seconds), `evaluate()` scores it (test BLEU and sacreBLEU's signature)."""

    begin: Callable[[int | None], None]
    step: Callable[[], tuple[float, float]]
    evaluate: Callable[[], tuple[float, str]]


def time_to_bleu(args, sizes, deadline, publish) -> dict:
    """Test BLEU every `sizes.bleu_every_minutes` of the paper's recipe on the carried corpus (`scheduled_bleu`).
    Eager: compiling would cost a minute of a few minutes' run."""
    import sacrebleu
    from accelerate import Accelerator
    from transformers import AutoTokenizer

    from benchmarks.gpu_report_prepare import CarriedPairs
    from vaswani import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniTranslationPipeline
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
    config = VaswaniConfig.from_preset(sizes.bleu_preset, **tokenizer_ids(tokenizer))
    pairs = CarriedPairs(corpus_dir / "train.npz", config.pad_token_id, config.decoder_start_token_id)
    sampler = TokenBucketSampler(
        pairs.lengths["source"], pairs.lengths["target"], sizes.bleu_batch_tokens, seed=0, batches_per_step=1
    )
    loader = torch.utils.data.DataLoader(pairs, sampler=sampler, batch_size=None)
    peak = paper_peak_lr(config.d_model, 4000)
    metric = sacrebleu.metrics.BLEU()
    run = {}  # the run being trained: its model, optimizer, schedule, state and batches

    def begin(warmup):
        run.clear()
        accelerator.free_memory()  # the calibration run's model and optimizer
        torch.manual_seed(0)
        model = VaswaniForConditionalGeneration(config)
        optimizer = recipe_adam(accelerator, model.parameters(), lr=1.0 if warmup else 1e-4)
        scheduler = inverse_sqrt_schedule(optimizer, warmup, peak) if warmup else None
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
        state = TrainState()
        run.update(model=model.train(), optimizer=optimizer, scheduler=scheduler, state=state)
        run["batches"] = StepBatches(loader, state, 1)

    def step():
        start = time.perf_counter()
        result = train_step(accelerator, run["model"], run["optimizer"], run["scheduler"], next(run["batches"]), 0.1)
        seconds = time.perf_counter() - start  # train_step ends in a sync: the time is its own
        run["state"].add_step(result, seconds)
        return result.loss / result.target_tokens, seconds

    # The pipeline (longest first, in batches), not vaswani.evaluation's translate(): that imports `evaluate`, which
    # the carry leaves out.
    def evaluate():
        model = accelerator.unwrap_model(run["model"]).eval()
        pipeline = VaswaniTranslationPipeline(model=model, tokenizer=tokenizer, device=model.device)
        with torch.no_grad(), accelerator.autocast():
            answers = pipeline(test_sources, batch_size=sizes.bleu_eval_batch, num_beams=4, length_penalty=0.6)
        model.train()
        score = metric.corpus_score([answer["translation_text"] for answer in answers], [references])
        return score.score, str(metric.get_signature())

    results = {"preset": sizes.bleu_preset, "batch_tokens": sizes.bleu_batch_tokens, "peak_lr": peak}
    results |= {"test_pairs": len(test_sources)}
    return scheduled_bleu(BleuRun(begin, step, evaluate), sizes, deadline, publish, results)


SETTLED = 25  # calibration steps whose median is compared with the median of those before them


def scheduled_bleu(run: BleuRun, sizes, deadline, publish, results: dict) -> dict:
    """Time to BLEU's clock, whatever trains: `results` with the plan, and BLEU at each minute of training.

    The step time is measured first, on a calibration run, after a fresh process's slow start: on an H200 its first
    50 or so steps took 0.40 s each against 0.06 s after them (2026-12-04; most likely the first use of each batch
    shape, for which cuDNN's attention, the kernels the profile shows, builds its plans). So the calibration steps for at least `bleu_calibration_seconds`, and on while the median
    of its last SETTLED steps is still falling by more than 10% against the SETTLED before them (for at most twice
    that time), and takes that median. The training time is `bleu_minutes`, or less where the deadline, with the
    evaluations' time kept aside, leaves less. Their quotient is the planned steps, of which the paper's schedule
    warms up for 4%. The run then trains for that time, with an evaluation every `bleu_every_minutes` of training and
    at its end; it stops early only where the deadline would leave no time for the last evaluation.
    """
    started = time.monotonic()
    run.begin(None)
    times, begun = [], time.monotonic()  # the least time counts steps only, not the model's making
    while (spent := time.monotonic() - begun) < 2 * sizes.bleu_calibration_seconds:
        times.append(run.step()[1])
        recent, before = statistics.median(times[-SETTLED:]), statistics.median(times[-2 * SETTLED : -SETTLED] or [0])
        if spent >= sizes.bleu_calibration_seconds and len(times) >= 2 * SETTLED and recent >= 0.9 * before:
            break
    step_seconds = statistics.median(times[-SETTLED:])
    deadline.timings["calibration"] = time.monotonic() - started
    every = 60 * sizes.bleu_every_minutes
    evaluation_seconds = [sizes.bleu_evaluation_seconds]  # kept for each evaluation: a guess, then the longest seen
    evaluations = math.ceil(sizes.bleu_minutes / sizes.bleu_every_minutes)
    seconds = max(0.0, min(60 * sizes.bleu_minutes, deadline.left() - evaluations * evaluation_seconds[0]))
    planned = max(1, round(seconds / step_seconds))
    warmup = max(1, round(0.04 * planned))
    results |= {
        "calibration": {"steps": len(times), "seconds_per_step": step_seconds},
        "planned_minutes": seconds / 60,
        "planned_steps": planned,
        "warmup_steps": warmup,
        "points": [],
        "stopped_by_deadline": False,
        "signature": "n/a (no evaluation yet)",
    }
    run.begin(warmup)
    trained, steps, losses, next_evaluation = 0.0, 0, [], every

    def evaluate():
        started = time.monotonic()
        bleu, results["signature"] = run.evaluate()
        evaluation_seconds.append(time.monotonic() - started)
        point = {"minutes": trained / 60, "steps": steps, "bleu": bleu, "train_loss": statistics.mean(losses[-50:])}
        results["points"].append(point | {"evaluation_seconds": evaluation_seconds[-1]})
        results.update(taken_steps=steps, trained_minutes=trained / 60)
        publish(results)

    while trained < seconds:
        if deadline.left() < max(evaluation_seconds) + step_seconds:
            results["stopped_by_deadline"] = True
            break
        loss, spent = run.step()
        trained, steps = trained + spent, steps + 1
        losses.append(loss)
        if next_evaluation <= trained < seconds:
            evaluate()
            next_evaluation += every
    if steps and (not results["points"] or results["points"][-1]["steps"] != steps):
        evaluate()
    deadline.timings |= {"training": trained, "evaluations": sum(evaluation_seconds[1:])}
    return results
