"""The multi-device strategies that configs/ ships, through scripts/train.py on two gloo processes of this CPU: plain
DDP, FSDP2 (configs/fsdp.yaml), a launch that asks for what the machine cannot give, and a lost process that restarts
the job.

accelerate sets FSDP up on GPU-like devices only. The stand-in `fsdp-on-cpu` of tests/train_with_faults.py is the
smallest override of accelerate's state that lets FSDP2 run here: it takes the CPU's gloo processes for GPUs (their
backend and their device). train.py never does this; only these tests do, to run the rest of the FSDP path as it runs
on GPUs.

Every test here launches processes, so the module is marked slow, to keep the default suite within its time;
`.ci/run` runs it (`python3 -m pytest tests/test_distributed.py tests/test_fsdp.py -m slow`).
"""

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import torch
from helpers import (
    FAST,
    FAULTY_TRAIN,
    REPO_ROOT,
    SCRIPTS,
    accelerate_launch,
    make_dataset,
    max_difference,
    read_log,
    run_command,
    script_env,
    train_arguments,
    two_process_launch,
    word_tokenizer,
)
from safetensors.torch import load_file

from vaswani import VaswaniForConditionalGeneration
from vaswani.training.batching import TokenBucketSampler
from vaswani.training.distributed import FSDP2_MIN_TORCH


pytestmark = pytest.mark.slow


# Eight steps of two processes, checkpoints and validation every four, BLEU on one sentence (so one process has
# none to translate): as every launch below trains.
STEPS = ["--max_steps", 8, "--save_steps", 4, "--average_last", 2, "--eval_steps", 4, "--eval_bleu_samples", 1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A corpus whose validation split gives the two processes unequal numbers of batches."""
    root = tmp_path_factory.mktemp("distributed")
    data = make_dataset(root / "data", {"train": 400, "validation": 13})
    tokenizer = word_tokenizer(root / "tokenizer")
    return data, tokenizer


def arguments(corpus, output_dir, *extra):
    return train_arguments(
        *corpus, output_dir, *FAST, "--batch_tokens", 300, *STEPS, "--report_to", "none", "--ddp_timeout", 60, *extra
    )


def launch(config, *script_and_arguments, launcher_options=(), env=None, timeout=300, check=True):
    """`accelerate launch` of two processes with a config of configs/ (or --multi_gpu for DDP) and float32."""
    command = [*two_process_launch(config), *launcher_options, *script_and_arguments]
    return run_command(command, env=script_env(**(env or {})), timeout=timeout, check=check)


def final_weights(output_dir, name="model.safetensors"):
    return load_file(str(Path(output_dir) / name))


@pytest.fixture(scope="module")
def ddp_run(corpus, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("ddp") / "out"
    launch(None, SCRIPTS / "train.py", *arguments(corpus, output_dir))
    return output_dir


def test_the_validation_split_gives_the_processes_unequal_shares(corpus):
    """What the validation tests below rely on: one process has more batches than the other."""
    from datasets import load_from_disk

    pairs = load_from_disk(str(corpus[0]))["validation"]["translation"]
    lengths = [[len(pair[side].split()) + 1 for pair in pairs] for side in ("en", "es")]
    shares = [
        len(TokenBucketSampler(*lengths, 300, shuffle=False, num_replicas=2, rank=rank, drop_remainder=False))
        for rank in (0, 1)
    ]
    assert shares[0] != shares[1]


def test_ddp_validates_with_unequal_shares_and_says_which_strategy_ran(ddp_run):
    summary = json.loads((ddp_run / "training_summary.json").read_text())
    assert (
        summary["strategy"]
        == "data parallel (MULTI_CPU, gloo), 2 processes on cpu, mixed precision no, torch.compile off"
    )
    assert [r["step"] for r in read_log(ddp_run) if "val_loss" in r] == [4, 8, 8]  # periodic, then the final model


WAITS_FOR_THE_MAIN_PROCESS = """
import sys, time
from vaswani.training.distributed import launch_accelerator, main_process_first
accelerator = launch_accelerator(sys.argv[1], ddp_timeout=5)
with main_process_first(accelerator):
    if accelerator.is_main_process:
        time.sleep(15)  # tokenizing a large corpus: longer than --ddp_timeout
    print(f"rank {accelerator.process_index} went through at {time.time()}", flush=True)
accelerator.wait_for_everyone()
"""


def test_the_others_wait_for_the_main_process_longer_than_ddp_timeout(tmp_path):
    """The first start of a large corpus: the main process tokenizes for longer than --ddp_timeout while the others
    wait, and nobody times out; the others go through after it."""
    script = tmp_path / "waits.py"
    script.write_text(WAITS_FOR_THE_MAIN_PROCESS)
    result = launch(None, script, tmp_path / "project", timeout=120)
    went = dict(line.split(" went through at ") for line in result.stdout.splitlines() if "went through" in line)
    assert sorted(went) == ["rank 0", "rank 1"]
    assert float(went["rank 1"]) >= float(went["rank 0"])


def test_a_launch_that_asks_for_fsdp_on_a_cpu_stops_at_once_saying_why(corpus, tmp_path):
    result = launch("fsdp.yaml", SCRIPTS / "train.py", *arguments(corpus, tmp_path / "out"), check=False)
    assert result.returncode != 0
    assert (
        "train.py: error: the launch asks for FSDP, but accelerate set up NO on the CPU (accelerate runs FSDP on GPUs "
        "only). On a CPU, train with plain data parallelism (`accelerate launch --multi_gpu ...`) or DeepSpeed ZeRO-2 "
        "(configs/deepspeed_zero2.yaml)."
    ) in result.stderr
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_a_gpu_config_on_a_machine_without_gpus_stops_saying_how_to_launch_on_the_cpu(corpus, tmp_path):
    """configs/multi_gpu.yaml starts its 8 processes (one per GPU) wherever it is launched: on a CPU with fewer cores
    each of them stops at once, saying how many to launch."""
    if torch.cuda.is_available() or len(os.sched_getaffinity(0)) >= 8:
        pytest.skip("needs a machine without a GPU and with fewer than 8 cores")
    launcher = accelerate_launch("--config_file", REPO_ROOT / "configs" / "multi_gpu.yaml")
    command = [*launcher, SCRIPTS / "train.py", *arguments(corpus, tmp_path / "out")]
    result = run_command(command)
    assert result.returncode != 0
    cores = len(os.sched_getaffinity(0))
    assert (
        f"train.py: error: 8 processes were launched on this machine, which has no GPU and {cores} CPU cores: the "
        f"launcher config is for GPUs (a process per GPU). On the CPU, launch one process per core: accelerate launch "
        f"--multi_gpu --num_processes {cores} --num_machines 1 --mixed_precision no scripts/train.py ..."
    ) in result.stderr
    assert not (tmp_path / "out" / "checkpoints").exists()


@pytest.mark.skipif(torch.__version__ < FSDP2_MIN_TORCH, reason="train.py refuses FSDP with this torch")
@pytest.mark.parametrize("state_dict_type", ["FULL_STATE_DICT", "SHARDED_STATE_DICT"])
def test_fsdp2_trains_as_ddp_does_and_resumes_exactly(corpus, ddp_run, tmp_path, state_dict_type):
    """configs/fsdp.yaml (FSDP2, the shared embedding's four holders one shard unit) with the `fsdp-on-cpu` stand-in: the weights
    of DDP's run to float32 rounding, validation with unequal shares (no hang: --ddp_timeout 60), checkpoints of
    either kind that resume to the same bits, and a final model that loads whole."""
    script = [FAULTY_TRAIN, "fsdp-on-cpu"]
    options = ["--fsdp_state_dict_type", state_dict_type]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    result = launch("fsdp.yaml", *script, *arguments(corpus, straight), launcher_options=options)
    assert (
        f"strategy: FSDP2, {state_dict_type}, 2 processes on cpu, mixed precision no, torch.compile off"
        in result.stdout
    )
    assert max_difference(final_weights(straight), final_weights(ddp_run)) < 1e-5
    ours, theirs = ([r for r in read_log(run) if "val_loss" in r] for run in (straight, ddp_run))
    assert [r["val_loss"] for r in ours] == pytest.approx([r["val_loss"] for r in theirs], abs=1e-4)

    launch("fsdp.yaml", *script, *arguments(corpus, stopped, "--stop_after", 4), launcher_options=options)
    launch("fsdp.yaml", *script, *arguments(corpus, stopped, "--resume_from_checkpoint"), launcher_options=options)
    for name in ("checkpoints/step_0000008/model.safetensors", "model.safetensors"):
        assert max_difference(final_weights(straight, name), final_weights(stopped, name)) == 0, name

    model, info = VaswaniForConditionalGeneration.from_pretrained(straight, output_loading_info=True)
    assert (info["missing_keys"], info["unexpected_keys"]) == (set(), set())
    shared = model.model.shared.weight
    assert model.lm_head.weight is shared
    assert model.model.encoder.embed_tokens.weight is shared and model.model.decoder.embed_tokens.weight is shared


@pytest.mark.skipif(torch.__version__ < FSDP2_MIN_TORCH, reason="train.py refuses FSDP with this torch")
@pytest.mark.parametrize("num_beams", [1, 4])
def test_fsdp2_validates_bleu_in_step_and_as_one_process_does(corpus, tmp_path, num_beams):
    """BLEU during FSDP2 training on seven sentences of different lengths, each process translating its own share of
    the sharded model: the processes stay in step (synced_gpus) until both are done, greedy and with the paper's beam
    search, and the final model's BLEU is the one a single process gives."""
    from accelerate import Accelerator
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from vaswani.training import validate

    output_dir = tmp_path / "out"
    extra = ["--eval_bleu_samples", 7, "--generation_num_beams", num_beams]
    launch("fsdp.yaml", FAULTY_TRAIN, "fsdp-on-cpu", *arguments(corpus, output_dir, *extra))
    logged = [record for record in read_log(output_dir) if "bleu" in record]
    assert [record["step"] for record in logged] == [4, 8, 8]

    pairs = load_from_disk(str(corpus[0]))["validation"].select(range(7))["translation"]
    bleu_pairs = ([pair["en"] for pair in pairs], [pair["es"] for pair in pairs])
    model = VaswaniForConditionalGeneration.from_pretrained(output_dir)
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    alone = validate(Accelerator(cpu=True), model, [], tokenizer, bleu_pairs, num_beams=num_beams)
    assert (logged[-1]["bleu"], logged[-1]["example"]) == (alone["bleu"], alone["example"])


def test_a_killed_process_restarts_the_job_from_the_last_checkpoint(corpus, ddp_run, tmp_path):
    """`accelerate launch --max_restarts 1 ... --resume_from_checkpoint` as docs/training.md writes it: rank 1 is
    SIGKILLed after step 6 (mid-epoch, two steps past the last checkpoint); the launcher restarts both processes, which
    resume from step 4 and end with the weights of the run that was never interrupted.
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 gives each restart a store of its own: in the one torchrun shares by default,
    the restarted processes find the addresses of the lost ones and time out connecting to them
    (pytorch/pytorch#135712)."""
    output_dir = tmp_path / "out"
    script = [FAULTY_TRAIN, "rank-1-killed-after-step-6"]
    result = launch(
        None,
        *script,
        *arguments(corpus, output_dir, "--resume_from_checkpoint"),
        launcher_options=["--max_restarts", "1", "--rdzv_backend", "c10d"],
        env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
    )
    assert "resumed from" in result.stdout and "step_0000004" in result.stdout
    assert f"failed (exitcode: -{signal.SIGKILL.value}) local_rank: 1" in result.stderr  # the launcher saw the kill
    for name in ("checkpoints/step_0000008/model.safetensors", "model.safetensors"):
        assert max_difference(final_weights(ddp_run, name), final_weights(output_dir, name)) == 0, name


CHECKPOINT_4 = "checkpoints/step_0000004/model.safetensors"
# DeepSpeed compiles its shared-memory op and its Adam (configs/deepspeed_zero2.json) with g++ the first time a run
# needs them (about a minute): once here, before two processes would both wait for it, into a folder of this test run's.
# Not ~/.cache/torch_extensions: torch waits for as long as an op's `lock` file stands there, and a build killed in an
# earlier run leaves its file behind.
BUILD_DEEPSPEED_CPU_OPS = """
from deepspeed.comm.torch import build_shm_op
from deepspeed.ops.op_builder import FusedAdamBuilder
build_shm_op()
FusedAdamBuilder().load()
"""


@pytest.fixture(scope="module")
def deepspeed_env(tmp_path_factory):
    """The environment variables of a DeepSpeed run on the CPU, its ops built."""
    env = {"DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(tmp_path_factory.mktemp("torch_extensions"))}
    run_command([sys.executable, "-c", BUILD_DEEPSPEED_CPU_OPS], env=script_env(**env), timeout=600, check=True)
    return env


def test_deepspeed_zero2_trains_as_ddp_does_and_resumes(corpus, ddp_run, deepspeed_env, tmp_path):
    """configs/deepspeed_zero2.yaml on a machine without a GPU: ZeRO-2 for real (DeepSpeed's CPU accelerator, gloo)
    with DeepSpeed's own Adam (the config's optimizer block), no clipping as --max_grad_norm 0 says (DeepSpeed's
    default would clip at 1.0), DDP's weights; a resumed run ends as an uninterrupted one, to float32 rounding (1.2e-7
    measured: DeepSpeed's Adam does not resume bit-exactly, where torch's Adam wrapped by DeepSpeed did)."""
    train_py = SCRIPTS / "train.py"
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    result = launch("deepspeed_zero2.yaml", train_py, *arguments(corpus, straight), env=deepspeed_env)
    assert (
        "strategy: DeepSpeed ZeRO stage 2, 2 processes on cpu, mixed precision no, torch.compile off" in result.stdout
    )
    summary = json.loads((straight / "training_summary.json").read_text())
    assert summary["hardware"]["distributed_type"] == "DEEPSPEED"
    for name in ("checkpoints/step_0000008/model.safetensors", "model.safetensors"):
        assert max_difference(final_weights(straight, name), final_weights(ddp_run, name)) < 1e-6, name
    ours, theirs = ([r for r in read_log(run) if "val_loss" in r] for run in (straight, ddp_run))
    assert [r["val_loss"] for r in ours] == pytest.approx([r["val_loss"] for r in theirs], abs=1e-5)

    launch("deepspeed_zero2.yaml", train_py, *arguments(corpus, stopped, "--stop_after", 4), env=deepspeed_env)
    launch(
        "deepspeed_zero2.yaml", train_py, *arguments(corpus, stopped, "--resume_from_checkpoint"), env=deepspeed_env
    )
    assert max_difference(final_weights(straight, CHECKPOINT_4), final_weights(stopped, CHECKPOINT_4)) == 0
    for name in ("checkpoints/step_0000008/model.safetensors", "model.safetensors"):
        assert max_difference(final_weights(straight, name), final_weights(stopped, name)) < 1e-6, name
