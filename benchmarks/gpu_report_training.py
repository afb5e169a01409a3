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


def time_to_bleu(args, sizes, deadline, publish) -> dict:
    """Test BLEU every `sizes.bleu_every_minutes` of the paper's recipe on the carried corpus, for the time left.
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
    size = sizes.bleu_eval_batch  # test sentences translated at once
    config = VaswaniConfig.from_preset(sizes.bleu_preset, **tokenizer_ids(tokenizer))
    pairs = CarriedPairs(corpus_dir / "train.npz", config.pad_token_id, config.decoder_start_token_id)
    sampler = TokenBucketSampler(
        pairs.lengths["source"], pairs.lengths["target"], sizes.bleu_batch_tokens, seed=0, batches_per_step=1
    )
    loader = torch.utils.data.DataLoader(pairs, sampler=sampler, batch_size=None)

    def fresh_run(warmup=None, peak=None):
        """A new model from the same seed with Adam (and the paper's schedule, given a warmup), state and batches."""
        torch.manual_seed(0)
        model = VaswaniForConditionalGeneration(config)
        optimizer = recipe_adam(accelerator, model.parameters(), lr=1.0 if warmup else 1e-4)
        scheduler = inverse_sqrt_schedule(optimizer, warmup, peak) if warmup else None
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
        state = TrainState()
        return model.train(), optimizer, scheduler, state, StepBatches(loader, state, 1)

    def step(model, optimizer, scheduler, state, batches):
        """One step of the recipe, counted in `state`: its loss per target token, and its seconds."""
        start = time.perf_counter()
        result = train_step(accelerator, model, optimizer, scheduler, next(batches), 0.1)
        seconds = time.perf_counter() - start  # train_step ends in a sync: the time is its own
        state.add_step(result, seconds)
        return result.loss / result.target_tokens, seconds

    # The pipeline (longest first, in batches), not vaswani.evaluation's translate(): that imports `evaluate`, which
    # the carry leaves out.
    def translated(model, sources) -> list[str]:
        pipeline = VaswaniTranslationPipeline(model=model.eval(), tokenizer=tokenizer, device=model.device)
        with torch.no_grad(), accelerator.autocast():
            answers = pipeline(sources, batch_size=size, num_beams=4, length_penalty=0.6, do_sample=False)
        model.train()
        return [answer["translation_text"] for answer in answers]

    # Calibration: a step's time plans the run's steps (and so its warmup); the untrained model's translation of the
    # longest batch, the time kept for each evaluation.
    calibration = fresh_run()
    step_times = [step(*calibration)[1] for _ in range(10)]
    started = time.perf_counter()
    translated(accelerator.unwrap_model(calibration[0]), sorted(test_sources, key=len)[-size:])
    batches = -(-len(test_sources) // size)
    evaluation_seconds = (time.perf_counter() - started) * batches  # at most: untrained, the longest batch
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
        score = metric.corpus_score(translated(model, test_sources), [references])
        point = {"minutes": state.train_seconds / 60, "steps": state.step, "bleu": score.score}
        results["points"].append(point | {"train_loss": statistics.mean(losses[-50:])})
        results["signature"] = str(metric.get_signature())
        publish(results)

    while state.train_seconds < seconds:
        if deadline.left() < evaluation_seconds + step_seconds:
            results["stopped_by_deadline"] = True
            break
        losses.append(step(*run)[0])
        if state.train_seconds >= next_evaluation:
            evaluate()
            next_evaluation += every
    if losses and (not results["points"] or results["points"][-1]["steps"] != state.step):
        evaluate()
    return results
