"""The distributed strategy a run gets, and what the recipe needs of it: the Accelerator `accelerate launch` asked for,
checked to be what was asked, the shared embedding sharded as FSDP2 needs it, and DeepSpeed given the recipe's settings.

`accelerate launch --config_file configs/X.yaml` tells the script which strategy to run through environment variables;
accelerate then sets it up only where it can (FSDP only on GPU-like devices, for example) and otherwise falls back to
plain data parallelism without a word. A run here either gets the strategy that was asked for or stops at its start
saying why (`LaunchedStrategy.check`).
"""

import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
from accelerate import Accelerator
from accelerate.utils import (
    DistributedType,
    DynamoBackend,
    InitProcessGroupKwargs,
    ProjectConfiguration,
    parse_flag_from_env,
)

from ..checks import UsageError


# How long the other processes wait while the main process tokenizes a corpus the first time: as long as that takes
# on its cores (more than half an hour for 36M pairs on 2 cores), which --ddp_timeout, the limit of a training step's
# collectives, need not cover. A main process that fails ends the launch at once (the launcher stops every process).
FIRST_TOKENIZATION_WAIT = timedelta(hours=24)

# The oldest torch tested whose FSDP2 trains this model through a run: with torch 2.11 the training step after the
# first validation fails in the embedding ("got mixed torch.Tensor and DTensor"), the shared embedding's unit sharded.
FSDP2_MIN_TORCH = (2, 13)


@dataclass(frozen=True)
class LaunchedStrategy:
    """What `accelerate launch` asked for (its environment variables: the strategy, the processes it started on this
    machine), and whether this run is on the CPU."""

    fsdp: bool
    deepspeed: bool
    on_cpu: bool
    local_processes: int = 1

    @classmethod
    def from_environment(cls, cpu: bool = False) -> "LaunchedStrategy":
        return cls(
            fsdp=parse_flag_from_env("ACCELERATE_USE_FSDP"),
            deepspeed=parse_flag_from_env("ACCELERATE_USE_DEEPSPEED"),
            on_cpu=cpu or not torch.accelerator.is_available(),
            local_processes=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        )

    def compiles(self, torch_compile: bool | None) -> bool:
        """Whether the model trains through torch.compile: as asked, else on an accelerator. On the GPU, compiling
        trained 19-25% more tokens a second at a fixed batch shape (docs/speed.md, "GPU"); on the CPU, compiling the
        step costs minutes of the short runs a CPU makes."""
        return not self.on_cpu if torch_compile is None else torch_compile

    def accelerator(self, project_dir, ddp_timeout: int, torch_compile: bool | None = None, **options) -> Accelerator:
        """The Accelerator for this launch. On the CPU, several launched processes train together over gloo: plain
        data parallelism (accelerate's `cpu=True`), or DeepSpeed on its CPU accelerator (`DS_ACCELERATOR=cpu`). On
        CUDA, float32 matrix products run in TF32. `torch_compile` (`compiles`) decides accelerate's dynamo backend,
        whatever `accelerate launch --dynamo_backend` set: inductor, which `prepare` wraps the model in, or none."""
        process_group = {"timeout": timedelta(seconds=ddp_timeout)}
        sharded = self.fsdp or self.deepspeed  # set up by accelerate for their devices, or refused by `check`
        if self.on_cpu and sharded:
            process_group["backend"] = "gloo"
        if self.on_cpu and self.deepspeed:
            os.environ.setdefault("DS_ACCELERATOR", "cpu")  # read when DeepSpeed is first imported, just below
        accelerator = Accelerator(
            cpu=self.on_cpu and not sharded,
            project_config=ProjectConfiguration(project_dir=str(project_dir), logging_dir=str(project_dir)),
            kwargs_handlers=[InitProcessGroupKwargs(**process_group)],
            dynamo_backend="inductor" if self.compiles(torch_compile) else "no",
            **options,
        )
        if accelerator.device.type == "cuda":
            # float32 matrix products (all of them without mixed precision, the loss's few with it) on TF32 tensor
            # cores, as NVIDIA's and fairseq's GPU recipes train; the setting reaches CUDA only.
            torch.set_float32_matmul_precision("high")
        return accelerator

    def check(self, accelerator: Accelerator) -> None:
        """Stop unless accelerate set up what the launch asked for, with no more processes than the CPU has cores
        where there is no GPU (a GPU config, one process per GPU, would start its 8 processes on a laptop), and FSDP
        only with a torch whose FSDP2 trains the model through a run."""
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        if self.on_cpu and self.local_processes > cores:
            raise UsageError(
                f"{self.local_processes} processes were launched on this machine, which has no GPU and {cores} CPU "
                f"core{'s' if cores > 1 else ''}: the launcher config is for GPUs (a process per GPU). On the CPU, "
                f"launch one process per core: accelerate launch --multi_gpu --num_processes {cores} --num_machines 1 "
                "--mixed_precision no scripts/train.py ... (configs/README.md)."
            )
        asked = "FSDP" if self.fsdp else "DeepSpeed" if self.deepspeed else None
        got = accelerator.distributed_type
        if self.fsdp and got != DistributedType.FSDP or self.deepspeed and got != DistributedType.DEEPSPEED:
            where = "the CPU" if self.on_cpu else str(accelerator.device)
            raise UsageError(
                f"the launch asks for {asked}, but accelerate set up {got.value} on {where}"
                + (
                    " (accelerate runs FSDP on GPUs only). On a CPU, train with plain data parallelism "
                    "(`accelerate launch --multi_gpu ...`) or DeepSpeed ZeRO-2 (configs/deepspeed_zero2.yaml)."
                    if self.fsdp and self.on_cpu
                    else "."
                )
            )
        if self.fsdp and torch.__version__ < FSDP2_MIN_TORCH:
            raise UsageError(
                f"FSDP training needs torch {'.'.join(map(str, FSDP2_MIN_TORCH))} or newer; this is torch "
                f"{torch.__version__}. Upgrade torch, or train with plain data parallelism (`accelerate launch "
                "--multi_gpu ...`) or DeepSpeed ZeRO-2 (configs/deepspeed_zero2.yaml)."
            )


def launch_accelerator(
    project_dir, *, use_cpu=False, ddp_timeout=1800, torch_compile=None, **accelerator_options
) -> Accelerator:
    """The accelerator of what `accelerate launch` set (processes, DDP / FSDP / DeepSpeed, precision), or a stop here
    saying why that strategy cannot run (`LaunchedStrategy.check`); the model compiled as `LaunchedStrategy.compiles`
    says; `accelerator_options` go to `Accelerator`."""
    strategy = LaunchedStrategy.from_environment(cpu=use_cpu)
    accelerator = strategy.accelerator(project_dir, ddp_timeout, torch_compile, **accelerator_options)
    strategy.check(accelerator)
    accelerator.print(f"strategy: {describe(accelerator)}")
    return accelerator


@contextlib.contextmanager
def main_process_first(accelerator: Accelerator):
    """accelerate's `main_process_first()` inside `local_main_process_first()`: the main process runs the block
    first, then the first process of every other machine, then all the others. They wait in a gloo group of their
    own, for up to FIRST_TOKENIZATION_WAIT whatever --ddp_timeout says."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        yield
        return
    group = torch.distributed.new_group(backend="gloo", timeout=FIRST_TOKENIZATION_WAIT)
    with goes_first(accelerator.is_main_process, group), goes_first(accelerator.is_local_main_process, group):
        yield
    torch.distributed.destroy_process_group(group)


@contextlib.contextmanager
def goes_first(first: bool, group):
    """The block in this process before the processes of `group` that are not `first`, or after those that are."""
    if not first:
        torch.distributed.barrier(group=group)
    yield
    if first:
        torch.distributed.barrier(group=group)


def describe(accelerator: Accelerator) -> str:
    """The strategy that runs, in a few words: for the start-up line and training_summary.json."""
    kind = accelerator.distributed_type
    processes = f"{accelerator.num_processes} process{'es' if accelerator.num_processes > 1 else ''}"
    if kind == DistributedType.FSDP:
        plugin = accelerator.state.fsdp_plugin
        detail = f"FSDP{plugin.fsdp_version}, {str(plugin.state_dict_type).split('.')[-1]}"
    elif kind == DistributedType.DEEPSPEED:
        detail = f"DeepSpeed ZeRO stage {accelerator.state.deepspeed_plugin.zero_stage}"
    elif kind == DistributedType.NO:
        detail = "one process"
    else:
        detail = f"data parallel ({kind.value}, {torch.distributed.get_backend()})"
    compiled = accelerator.state.dynamo_plugin.backend != DynamoBackend.NO
    return (
        f"{detail}, {processes} on {accelerator.device.type}, mixed precision {accelerator.mixed_precision}, "
        f"torch.compile {'on' if compiled else 'off'}"
    )


def shard_shared_embedding(accelerator: Accelerator, model: torch.nn.Module) -> None:
    """FSDP2: make the modules that hold the shared embedding matrix (section 3.4) one shard unit.

    The matrix is one parameter held by the shared embedding, the encoder's and decoder's `embed_tokens` and the
    output projection; `fully_shard` manages a parameter in one unit only, and accelerate groups only the input and
    output embeddings, so the encoder's and decoder's holders would meet it again in another unit: torch 2.12 and
    later refuse that; torch 2.11 shards the matrix a second time, as a second parameter: the tie silently broken.
    Done before the optimizer is built, with the options accelerate gives its own units; accelerate then shards the
    layers and the rest, leaving this unit as it is.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if not accelerator.is_fsdp2:
        return
    plugin = accelerator.state.fsdp_plugin
    fully_shard(
        shared_embedding_holders(model),
        reshard_after_forward=False,  # as accelerate's own embedding unit: it is needed again at the end of forward
        offload_policy=plugin.cpu_offload,
        mp_policy=plugin.mixed_precision_policy or MixedPrecisionPolicy(),
    )


def shared_embedding_holders(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules that hold the input embedding matrix as a parameter of their own: for the paper's model the shared
    embedding, the encoder's and decoder's `embed_tokens` and the output projection (fewer in imported checkpoints
    that untie them)."""
    shared = model.get_input_embeddings().weight
    return [module for module in model.modules() if any(p is shared for p in module.parameters(recurse=False))]


def configure_deepspeed(accelerator: Accelerator, max_grad_norm: float) -> None:
    """Give DeepSpeed the recipe's settings before `prepare` builds its engine. Batches hold a number of tokens, not
    of sentences, so the batch size DeepSpeed insists on is a placeholder; and the engine clips gradients itself, at
    its default of 1.0 unless told (accelerate drops a configured 0), where the paper does not clip."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        return
    plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 1
    plugin.deepspeed_config["gradient_clipping"] = max_grad_norm
