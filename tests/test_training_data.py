"""vaswani.training.data: tokenization cached in Arrow, section 5.1's token-bucket batches, and padded batches.

The sampler is checked against its properties (every pair at most once an epoch, batches within the token limit, the
same number of steps on every process, determinism, exact mid-epoch resume) and against the batches of the
Python-loop batching it replaced, pinned by digest. Tokenization is checked through the real `datasets` cache.
"""

import hashlib
from types import SimpleNamespace

import datasets
import numpy as np
import pytest
import torch
from helpers import ENGLISH, make_dataset, word_pair, word_tokenizer, write_wmt14_folder

from vaswani.checks import UsageError
from vaswani.modeling.modeling_vaswani import shift_tokens_right
from vaswani.training import data
from vaswani.training.batching import LengthPairs, StepBatches, TokenBucketSampler
from vaswani.training.checkpoints import TrainState
from vaswani.training.data import PairCollator, pair_loader, tokenize_split


def lengths(count, seed=2024, longest=80):
    """Source lengths and target lengths about 1.1 times as long, as in a real corpus."""
    rng = np.random.default_rng(seed)
    source = rng.integers(1, longest, count)
    return source, (source * 1.1 + rng.integers(-6, 7, count)).clip(1).astype(int)


def every_batch(sampler, epoch, position=0):
    sampler.set_epoch(epoch, position)
    return [list(batch) for batch in sampler]


# --- Section 5.1: batches by token count. ---


@pytest.mark.parametrize(
    "seed,epoch,shuffle,digest",
    [(0, 0, True, "dca08ea285d73be8"), (5, 3, True, "4c8f5d97abf47eed"), (0, 0, False, "0a2b0f4501c78862")],
)
def test_batches_are_those_of_the_batching_they_replaced(seed, epoch, shuffle, digest):
    """Digests of what scripts/train.py's make_batches + batches_for_process gave (commit 9231e65) for process 1 of
    3 with 2 accumulated batches: a run resumed from an older checkpoint continues with the same batches."""
    source, target = lengths(4000)
    sampler = TokenBucketSampler(
        source, target, 900, seed=seed, shuffle=shuffle, num_replicas=3, rank=1, batches_per_step=2
    )
    found = hashlib.sha256()
    for batch in every_batch(sampler, epoch):
        found.update(np.asarray(batch, dtype=np.int64).tobytes() + b"|")
    assert found.hexdigest()[:16] == digest


def test_batches_are_the_same_when_the_lengths_are_sorted_a_chunk_at_a_time(monkeypatch):
    """At WMT scale the sort by length reads a million pairs at a time; with chunks of 97 pairs, the batches of the
    digests above."""
    monkeypatch.setattr(LengthPairs, "CHUNK", 97)
    test_batches_are_those_of_the_batching_they_replaced(5, 3, True, "4c8f5d97abf47eed")
    test_batches_are_those_of_the_batching_they_replaced(0, 0, False, "0a2b0f4501c78862")


def test_batches_stay_within_the_token_limit_cover_every_pair_once_and_are_full():
    source, target = lengths(3000, longest=60)
    sampler = TokenBucketSampler(source, target, 1000, seed=0, drop_remainder=False)
    batches = every_batch(sampler, 0)
    assert sorted(i for batch in batches for i in batch) == list(range(3000))
    padded = [len(b) * (source[b].max() + target[b].max()) for b in batches]
    assert max(padded) <= 1000
    # Greedy: no batch could have taken the next pair of its length order without passing the limit.
    order, bounds, _ = sampler.epoch_batches(0)
    for start, end in zip(bounds[:-2], bounds[1:-1]):
        grown = order[start : end + 1]
        assert len(grown) * (source[grown].max() + target[grown].max()) > 1000
    assert sum(padded) / len(padded) > 800  # sorting by length keeps batches full and padding low
    assert sum(int(source[b].sum() + target[b].sum()) for b in batches) / sum(padded) > 0.9


def test_processes_get_disjoint_batches_and_the_same_number_of_steps():
    source, target = lengths(5000)
    for processes, accumulation in ((3, 2), (2, 1), (4, 3)):
        shards = [
            every_batch(
                TokenBucketSampler(
                    source, target, 700, seed=1, num_replicas=processes, rank=rank, batches_per_step=accumulation
                ),
                2,
            )
            for rank in range(processes)
        ]
        assert len({len(shard) for shard in shards}) == 1 and len(shards[0]) % accumulation == 0
        seen = [i for shard in shards for batch in shard for i in batch]
        assert len(seen) == len(set(seen))  # every pair at most once an epoch
        everything = every_batch(TokenBucketSampler(source, target, 700, seed=1, drop_remainder=False), 2)
        left_out = len(everything) - sum(len(shard) for shard in shards)
        assert 0 <= left_out < processes * accumulation
        assert {tuple(batch) for shard in shards for batch in shard} <= {tuple(batch) for batch in everything}


def test_batches_depend_only_on_seed_and_epoch():
    source, target = lengths(2000)
    first = every_batch(TokenBucketSampler(source, target, 600, seed=7), 4)
    assert every_batch(TokenBucketSampler(source, target, 600, seed=7), 4) == first
    assert every_batch(TokenBucketSampler(source, target, 600, seed=7), 5) != first
    assert every_batch(TokenBucketSampler(source, target, 600, seed=8), 4) != first
    # Without shuffling (validation) the order is by length.
    plain = every_batch(TokenBucketSampler(source, target, 600, shuffle=False, drop_remainder=False), 0)
    assert [source[b].max() for b in plain] == sorted(source[b].max() for b in plain)


def test_step_batches_continue_where_the_run_state_stands_and_roll_over_epochs():
    """The run's state is the one record of the position: a resumed run takes, step by step, the batches an
    uninterrupted run would have taken, and an epoch too short for another step starts the next one."""
    source, target = lengths(3000)
    sampler = TokenBucketSampler(source, target, 800, seed=3, num_replicas=2, rank=1, batches_per_step=2)
    epoch_1, epoch_2 = every_batch(sampler, 1), every_batch(sampler, 2)
    assert len(epoch_1) % 2 == 0  # cut to whole steps
    loader = torch.utils.data.DataLoader(np.arange(3000), sampler=sampler, batch_size=None, collate_fn=list)
    state = TrainState(epoch=1, batch_index=len(epoch_1) - 4)
    steps = StepBatches(loader, state, per_step=2)
    taken = [batch for _ in range(4) for batch in next(steps)]
    assert [list(map(int, batch)) for batch in taken] == epoch_1[-4:] + epoch_2[:4]
    assert (state.epoch, state.batch_index) == (2, 4)
    with pytest.raises(ValueError, match="outside epoch 1"):
        StepBatches(loader, TrainState(epoch=1, batch_index=len(epoch_1) + 1), per_step=2)


def test_defaults_edges_and_storage():
    """Defaults: seed 0, epoch 0 from its first batch, every batch used by one process; one pair, or a pair of exactly
    max_tokens, is a batch; pairs too big to share a batch each make one; lengths take the narrowest type that holds
    them (1 byte a pair here, 2 under the usual limits)."""
    source, target = lengths(500)
    sampler = TokenBucketSampler(source.astype(np.int64), target, 600)
    assert sampler.source_lengths.dtype == sampler.target_lengths.dtype == np.uint8
    assert TokenBucketSampler(source * 10, target, 6000).source_lengths.dtype == np.uint16
    batches = [list(batch) for batch in sampler]
    assert batches == every_batch(TokenBucketSampler(source, target, 600, seed=0), 0)
    assert len(batches) == len(sampler.epoch_batches(0)[2])  # nothing left out with one process
    sampler.set_epoch(3)
    assert [list(batch) for batch in sampler] == every_batch(TokenBucketSampler(source, target, 600), 3)
    sampler.set_epoch(3, sampler.batches_in_epoch(3))  # an epoch used up: resumable, and empty
    assert list(sampler) == []
    assert list(TokenBucketSampler([3], [4], 7)) == [[0]]
    assert sorted(map(sorted, TokenBucketSampler([40, 41, 42], [30, 30, 30], 72, shuffle=False))) == [[0], [1], [2]]


def test_bad_lengths_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="^there are no pairs to batch$"):
        TokenBucketSampler([], [], 100)
    with pytest.raises(ValueError, match="smaller than the longest pair \\(130 tokens\\)"):
        TokenBucketSampler([5, 60], [6, 70], 100)
    with pytest.raises(ValueError, match="two 1-D arrays of one size"):
        TokenBucketSampler([5, 6], [5], 100)
    with pytest.raises(ValueError, match=r"^every source and target holds at least one token \(</s>\)$"):
        TokenBucketSampler([0, 6], [5, 5], 100)
    with pytest.raises(ValueError, match="rank 2 of 2"):
        TokenBucketSampler([5, 6], [5, 5], 100, num_replicas=2, rank=2)


# --- The corpus: one way to load it, whatever its source. ---


def test_saved_folders_folders_of_data_files_and_hub_layouts_load_alike(tmp_path):
    pairs = datasets.Dataset.from_dict(
        {"id": ["a", "b"], "translation": [{"en": "the cat", "es": "el gato"}, {"en": "a dog", "es": "un perro"}]}
    )
    datasets.DatasetDict(train=pairs, validation=pairs).save_to_disk(str(tmp_path / "saved"))
    saved = data.load_translation_dataset(tmp_path / "saved", "en", "es")
    assert saved["train"].cache_files and saved["train"].to_dict() == pairs.to_dict()  # memory-mapped
    (tmp_path / "jsonl").mkdir()
    for split in ("train", "validation"):
        pairs.to_json(str(tmp_path / "jsonl" / f"{split}.jsonl"))
    from_files = data.load_translation_dataset(str(tmp_path / "jsonl"), "en", "es")
    assert from_files["validation"]["translation"] == pairs["translation"]
    write_wmt14_folder(tmp_path / "wmt14", {"train": 3, "validation": 1, "test": 2})
    wmt = data.load_translation_dataset(tmp_path / "wmt14", "en", "de", splits=("train", "test"), config_name="de-en")
    assert wmt["test"][1]["translation"] == {"de": "Satz test 1.", "en": "Sentence test 1."}


def test_a_dataset_that_cannot_train_is_a_usage_error_naming_the_problem(tmp_path):
    pairs = datasets.Dataset.from_dict({"translation": [{"en": "the cat", "es": "el gato"}]})
    pairs.save_to_disk(str(tmp_path / "single"))
    datasets.DatasetDict(train=pairs, validation=pairs).save_to_disk(str(tmp_path / "two_splits"))
    (tmp_path / "empty").mkdir()
    for folder, arguments, message in (
        (
            "nowhere",
            {},
            "--dataset_dir {} does not exist; create it with scripts/prepare_data.py --output_dir {}.",
        ),
        (
            "empty",
            {},
            "--dataset_dir {} is not a dataset saved with save_to_disk, nor data files that "
            "datasets.load_dataset reads (",
        ),
        (
            "single",
            {"flag": "--dataset"},
            "--dataset {} holds a single Dataset; expected a DatasetDict with train and validation splits.",
        ),
        (
            "two_splits",
            {"splits": ("train", "test")},
            "--dataset_dir {} has no 'test' split (it has ['train', 'validation']).",
        ),
        (
            "two_splits",
            {"splits": ("train",), "target_lang": "de"},
            "the train split: language 'de' is not in the translation column (it has ['en', 'es']); set "
            "--source_lang/--target_lang.",
        ),
    ):
        arguments = {"source_lang": "en", "target_lang": "es", **arguments}
        with pytest.raises(UsageError) as raised:
            data.load_translation_dataset(tmp_path / folder, **arguments)
        assert str(raised.value).startswith(message.format(tmp_path / folder, tmp_path / folder)), raised.value


# --- Tokenization, once, into Arrow. ---


@pytest.fixture
def saved_corpus(tmp_path):
    """A saved DatasetDict with a pair too long for 8 tokens, a pair without text and a row without translation."""
    words = ENGLISH * 2
    english = [" ".join(words[i : i + 1 + i % 5]) for i in range(40)] + [" ".join(ENGLISH)]
    rows = [word_pair(e) for e in english]
    rows += [{"en": "the cat", "es": None}, None]
    datasets.DatasetDict(train=datasets.Dataset.from_dict({"translation": rows})).save_to_disk(str(tmp_path / "data"))
    return tmp_path / "data", word_tokenizer(tmp_path / "tokenizer")


def test_ids_are_those_the_tokenizer_call_gives(saved_corpus):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(saved_corpus[1])
    texts = ["the red cat sees a dog", "a big bird eats", "unknown words here", ""]
    assert data.token_ids(tokenizer, texts) == tokenizer(texts).input_ids
    assert data.token_ids(tokenizer, texts, target=True) == tokenizer(text_target=texts).input_ids
    tokenizer.backend_tokenizer.enable_truncation(3)  # the backend alone would now cut; the tokenizer call does not
    assert data.token_ids(tokenizer, texts) == tokenizer(texts).input_ids and len(tokenizer(texts).input_ids[0]) == 7


def test_pairs_are_tokenized_with_lengths_and_long_or_textless_pairs_counted(saved_corpus):
    from transformers import AutoTokenizer

    folder, tokenizer_dir = saved_corpus
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    train = data.load_translation_dataset(folder, "en", "es", splits=("train",))["train"]
    split = tokenize_split(train, tokenizer, "en", "es", max_source_length=8, max_target_length=8)
    assert (len(split), split.too_long, split.without_text, split.truncated) == (40, 1, 2, 0)
    assert split.rows.tolist() == list(range(40))
    first = split.pairs.with_format("arrow")[[3]]
    assert first.column("input_ids").to_pylist() == [tokenizer(train[3]["translation"]["en"]).input_ids]
    assert first.column("labels").to_pylist() == [tokenizer(text_target=train[3]["translation"]["es"]).input_ids]
    assert split.pairs.features["input_ids"].feature.dtype == split.pairs.features["labels"].feature.dtype == "uint16"
    assert split.source_lengths.dtype == np.uint8  # the narrowest type that holds them
    assert (split.source_lengths == [len(tokenizer(t["en"]).input_ids) for t in train[:40]["translation"]]).all()
    cut = tokenize_split(train, tokenizer, "en", "es", 8, 8, long_pairs="truncate")
    assert (len(cut), cut.truncated, cut.too_long, cut.without_text) == (41, 1, 0, 2)
    assert cut.pairs["status"][40] == data.TRUNCATED and cut.rows[40] == 40
    longest = cut.pairs.with_format("arrow")[[40]].column("input_ids").to_pylist()[0]
    assert len(longest) == 8 and longest[-1] == tokenizer.eos_token_id  # cut, ending in </s>


class TokenizerThatCannotTokenize:
    """`tokenizer` to the cache's key (its pipeline, `tokenizer_fingerprint`) and its size (the ids' type), failing
    the test if asked for ids."""

    is_fast = True

    def __init__(self, tokenizer):
        self.backend_tokenizer = SimpleNamespace(
            to_str=tokenizer.backend_tokenizer.to_str, truncation=None, padding=None, encode_batch_fast=self.tokenize
        )
        self.size = len(tokenizer)

    def __len__(self):
        return self.size

    def tokenize(self, *args, **kwargs):
        raise AssertionError("tokenized again")

    __call__ = tokenize


def test_ids_take_two_bytes_where_the_vocabulary_fits():
    assert data.token_type(range(2**16)) == "uint16"
    assert data.token_type(range(2**16 + 1)) == "int32"


def test_the_second_tokenization_maps_the_cache_and_runs_no_tokenizer(saved_corpus):
    from transformers import AutoTokenizer

    folder, tokenizer_dir = saved_corpus
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    first = tokenize_split(
        data.load_translation_dataset(folder, "en", "es", ("train",))["train"], tokenizer, "en", "es", num_proc=2
    )
    assert not first.from_cache
    cached = sorted(path.name for path in (folder / "train").glob("vaswani-tokens-*"))
    assert len(cached) == 3  # two tokenized shards (num_proc=2) and the counts

    again = tokenize_split(
        data.load_translation_dataset(folder, "en", "es", ("train",))["train"],
        TokenizerThatCannotTokenize(tokenizer),
        "en",
        "es",
        num_proc=2,
    )
    assert again.from_cache and sorted(p.name for p in (folder / "train").glob("vaswani-tokens-*")) == cached
    assert again.pairs.to_dict() == first.pairs.to_dict()
    assert (again.too_long, again.without_text) == (first.too_long, first.without_text) == (0, 2)
    # Without its Arrow files, the counts alone are no cache.
    for shard in (folder / "train").glob("vaswani-tokens-*.arrow"):
        shard.unlink()
    rebuilt = tokenize_split(
        data.load_translation_dataset(folder, "en", "es", ("train",))["train"], tokenizer, "en", "es", num_proc=2
    )
    assert not rebuilt.from_cache and rebuilt.pairs.to_dict() == first.pairs.to_dict()
    # Other limits, or another tokenizer, are another cache.
    train = data.load_translation_dataset(folder, "en", "es", ("train",))["train"]
    assert not tokenize_split(train, tokenizer, "en", "es", max_source_length=8).from_cache
    bigger = AutoTokenizer.from_pretrained(word_tokenizer(folder.parent / "bigger", extra_words=["extra"]))
    assert data.tokenizer_fingerprint(bigger) != data.tokenizer_fingerprint(tokenizer)
    # A call that truncates leaves its setting on the backend; the ids of an untruncated call, and the key, are the
    # same as before it.
    fingerprint = data.tokenizer_fingerprint(tokenizer)
    tokenizer(["the red cat"], truncation=True, max_length=2)
    assert data.tokenizer_fingerprint(tokenizer) == fingerprint


def test_the_cache_holds_few_large_record_batches(tmp_path):
    """datasets keeps objects per record batch of a mapped file in every process: the cache is written in batches of
    5,000 pairs, not datasets' 1,000, so that 36M pairs do not cost 190 MB per process."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(word_tokenizer(tmp_path / "tokenizer"))
    make_dataset(tmp_path / "data", {"train": 6000})
    train = data.load_translation_dataset(tmp_path / "data", "en", "es", ("train",))["train"]
    split = tokenize_split(train, tokenizer, "en", "es")
    assert [len(batch) for batch in split.pairs.data.table.to_batches()] == [5000, 1000]


def test_a_split_is_keyed_by_the_rows_it_holds(saved_corpus):
    """The tokenization cache's key for the split (and the resume check's): the same files loaded again give the same
    key; another selection of rows from the same files, another key."""
    folder, _ = saved_corpus
    train = data.load_translation_dataset(folder, "en", "es", ("train",))["train"]
    again = data.load_translation_dataset(folder, "en", "es", ("train",))["train"]
    assert data.split_fingerprint(again) == data.split_fingerprint(train)
    selections = [train, train.select(range(2)), train.select(range(2, 4)), train.shuffle(seed=0)]
    assert len({data.split_fingerprint(split) for split in selections}) == 4


# --- Batches as tensors. ---


def test_collated_batches_are_padded_and_shifted_like_the_model_expects(saved_corpus):
    from transformers import AutoTokenizer

    folder, tokenizer_dir = saved_corpus
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    train = data.load_translation_dataset(folder, "en", "es", ("train",))["train"]
    split = tokenize_split(train, tokenizer, "en", "es")
    batch = PairCollator(0, 1)(split.pairs.with_format("arrow")[[0, 4, 9]])
    expected = tokenizer(
        [pair["en"] for pair in train.select([0, 4, 9])["translation"]], padding=True, return_tensors="pt"
    )
    assert torch.equal(batch["input_ids"], expected["input_ids"])
    assert torch.equal(batch["attention_mask"], expected["attention_mask"])
    assert all(tensor.dtype == torch.int64 for tensor in batch.values())
    assert (batch["labels"] == -100).any()
    assert torch.equal(batch["decoder_input_ids"], shift_tokens_right(batch["labels"], 0, 1))


def test_worker_processes_give_the_same_batches(saved_corpus):
    from transformers import AutoTokenizer

    folder, tokenizer_dir = saved_corpus
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    split = tokenize_split(
        data.load_translation_dataset(folder, "en", "es", ("train",))["train"], tokenizer, "en", "es"
    )
    sampler = TokenBucketSampler(split.source_lengths, split.target_lengths, 60, seed=2)
    collator = PairCollator(tokenizer.pad_token_id, tokenizer.bos_token_id)
    in_process = list(pair_loader(split, sampler, collator))
    in_workers = list(pair_loader(split, sampler, collator, num_workers=2))
    assert len(in_process) == len(sampler) > 3
    for one, other in zip(in_process, in_workers):
        assert all(torch.equal(one[key], other[key]) for key in one)
