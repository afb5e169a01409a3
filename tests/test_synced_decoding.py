"""Decoding under `synced_gpus` (DeepSpeed ZeRO-3, FSDP) on two gloo processes of this CPU, each with sentences of
its own: every process makes the same forward passes until all are done, with buffers of one size, and decodes what it
decodes alone.

The work of each process is drawn (hypothesis): another number of sentences, of other lengths, and at times an end
made unlikely, so that one process's sentences run to their limit while the other's are long done; greedy search and
the paper's beam search, with a dynamic and a static cache, under the paper's limit and a given one. The processes
start as tests/test_fsdp.py starts them (helpers.run_on_two_ranks), and the module is marked slow as that one is.
"""

import json
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from helpers import FIRST_WORD, SMALL_VOCAB_SIZE, run_on_two_ranks, small_vocabulary_model
from hypothesis import example, given, settings
from hypothesis import strategies as st
from transformers import LogitsProcessor, LogitsProcessorList

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration


pytestmark = pytest.mark.slow

EOS = 2


class EndUnlikely(LogitsProcessor):
    """Takes 30 from </s>: a sentence runs to its limit."""

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[:, EOS] -= 30.0
        return scores


def padded(sources: list[list[int]]) -> dict[str, torch.Tensor]:
    width = max(map(len, sources))
    input_ids = torch.tensor([source + [0] * (width - len(source)) for source in sources])
    return {"input_ids": input_ids, "attention_mask": (input_ids != 0).long()}


def synced_job(rank: int, work_dir: Path) -> list[dict]:
    """Each case twice, by this process's model alone and then in step with the other process (`synced_gpus`): the
    outputs, and the decoder's forward passes in step."""
    saved = torch.load(work_dir / "model.pt", weights_only=True)
    model = VaswaniForConditionalGeneration(VaswaniConfig(**json.loads((work_dir / "config.json").read_text())))
    model.load_state_dict(saved)
    model.eval()
    forwards = []
    model.model.decoder.register_forward_hook(lambda *_: forwards.append(1))
    results = []
    for case in json.loads((work_dir / "cases.json").read_text()):
        options = {"num_beams": case["num_beams"], **padded(case["sources"][rank])}
        if case["cache"] == "static":
            options["cache_implementation"] = "static"
        if case["max_new_tokens"] is not None:
            options["max_new_tokens"] = case["max_new_tokens"]
        if case["end_unlikely"]:
            options["logits_processor"] = LogitsProcessorList([EndUnlikely()])
        alone = model.generate(**options, synced_gpus=False)
        forwards.clear()
        synced = model.generate(**options, synced_gpus=True)
        results.append({"alone": alone, "synced": synced, "forwards": len(forwards)})
    return results


sources = st.lists(st.lists(st.integers(FIRST_WORD, SMALL_VOCAB_SIZE - 1), max_size=8).map(lambda s: [*s, EOS]))
cases = st.fixed_dictionaries(
    {
        "sources": st.tuples(sources.filter(len), sources.filter(len)).filter(lambda work: work[0] != work[1]),
        "num_beams": st.sampled_from([1, 4]),
        "cache": st.sampled_from(["dynamic", "static"]),
        "max_new_tokens": st.none() | st.integers(1, 12),
        "end_unlikely": st.booleans(),
    }
)
# One process's single short sentence against three longer ones, for every method, cache and limit.
UNEQUAL = [
    {"sources": [[[5, EOS]], [[9, 6, 23, 19, 14, 14, 12, EOS], [22, EOS], [7, 8, 9, EOS]]], "num_beams": beams,
     "cache": cache, "max_new_tokens": limit, "end_unlikely": end_unlikely}
    for beams in (1, 4) for cache in ("dynamic", "static") for limit in (None, 10) for end_unlikely in (False, True)
]  # fmt: skip


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory):
    """A new folder holding the small model (helpers.small_vocabulary_model), for each call."""
    model = small_vocabulary_model()

    def make() -> Path:
        work_dir = tmp_path_factory.mktemp("synced")
        torch.save(model.state_dict(), work_dir / "model.pt")
        (work_dir / "config.json").write_text(model.config.to_json_string())
        return work_dir

    return make


@settings(max_examples=4, derandomize=True, deadline=None)
@given(drawn=st.lists(cases, min_size=6, max_size=6))
@example(drawn=UNEQUAL)
def test_processes_in_step_decode_what_each_decodes_alone(job_dir, drawn):
    work_dir = job_dir()
    (work_dir / "cases.json").write_text(json.dumps(drawn))
    ranks = run_on_two_ranks(synced_job, work_dir, __name__, 300, timedelta(seconds=60))
    for number, case in enumerate(drawn):
        outcomes = [rank[number] for rank in ranks]
        assert outcomes[0]["forwards"] == outcomes[1]["forwards"], f"case {number}: {case}"
        for rank, outcome in enumerate(outcomes):
            assert torch.equal(outcome["synced"], outcome["alone"]), f"case {number}, rank {rank}: {case}"
    if drawn is UNEQUAL:  # the work must differ for the test to mean anything
        for number, case in enumerate(drawn):
            lengths = [rank[number]["alone"].shape[1] for rank in ranks]
            assert lengths[0] != lengths[1] or case["max_new_tokens"] is not None, f"case {number}: {case}"
