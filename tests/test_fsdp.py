"""FSDP2 (`torch.distributed.fsdp.fully_shard`) on VaswaniForConditionalGeneration: 2 CPU processes, gloo backend.

The model's one embedding matrix (section 3.4) is held by four modules: `model.shared`, the encoder's and the
decoder's `embed_tokens` and `lm_head`. FSDP2 manages a parameter in exactly one group, so all four holders must be
sharded together in one `fully_shard([...])` call.

Each test runs a job on 2 ranks, started with `torch.multiprocessing` from a fork server that has imported this
module (torch, transformers) once; the ranks write what they observed to files, which the test checks. Marked slow
(processes, and a collective made to time out), as tests/test_distributed.py is; `.ci/run` runs both.
"""

import time
from datetime import timedelta
from pathlib import Path

import helpers
import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from helpers import max_difference
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani.training.distributed import shared_embedding_holders


pytestmark = pytest.mark.slow


WORLD_SIZE = 2
JOB_TIMEOUT_S = 120
COLLECTIVE_TIMEOUT = timedelta(seconds=60)
UNEQUAL_WORK_TIMEOUT = timedelta(seconds=10)
TRAINING_STEPS = 3
STEPS_BEFORE_CHECKPOINT = 2
STEPS_AFTER_CHECKPOINT = 2
WEIGHT_TOLERANCE = 1e-5

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)
SHARDED = StateDictOptions(full_state_dict=False)
EMBEDDING_KEYS = (
    "model.shared.weight",
    "model.encoder.embed_tokens.weight",
    "model.decoder.embed_tokens.weight",
    "lm_head.weight",
)

# Rows 0-1 go to rank 0 and rows 2-3 to rank 1. Each half holds as many labelled tokens (11) as the other: every
# rank's loss is a mean over its own tokens and FSDP averages the gradients over the ranks, which equals the mean
# over the full batch only when the halves weigh the same.
SOURCE_LENGTHS = (9, 5, 6, 8)
TARGET_LENGTHS = (7, 4, 4, 7)


def make_config() -> VaswaniConfig:
    return VaswaniConfig.from_preset("tiny", vocab_size=100, dropout=0.0)


def make_model(seed: int) -> VaswaniForConditionalGeneration:
    torch.manual_seed(seed)
    return VaswaniForConditionalGeneration(make_config())


def make_batch(seed: int) -> dict[str, torch.Tensor]:
    """A batch of random token ids in [4, 100), right-padded: pad id 0 in the source, -100 in the labels."""
    generator = torch.Generator().manual_seed(seed)
    rows = len(SOURCE_LENGTHS)
    input_ids = torch.zeros(rows, max(SOURCE_LENGTHS), dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    labels = torch.full((rows, max(TARGET_LENGTHS)), -100, dtype=torch.long)
    for row, (source_length, target_length) in enumerate(zip(SOURCE_LENGTHS, TARGET_LENGTHS)):
        input_ids[row, :source_length] = torch.randint(4, 100, (source_length,), generator=generator)
        attention_mask[row, :source_length] = 1
        labels[row, :target_length] = torch.randint(4, 100, (target_length,), generator=generator)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def training_batches(count: int) -> list[dict[str, torch.Tensor]]:
    return [make_batch(seed=100 + step) for step in range(count)]


def evaluation_batch() -> dict[str, torch.Tensor]:
    return make_batch(seed=999)


def rank_half(batch: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    rows = len(SOURCE_LENGTHS) // WORLD_SIZE
    return {name: tensor[rank * rows : (rank + 1) * rows] for name, tensor in batch.items()}


def make_optimizer(model: torch.nn.Module) -> torch.optim.Adam:
    return torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)


def train(model, optimizer, batches, rank: int | None = None) -> None:
    """One optimizer step per batch; a rank trains on its half of each batch, rank None on the whole batch."""
    model.train()
    for batch in batches:
        inputs = batch if rank is None else rank_half(batch, rank)
        model(**inputs).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def shard_model(model: VaswaniForConditionalGeneration, mesh: DeviceMesh, group_embedding_holders: bool = True):
    """FSDP2 bottom-up, as train.py has accelerate shard: each encoder and decoder layer, the shared embedding's
    holders as `vaswani.training.distributed` finds them (or, to show why, only the two accelerate groups), then the
    root."""
    for layer in (*model.model.encoder.layers, *model.model.decoder.layers):
        fully_shard(layer, mesh=mesh)
    if group_embedding_holders:
        fully_shard(shared_embedding_holders(model), mesh=mesh)
    else:
        fully_shard([model.model.shared, model.lm_head], mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


# ---------------------------------------------------------------------------------------------------------------
# Jobs: job(rank, work_dir) runs on every rank inside an initialised gloo process group and returns what the test
# checks. work_dir holds initial_state.pt, the weights every model trained from scratch starts from.


def initial_model(work_dir: Path) -> VaswaniForConditionalGeneration:
    model = make_model(seed=0)
    model.load_state_dict(torch.load(work_dir / "initial_state.pt", weights_only=True))
    return model


def cpu_mesh() -> DeviceMesh:
    return init_device_mesh("cpu", (WORLD_SIZE,))


def ungrouped_embeddings_job(rank: int, work_dir: Path) -> dict:
    model = shard_model(initial_model(work_dir), cpu_mesh(), group_embedding_holders=False)
    holders = (model.model.shared, model.model.encoder.embed_tokens, model.model.decoder.embed_tokens, model.lm_head)
    result = {
        "fully_shard_completed": True,
        "embedding_parameters": len({id(holder.weight) for holder in holders}),
        "error_type": None,
        "error_message": None,
    }
    try:
        # FSDP2 looks for a parameter managed by two groups when it initialises lazily, at the first forward.
        model(**rank_half(training_batches(1)[0], rank))
    except Exception as error:
        result.update(error_type=type(error).__name__, error_message=str(error))
    return result


def grouped_training_job(rank: int, work_dir: Path) -> dict:
    model = shard_model(initial_model(work_dir), cpu_mesh())
    optimizer = make_optimizer(model)  # after fully_shard, so that it holds the sharded parameters
    train(model, optimizer, training_batches(TRAINING_STEPS), rank)
    sharded_keys = list(model.state_dict())
    full_state = get_model_state_dict(model, options=FULL)
    model.eval()
    with torch.no_grad():
        logits = model(**evaluation_batch()).logits
    return {"sharded_state_dict_keys": sharded_keys, "full_state_dict": full_state, "logits": logits}


def checkpoint_job(rank: int, work_dir: Path) -> dict:
    mesh = cpu_mesh()
    batches = training_batches(STEPS_BEFORE_CHECKPOINT + STEPS_AFTER_CHECKPOINT)
    before, after = batches[:STEPS_BEFORE_CHECKPOINT], batches[STEPS_BEFORE_CHECKPOINT:]
    full_path, sharded_dir = work_dir / "full_checkpoint.pt", work_dir / "sharded_checkpoint"

    model = shard_model(initial_model(work_dir), mesh)
    optimizer = make_optimizer(model)
    train(model, optimizer, before, rank)
    full_checkpoint = {
        "model": get_model_state_dict(model, options=FULL),
        "optimizer": get_optimizer_state_dict(model, optimizer, options=FULL),
    }
    if rank == 0:  # cpu_offload=True gathers the full state on rank 0 only
        torch.save(full_checkpoint, full_path)
    dcp.save(
        {
            "model": get_model_state_dict(model, options=SHARDED),
            "optimizer": get_optimizer_state_dict(model, optimizer, options=SHARDED),
        },
        checkpoint_id=sharded_dir,
    )
    train(model, optimizer, after, rank)
    result = {
        "uninterrupted": get_model_state_dict(model, options=FULL),
        "full_model_keys": list(full_checkpoint["model"]),
        "full_optimizer_state_keys": list(full_checkpoint["optimizer"].get("state", {})),
    }
    dist.barrier()  # rank 0 has written the full checkpoint

    # Fresh models from another seed, so that every weight the resumed runs end with comes through the checkpoint.
    resumed = shard_model(make_model(seed=1), mesh)
    resumed_optimizer = make_optimizer(resumed)
    checkpoint = torch.load(full_path, weights_only=True)  # every rank reads the file rank 0 wrote
    set_model_state_dict(resumed, checkpoint["model"], options=FULL)
    set_optimizer_state_dict(resumed, resumed_optimizer, checkpoint["optimizer"], options=FULL)
    train(resumed, resumed_optimizer, after, rank)
    result["resumed_from_full"] = get_model_state_dict(resumed, options=FULL)

    resumed = shard_model(make_model(seed=1), mesh)
    resumed_optimizer = make_optimizer(resumed)
    state = {
        "model": get_model_state_dict(resumed, options=SHARDED),
        "optimizer": get_optimizer_state_dict(resumed, resumed_optimizer, options=SHARDED),
    }
    dcp.load(state, checkpoint_id=sharded_dir)
    set_model_state_dict(resumed, state["model"], options=SHARDED)
    set_optimizer_state_dict(resumed, resumed_optimizer, state["optimizer"], options=SHARDED)
    train(resumed, resumed_optimizer, after, rank)
    result["resumed_from_sharded"] = get_model_state_dict(resumed, options=FULL)
    return result


def unequal_work_job(rank: int, work_dir: Path) -> dict:
    """Rank 0 runs two forward passes, rank 1 one, both under FSDP2 on a process group with a 10 s timeout."""
    short_timeout_group = dist.new_group(timeout=UNEQUAL_WORK_TIMEOUT)
    model = shard_model(make_model(seed=0), DeviceMesh.from_group(short_timeout_group, "cpu"))
    model.eval()
    batch = rank_half(evaluation_batch(), rank)
    result = {"forwards_completed": 0, "error_type": None, "error_message": None}
    started = time.monotonic()
    with torch.no_grad():
        try:
            for _ in range(2 if rank == 0 else 1):
                model(**batch)
                result["forwards_completed"] += 1
        except Exception as error:
            result.update(error_type=type(error).__name__, error_message=str(error))
    result["seconds"] = time.monotonic() - started
    # Rank 1 waits in the final barrier, on the default group, while rank 0's extra all-gather waits on the short one.
    return result


# Each rank decodes sentences of its own, of other lengths and another number, so that one is done before the other.
DECODED_SOURCE_LENGTHS = ((9, 4, 7), (3,))


def decoded_sources(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s sources, right-padded and ending in </s> (id 2): (input_ids, attention_mask)."""
    lengths = DECODED_SOURCE_LENGTHS[rank]
    generator = torch.Generator().manual_seed(rank)
    input_ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for row, length in enumerate(lengths):
        input_ids[row, : length - 1] = torch.randint(4, 100, (length - 1,), generator=generator)
        input_ids[row, length - 1] = 2
    return input_ids, (input_ids != 0).long()


def decoding_job(rank: int, work_dir: Path) -> dict:
    """Greedy decoding and the paper's beam search of each rank's own sentences, by the model alone and then sharded,
    with generate() working out synced_gpus as transformers does; the decoder's forward passes counted."""
    model = initial_model(work_dir).eval()
    input_ids, attention_mask = decoded_sources(rank)
    result = {"alone": {}, "sharded": {}, "forwards": {}}
    for beams in (1, 4):
        result["alone"][beams] = model.generate(input_ids, attention_mask=attention_mask, num_beams=beams)
    shard_model(model, cpu_mesh())
    with torch.no_grad():  # FSDP2 initialises at the root's first forward; generate() calls the encoder first
        model(**rank_half(evaluation_batch(), rank))
    forwards = []
    model.model.decoder.register_forward_hook(lambda *_: forwards.append(1))
    for beams in (1, 4):
        forwards.clear()
        result["sharded"][beams] = model.generate(input_ids, attention_mask=attention_mask, num_beams=beams)
        result["forwards"][beams] = len(forwards)
    return result


def trainer_prediction_job(rank: int, work_dir: Path) -> dict:
    """Seq2SeqTrainer's predict (predict_with_generate) of each rank's own sentences, one batch each, by the model
    alone and sharded: the Trainer asks generate() for synced_gpus on a sharded model."""
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    input_ids, attention_mask = decoded_sources(rank)
    features = [{"input_ids": ids[mask.bool()]} for ids, mask in zip(input_ids, attention_mask)]

    def collate(batch):
        padded = torch.nn.utils.rnn.pad_sequence([feature["input_ids"] for feature in batch], batch_first=True)
        return {"input_ids": padded, "attention_mask": (padded != 0).long()}

    arguments = Seq2SeqTrainingArguments(
        work_dir / f"trainer_rank{rank}", predict_with_generate=True, per_device_eval_batch_size=4, report_to=[]
    )
    model = initial_model(work_dir).eval()
    predictions = Seq2SeqTrainer(model, arguments, data_collator=collate).predict(features).predictions
    result = {"alone": torch.from_numpy(predictions)}
    shard_model(model, cpu_mesh())
    with torch.no_grad():  # FSDP2 initialises at the root's first forward; generate() calls the encoder first
        model(**rank_half(evaluation_batch(), rank))
    predictions = Seq2SeqTrainer(model, arguments, data_collator=collate).predict(features).predictions
    result["sharded"] = torch.from_numpy(predictions)
    return result


# ---------------------------------------------------------------------------------------------------------------
# The tests' side.


def run_on_two_ranks(job, work_dir: Path) -> list[dict]:
    """Runs job on WORLD_SIZE processes and returns each rank's result (helpers.run_on_two_ranks)."""
    return helpers.run_on_two_ranks(job, work_dir, __name__, JOB_TIMEOUT_S, COLLECTIVE_TIMEOUT)


@pytest.fixture(scope="module")
def initial_state() -> dict[str, torch.Tensor]:
    return make_model(seed=0).state_dict()


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory, initial_state):
    """A new folder holding initial_state.pt, for each call."""

    def make() -> Path:
        work_dir = tmp_path_factory.mktemp("fsdp")
        torch.save(initial_state, work_dir / "initial_state.pt")
        return work_dir

    return make


@pytest.fixture(scope="module")
def grouped_training(job_dir) -> dict:
    return run_on_two_ranks(grouped_training_job, job_dir())[0]


@pytest.fixture(scope="module")
def checkpoint_runs(job_dir) -> dict:
    return run_on_two_ranks(checkpoint_job, job_dir())[0]


def test_grouped_embedding_holders_train_like_the_unsharded_model(grouped_training, initial_state):
    """With the four holders of the shared embedding in one FSDP group, 3 Adam steps on 2 ranks (each on half of
    every batch) give the weights of one unsharded process trained on the whole batches, and the sharded model
    keeps the unsharded model's state-dict keys."""
    reference = make_model(seed=0)
    reference.load_state_dict(initial_state)
    train(reference, make_optimizer(reference), training_batches(TRAINING_STEPS))
    expected = reference.state_dict()

    assert grouped_training["sharded_state_dict_keys"] == list(expected)
    difference = max_difference(grouped_training["full_state_dict"], expected)
    print(f"max |sharded - unsharded| after {TRAINING_STEPS} steps: {difference:.3g}")
    assert difference < WEIGHT_TOLERANCE
    assert max_difference(expected, initial_state) > 100 * WEIGHT_TOLERANCE  # the steps did move the weights


def test_sharding_only_shared_and_lm_head_splits_the_matrix_in_two(job_dir):
    """Grouping only `model.shared` and `lm_head` leaves the encoder's and decoder's `embed_tokens` to the root's
    group, which shards the same matrix a second time: two parameters, the tie broken. torch 2.12 and later refuse
    it at the first forward, where FSDP2 initialises; torch 2.11 runs it without a word."""
    result = run_on_two_ranks(ungrouped_embeddings_job, job_dir())[0]
    assert result["fully_shard_completed"]
    assert result["embedding_parameters"] == 2
    if torch.__version__ < (2, 12):
        assert result["error_type"] is None
        return
    assert result["error_type"] == "ValueError"
    assert result["error_message"].startswith(
        "Parameter 'model.shared.weight' is shared with a parameter already managed by another FSDP group"
    )


@pytest.mark.parametrize("kind", ["full", "sharded"])
def test_resuming_from_a_checkpoint_reproduces_the_uninterrupted_run(checkpoint_runs, kind):
    """A checkpoint written after 2 steps (FULL: gathered on rank 0 and torch.save'd; SHARDED: torch.distributed.
    checkpoint) and loaded into freshly sharded models and optimizers continues exactly: 2 more steps give weights
    bit-identical to those of the run that never stopped."""
    resumed, uninterrupted = checkpoint_runs[f"resumed_from_{kind}"], checkpoint_runs["uninterrupted"]
    assert resumed.keys() == uninterrupted.keys()
    assert [key for key in resumed if not torch.equal(resumed[key], uninterrupted[key])] == []


def test_full_checkpoint_names_every_tied_key_and_holds_one_optimizer_state(checkpoint_runs, initial_state):
    """The FULL model state dict names all four holders of the shared embedding, as the unsharded model's does;
    the optimizer state holds one entry for the shared parameter, under its first name."""
    assert checkpoint_runs["full_model_keys"] == list(initial_state)
    optimizer_keys = checkpoint_runs["full_optimizer_state_keys"]
    assert [key for key in optimizer_keys if key in EMBEDDING_KEYS] == ["model.shared.weight"]
    assert len(optimizer_keys) == len(initial_state) - (len(EMBEDDING_KEYS) - 1)


def test_full_state_dict_round_trips_through_save_pretrained(grouped_training, tmp_path):
    """Rank 0's full state dict, loaded into an unsharded model and written with save_pretrained, loads back with
    from_pretrained with no missing or unexpected keys, the four embedding holders tied again, and the logits the
    sharded model computes."""
    full_state = grouped_training["full_state_dict"]
    for key in EMBEDDING_KEYS:
        assert torch.equal(full_state[key], full_state["model.shared.weight"]), key

    exported = VaswaniForConditionalGeneration(make_config())
    incompatible = exported.load_state_dict(full_state)
    assert not incompatible.missing_keys and not incompatible.unexpected_keys
    exported.save_pretrained(tmp_path)
    reloaded, loading_info = VaswaniForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True)

    assert not loading_info["missing_keys"]
    assert not loading_info["unexpected_keys"]
    assert not loading_info["mismatched_keys"]
    shared = reloaded.model.shared.weight
    assert reloaded.lm_head.weight is shared
    assert reloaded.model.encoder.embed_tokens.weight is shared
    assert reloaded.model.decoder.embed_tokens.weight is shared
    assert torch.equal(shared, full_state["model.shared.weight"])
    reloaded.eval()
    with torch.no_grad():
        logits = reloaded(**evaluation_batch()).logits
    print(f"max |reloaded - sharded| logits: {(logits - grouped_training['logits']).abs().max().item():.3g}")
    torch.testing.assert_close(logits, grouped_training["logits"], rtol=0, atol=1e-6)


def test_unequal_forward_counts_block_until_the_collective_times_out(job_dir):
    """UNEQUAL WORK (a collective made to time out on purpose). When rank 0 runs a second forward that rank 1 does
    not, that forward's all-gather has no partner: it blocks, and fails only when the process group's 10 s timeout
    expires, instead of completing. Under FSDP2 every rank must run the same number of forward passes."""
    rank0, rank1 = run_on_two_ranks(unequal_work_job, job_dir())
    assert rank1["forwards_completed"] == 1 and rank1["error_type"] is None
    assert rank0["forwards_completed"] == 1
    assert rank0["error_type"] == "RuntimeError"
    assert "Timed out" in rank0["error_message"]
    timeout = UNEQUAL_WORK_TIMEOUT.total_seconds()
    assert timeout <= rank0["seconds"] < timeout + 20


def test_sharded_decoding_keeps_the_processes_in_step_and_decodes_as_the_model_alone(job_dir):
    """Under FSDP2 every forward pass gathers the weights from both ranks: a rank done before the other makes the
    same forward passes until both are done (synced_gpus, which generate() works out), and each decodes what the
    model alone decodes, greedy and with the paper's beam search."""
    ranks = run_on_two_ranks(decoding_job, job_dir())
    for beams in (1, 4):
        lengths = [rank["alone"][beams].shape[1] for rank in ranks]
        assert lengths[0] != lengths[1], "the ranks' work must differ for the test to mean anything"
        assert ranks[0]["forwards"][beams] == ranks[1]["forwards"][beams] == max(lengths) - 1
        for rank in ranks:
            assert torch.equal(rank["sharded"][beams], rank["alone"][beams])


def test_seq2seq_trainer_predicts_with_generate_on_a_sharded_model(job_dir):
    """Seq2SeqTrainer(predict_with_generate=True) under FSDP2, each rank predicting sentences of its own: it finishes
    with the model alone's predictions."""
    for rank in run_on_two_ranks(trainer_prediction_job, job_dir()):
        assert torch.equal(rank["sharded"], rank["alone"])
