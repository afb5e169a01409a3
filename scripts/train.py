"""Train the Transformer with the recipe of "Attention Is All You Need", section 5, through Hugging Face Accelerate.

`main` follows the paper: 5.1 batches of about --batch_tokens tokens (vaswani.training.data, .batching), 5.2 one
optimizer step per batch (vaswani.training.step), 5.3 Adam with the warmup-then-inverse-square-root learning rate
(vaswani.training.schedule), 5.4 dropout and label smoothing, 6.1 the last checkpoints averaged into the final model
(vaswani.training.run). The flags take transformers' `TrainingArguments` names where the meaning is the same
(vaswani.training.arguments.TrainArguments); docs/architecture.md walks through a step.

  python scripts/train.py --dataset_dir DIR --tokenizer TOK --preset small --output_dir OUT --max_steps 1000
  vaswani-train ... --preset base --config_overrides "encoder_layers=4,decoder_layers=4"   a variant of Table 3
  accelerate launch [--config_file configs/multi_gpu.yaml] scripts/train.py ...      (configs/README.md)
  vaswani-train ... --output_dir OUT --resume_from_checkpoint    continue a stopped run exactly where it stopped

SIGTERM or SIGINT finishes the step under way, checkpoints and exits with 143 / 130, printing the command that
resumes; a non-finite loss skips its step (docs/reliability.md). OUT receives checkpoints/, logs/ (TensorBoard),
train_log.jsonl, and at the end the averaged model with its tokenizer, training_curves.png, lr_schedule.png and
training_summary.json.
"""

import logging
import sys
import time
from dataclasses import asdict
from functools import partial

from vaswani.checks import UsageError, check_writable_dir
from vaswani.cli import command, parse_arguments
from vaswani.training.arguments import TrainArguments


# accelerate warns at every save that it leaves out the tied copies of the shared embedding (section 3.4); that is
# intended, and load_weights_into() checks that nothing else is missing.
logging.getLogger("accelerate.utils.other").setLevel(logging.ERROR)


# The modules vaswani-train needs beyond the model's (the train extra brings them); the GPU report carries them too.
NEEDS = ("accelerate", "datasets", "sacrebleu", "sacremoses", "evaluate")


@command(extra="train", needs=NEEDS)
def main(argv, callbacks=()):
    """vaswani-train; `callbacks` (`vaswani.training.run.TrainingCallback`) watch the run from Python."""
    (args,) = parse_arguments([TrainArguments], argv, description=__doc__.split("\n\n")[0])
    # Imported once the flags are parsed, so that --help and a mistake in them answer without datasets or accelerate.
    from accelerate.utils import set_seed

    from vaswani import VaswaniForConditionalGeneration
    from vaswani.corpora.tokenizer import load_tokenizer
    from vaswani.training.batching import paper_batch_tokens
    from vaswani.training.data import TrainingData, load_translation_dataset
    from vaswani.training.distributed import configure_deepspeed, launch_accelerator, shard_shared_embedding
    from vaswani.training.faults import StopSignal
    from vaswani.training.records import TrainingReport, process_records
    from vaswani.training.run import TrainingRun, model_config, step_settings
    from vaswani.training.schedule import inverse_sqrt_schedule, peak_lr_of
    from vaswani.training.step import recipe_adam, train_step
    from vaswani.training.validation import validate

    # --- Checks that would otherwise fail hours later, before any process group starts. ---
    output_dir = check_writable_dir(args.output_dir)
    dataset = load_translation_dataset(args.dataset_dir, args.source_lang, args.target_lang)
    tokenizer = load_tokenizer(args.tokenizer)
    run = TrainingRun(
        output_dir,
        max_steps=args.max_steps,
        save_steps=args.save_steps,
        save_total_limit=args.save_total_limit,
        average_last=args.average_last,
        argv=argv,
    )
    config, checkpoint = run.config_and_checkpoint(
        model_config(args, tokenizer), tokenizer, args.resume_from_checkpoint
    )

    # --- Processes and data (section 5.1). ---
    accelerator = launch_accelerator(
        output_dir,
        use_cpu=args.use_cpu,
        ddp_timeout=args.ddp_timeout,
        torch_compile=args.torch_compile,
        mixed_precision=args.mixed_precision,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        step_scheduler_with_optimizer=False,  # our schedule steps once per optimizer step, whatever the process count
        log_with=None if args.report_to == "none" else args.report_to,
    )
    if args.batch_tokens is None:  # the paper's step, however many processes and accumulated batches make it
        args.batch_tokens = paper_batch_tokens(accelerator.num_processes, args.gradient_accumulation_steps)
    data = TrainingData.load(accelerator, dataset, tokenizer, config, args)

    # --- The model (the same initial weights on every process), Adam and the schedule (section 5.3). ---
    set_seed(args.seed)
    model = VaswaniForConditionalGeneration(config)
    shard_shared_embedding(accelerator, model)
    accelerator.print(
        f"model: {args.preset or args.config_name}, {model.num_parameters() / 1e6:.1f}M parameters, d_model "
        f"{config.d_model}, d_ff {config.encoder_ffn_dim}, {config.encoder_layers}+{config.decoder_layers} layers, "
        f"{config.encoder_attention_heads} heads, dropout {config.dropout}, vocabulary {config.vocab_size}"
    )
    optimizer = recipe_adam(
        accelerator, model.parameters(), betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon
    )
    peak_lr = peak_lr_of(args.lr_schedule, config.d_model, args.warmup_steps, args.lr_scale, args.peak_lr)
    scheduler = inverse_sqrt_schedule(optimizer, args.warmup_steps, peak_lr)
    for callback in callbacks:
        callback.on_train_begin(accelerator, model, optimizer)
    configure_deepspeed(accelerator, args.max_grad_norm)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    if accelerator.gradient_accumulation_steps != args.gradient_accumulation_steps:
        raise UsageError(
            f"the accelerate config accumulates {accelerator.gradient_accumulation_steps} batches but "
            f"--gradient_accumulation_steps is {args.gradient_accumulation_steps}; make them agree."
        )

    # --- Where the run stands: step 0, or exactly where its checkpoint left off. ---
    settings = step_settings(args, accelerator, dataset["train"], tokenizer)
    state = run.start(accelerator, settings, args.seed, checkpoint, args.resume_with_changes)
    batches = run.step_batches(data.train_loader, state, args.gradient_accumulation_steps)
    if args.report_to != "none":
        accelerator.init_trackers(
            "logs", config={k: v for k, v in asdict(args).items() if isinstance(v, (int, float, str, bool))}
        )
    report = TrainingReport(
        accelerator,
        output_dir,
        max_steps=args.max_steps,
        logging_steps=args.logging_steps,
        start=state,
        max_bad_steps=args.max_bad_steps,
    )
    validation = partial(
        validate,
        accelerator,
        valid_loader=data.valid_loader,
        tokenizer=tokenizer,
        bleu_pairs=data.bleu_pairs,
        batch_size=args.per_device_eval_batch_size,
        num_beams=args.generation_num_beams,
        length_penalty=args.eval_length_penalty,
        max_source_length=args.max_source_length,
    )

    # --- Training (sections 5.2-5.4): one optimizer step per pass, until --max_steps or a reason to stop. ---
    trained_model, stop, saved = accelerator.unwrap_model(model, keep_torch_compile=False), None, None
    compiled, first_step = trained_model is not accelerator.unwrap_model(model), state.step
    model.train()
    with StopSignal() as signals:  # SIGTERM and SIGINT end the run after the step under way, checkpointed
        while state.step < args.max_steps and stop is None:
            started = time.perf_counter()
            result = train_step(
                accelerator,
                model,
                optimizer,
                scheduler,
                next(batches),
                args.label_smoothing_factor,
                args.max_grad_norm,
                stop_vote=signals.received is not None,
            )
            seconds = time.perf_counter() - started
            if compiled and state.step == first_step:
                accelerator.print(
                    f"torch.compile: the first step, compiling the model, took {seconds:.1f} s "
                    "(a batch of a new shape compiles once more)"
                )
            state.add_step(result, seconds)
            for callback in callbacks:
                callback.on_step_end(state, result)
            report.step(state, result, seconds)
            if args.eval_steps and state.step % args.eval_steps == 0:
                report.validation(state, validation(trained_model))
            saved = run.save_if_due(accelerator, model, config, state, result, args.stop_after) or saved
            stop = run.stop_reason(state, result, signals, saved, args.max_bad_steps, args.stop_after)
    report.close()
    # The DDP wrapper is done with. Freed now, while every process is still connected: its reducer holds the gloo
    # process group, and tearing that down after a peer has exited can wait for the peer forever (seen with two CPU
    # ranks, after the run's work was all done).
    model = optimizer = scheduler = None
    accelerator.free_memory()
    if stop is not None:
        accelerator.print(stop.message, file=sys.stderr if stop.exit_code else sys.stdout, flush=True)
        accelerator.end_training()
        if stop.exit_code:
            raise SystemExit(stop.exit_code)
        return None

    # --- Section 6.1: the final model averages the last checkpoints. ---
    final_model, averaged = run.average(accelerator, config)
    processes = process_records(accelerator, trained_model, final_model, tokenized=not data.train.from_cache)
    final_eval = validation(final_model)
    if accelerator.is_main_process:
        final_model.save_pretrained(output_dir)  # config, weights, generation config (beam 4, alpha 0.6), code
        tokenizer.save_pretrained(output_dir)
    schedule = {"schedule": args.lr_schedule, "max_steps": args.max_steps, "warmup_steps": args.warmup_steps}
    report.end(
        state,
        final_eval,
        averaged,
        plot_schedule={**schedule, "peak_lr": peak_lr, "bleu_samples": args.eval_bleu_samples},
        summary={
            "preset": args.preset,
            "config": final_model.config.to_diff_dict(),
            "num_parameters": final_model.num_parameters(),
            **data.summary(state),
            "processes": processes,  # per process: checksums of its weights, and whether it tokenized the corpus
            "resumed_from": str(checkpoint) if checkpoint else None,
            "args": asdict(args),
        },
    )
    if accelerator.is_main_process and args.push_to_hub:
        from vaswani.hub.push import push_after_training  # the hub extra: only a run that pushes needs it

        push_after_training(output_dir, args.hub_model_id, private=args.hub_private_repo)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return final_model


if __name__ == "__main__":
    main()
