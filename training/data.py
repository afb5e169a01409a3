"""Section 5.1, the training data: translation pairs tokenized once into Arrow, and padded into batches.

At WMT scale (4.5M pairs for English-German, 36M for English-French) nothing here holds the corpus in Python objects:
- `tokenize_split` tokenizes a split once with `datasets.map(batched=True, num_proc=...)` into Arrow list columns
  (source and target ids, 2 bytes a token where the vocabulary fits; a list's offsets give its length) of the pairs
  that train, cached next to the dataset under a key made of the
  dataset's fingerprint, the tokenizer, the languages and the length limits, so that every later run, every resumed
  run and every other process maps the same files;
- `vaswani.training.batching.TokenBucketSampler` groups pairs of similar length from the two length columns alone;
- `PairCollator` pads a batch read straight from the memory-mapped Arrow table, in `DataLoader` workers if wanted.

A user's own loop:

    split = tokenize_split(load_translation_dataset("data/wmt14", "en", "de")["train"], tokenizer, "en", "de")
    # TokenBucketSampler: from vaswani.training.batching
    sampler = TokenBucketSampler(split.source_lengths, split.target_lengths, max_tokens=6250)
    loader = pair_loader(split, sampler, PairCollator(tokenizer.pad_token_id, tokenizer.bos_token_id))
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader: ...
"""

import glob
import hashlib
import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from datasets import (
    Dataset,
    DatasetDict,
    Features,
    List,
    Translation,
    Value,
    config,
    get_dataset_config_names,
    load_dataset,
    load_from_disk,
)
from datasets.data_files import EmptyDatasetError, get_data_patterns
from datasets.fingerprint import Hasher, generate_fingerprint
from huggingface_hub import constants as hf_constants

from ..checks import UsageError, check_dataset_exists
from .batching import TokenBucketSampler, length_type
from .distributed import main_process_first
from .padding import pair_batch


# Whether a pair that trains was kept whole or cut to the length limits.
KEPT, TRUNCATED = 0, 1
# Bumped whenever the layout of the tokenized files changes, so that an older cache is never read as a newer one.
CACHE_FORMAT = 3
CACHE_PREFIX = "vaswani-tokens"
# Pairs per tokenizing batch and per record batch of the cache. datasets keeps every record batch of a mapped file
# as objects of its own in every process (about 5 KB a batch): at 1,000 pairs a batch, 190 MB per process at 36M
# pairs; at 5,000, 38 MB. Tokenizing is as fast from 1,000 to 5,000 pairs a batch and slower from 10,000 on.
PAIRS_PER_BATCH = 5_000


def token_type(tokenizer):
    """The Arrow type of the cached ids: 2 bytes a token where the vocabulary fits (as fairseq's binarised files),
    which halves the cache of a WMT corpus; a pair's lengths are its lists' own offsets, stored once."""
    return "uint16" if len(tokenizer) <= 2**16 else "int32"


def tokenized_features(id_type):
    return Features(
        {
            "input_ids": List(Value(id_type)),
            "labels": List(Value(id_type)),
            "row": Value("int64"),
            "status": Value("int8"),
        }
    )


# ---------------------------------------------------------------------------------------------------------------------
# The corpus: any DatasetDict in the Hugging Face translation layout ({"translation": {lang: text}} rows).
# ---------------------------------------------------------------------------------------------------------------------


def translation_languages(split, name="the split", required=()):
    """The languages of a split's `translation` column, from its features (no row is read); each language of
    `required` must be one of them.

    `datasets.Translation` names them; a Parquet or JSON folder without dataset metadata has a struct of strings.
    """
    if "translation" not in split.column_names:
        raise UsageError(f"{name} has no 'translation' column (columns: {split.column_names}).")
    feature = split.features["translation"]
    if isinstance(feature, Translation):
        languages = sorted(feature.languages)
    elif isinstance(feature, dict):
        languages = sorted(feature)
    else:
        raise UsageError(f"the 'translation' column of {name} is {feature}, not one text per language.")
    for language in required:
        if language not in languages:
            raise UsageError(
                f"{name}: language {language!r} is not in the translation column (it has {languages}); "
                "set --source_lang/--target_lang."
            )
    return languages


def load_translation_dataset(
    path_or_name,
    source_lang,
    target_lang,
    splits=("train", "validation"),
    config_name=None,
    flag="--dataset_dir",
    config_flag="--dataset_config",
):
    """A translation DatasetDict, checked for `splits` (present, not empty) and for both languages.

    A folder saved with `save_to_disk` (scripts/prepare_data.py's output) is memory-mapped; anything else goes to
    `datasets.load_dataset`: a Hub name such as "wmt/wmt14" with its configuration `config_name` ("de-en"), or a
    local folder of Parquet, JSON or CSV files, in the Hub's layout too (`local_dataset_options`). `flag` and
    `config_flag` are the command-line flags the messages name. A `--dataset_dir`, and any name that looks like a
    path (`looks_like_path`), is a local folder: one that does not exist is refused at once, not looked up on the Hub.
    """
    check_dataset_exists(path_or_name, flag)
    path = Path(path_or_name)
    folder = path.expanduser()
    saved = (config.DATASETDICT_JSON_FILENAME, config.DATASET_STATE_JSON_FILENAME)
    if any((folder / name).is_file() for name in saved):
        try:
            dataset = load_from_disk(str(folder))
        except Exception as error:  # datasets raises its own errors for a damaged folder
            raise UsageError(f"{flag} {path} is not a dataset saved with save_to_disk ({error}).") from error
    elif folder.exists():
        try:
            options = local_dataset_options(folder, config_name, f"{flag} {path}", config_flag)
            dataset = load_dataset(str(folder), **options)
        except UsageError:
            raise
        except Exception as error:  # no data files, files datasets cannot read, splits of different columns
            raise UsageError(
                f"{flag} {path} is not a dataset saved with save_to_disk, nor data files that "
                f"datasets.load_dataset reads ({error})."
            ) from error
    else:
        try:
            dataset = load_dataset(str(path_or_name), config_name)
        except Exception as error:
            raise UsageError(hub_dataset_error(error, str(path_or_name), config_name, flag, config_flag)) from error
    if not isinstance(dataset, DatasetDict):
        raise UsageError(
            f"{flag} {path} holds a single Dataset; expected a DatasetDict with {' and '.join(splits)} splits."
        )
    for name in splits:
        check_translation_split(dataset, name, source_lang, target_lang, f"{flag} {path}")
    return dataset


def local_dataset_options(folder, config_name, where, config_flag="--dataset_config"):
    """`datasets.load_dataset(folder, **options)` for a local folder of data files, configuration `config_name`.

    The Hub keeps a dataset's configurations in subfolders (wmt14: de-en/train-*.parquet, fr-en/..., each row
    {"translation": {"de": ..., "en": ...}}) that its README.md's `configs:` name; with that README, a downloaded copy
    loads by configuration name, as on the Hub. Without it, datasets sees one configuration, "default", with every
    subfolder's files in it; the configuration is then the subfolder, which datasets reads as its `data_dir`.
    """
    declared = get_dataset_config_names(str(folder))  # the README's `configs:`, else ["default"]
    subfolders = configuration_subfolders(folder)
    if config_name is None:
        if declared == ["default"] and len(subfolders) > 1:
            raise UsageError(
                f"{where} holds one configuration per subfolder ({', '.join(subfolders)}), as the Hub lays out "
                f"datasets: choose one with {config_flag}."
            )
        return {}
    if config_name in declared:
        return {"name": config_name}
    if config_name in subfolders:
        return {"data_dir": config_name}
    known = [name for name in declared if name != "default" or not subfolders] + [
        name for name in subfolders if name not in declared
    ]
    raise UsageError(f"{where} has no configuration {config_name!r} (it has {', '.join(known)}): see {config_flag}.")


def configuration_subfolders(folder):
    """The subfolders of `folder` in which datasets finds data files (its own patterns: train-*.parquet, ...)."""
    found = []
    for subfolder in sorted(Path(folder).iterdir()):
        if subfolder.is_dir() and not subfolder.name.startswith((".", "_")):
            try:
                get_data_patterns(str(subfolder))
            except EmptyDatasetError:
                continue
            found.append(subfolder.name)
    return found


def hub_dataset_error(error, name, config_name, flag="--dataset", config_flag="--dataset_config"):
    """What to tell a user whose dataset name `datasets.load_dataset` could not load from the Hub: first whether the
    Hub could be reached at all, with the next step; the library's own words at the end."""
    chain = [error]
    while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    names = {type(link).__name__ for link in chain}
    configuration = f" {config_flag} {config_name}" if config_name else ""
    offline = hf_constants.HF_HUB_OFFLINE or config.HF_HUB_OFFLINE
    unreachable = any(isinstance(link, ConnectionError) for link in chain) or "OfflineModeIsEnabled" in names
    if offline or unreachable:
        why = "HF_HUB_OFFLINE is set" if offline else "offline?"
        return (
            f"{flag} {name}: the Hugging Face Hub cannot be reached ({why}), and datasets' cache holds no copy of this "
            f"dataset{' configuration' if config_name else ''}: download it where there is a network (hf download "
            f"{name} --repo-type dataset --local-dir DIR) and pass the folder ({flag} DIR{configuration}), or retry "
            f"online ({error})."
        )
    if names & {"DatasetNotFoundError", "RepositoryNotFoundError"}:
        return f"{flag} {name} is neither a local folder nor a dataset on the Hugging Face Hub ({error})."
    return f"{flag} {name}{configuration}: datasets.load_dataset could not load it ({error})."


def check_translation_split(dataset, name, source_lang, target_lang, where):
    """Split `name` of the DatasetDict `dataset` (from `where`) exists, is not empty and holds both languages."""
    if name not in dataset:
        raise UsageError(f"{where} has no {name!r} split (it has {sorted(dataset)}).")
    translation_languages(dataset[name], f"the {name} split", required=(source_lang, target_lang))
    if len(dataset[name]) == 0:
        raise UsageError(f"the {name} split of {where} is empty.")


# ---------------------------------------------------------------------------------------------------------------------
# Tokenization, once per (dataset, tokenizer, limits), into Arrow.
# ---------------------------------------------------------------------------------------------------------------------


def split_fingerprint(split):
    """A hash of the rows a split holds, as datasets computes one for a dataset that has none
    (`datasets.fingerprint.generate_fingerprint`): its Arrow files with their modification times, the slice or row
    selection on them, its features and format; a split held in memory, by its content."""
    return generate_fingerprint(split)


def tokenizer_fingerprint(tokenizer):
    """A hash of everything that decides the ids: the fast tokenizer's whole pipeline (normalizer, pre-tokenizer,
    vocabulary and merges, post-processor), else datasets' own hash of the tokenizer object. Truncation and padding
    are left out: `transformers` sets and resets them on the backend at every call."""
    if getattr(tokenizer, "is_fast", False):
        pipeline = json.loads(tokenizer.backend_tokenizer.to_str())
        pipeline.pop("truncation", None), pipeline.pop("padding", None)
        return hashlib.sha256(json.dumps(pipeline, sort_keys=True).encode()).hexdigest()
    return Hasher.hash(tokenizer)


def token_ids(tokenizer, texts, target=False):
    """The ids `tokenizer(texts)` (or `tokenizer(text_target=texts)`) gives, taken straight from a fast tokenizer's
    batch encoder without offsets where that is the same thing (no target-side mode, no truncation or padding set
    on the backend): it tokenizes a third faster, and at WMT scale tokenization is most of the start-up."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (
        backend is not None
        and backend.truncation is None
        and backend.padding is None
        # The one sign that a tokenizer encodes targets otherwise (Marian, NLLB): private, no public one exists.
        and not hasattr(tokenizer, "_switch_to_target_mode")
    ):
        return [encoding.ids for encoding in backend.encode_batch_fast(texts)]
    encode = {"text_target": texts} if target else {"text": texts}
    return tokenizer(**encode, return_attention_mask=False)["input_ids"]


def text_pairs(translations, source_lang, target_lang):
    """The two sides of an Arrow `translation` column, and where both are text (a row or side may be null)."""
    sources, targets = pc.struct_field(translations, source_lang), pc.struct_field(translations, target_lang)
    return sources, targets, pc.and_(pc.is_valid(sources), pc.is_valid(targets))


def encode_pairs(
    batch, indices, tokenizer, source_lang, target_lang, max_source_length, max_target_length, long_pairs, id_type
):
    """`datasets.map` function over Arrow batches: the pairs that train, with their token ids (ending in </s>).

    A pair with a side that is not text (None in a dataset not made by prepare_data.py) is left out; so is a pair
    longer than the limits with long_pairs="filter", while with long_pairs="truncate" it is cut (keeping its final
    </s>) and its status says TRUNCATED. `row` is the pair's row in the split. Only the tokenizer works per sentence:
    the columns are built with numpy and written as Arrow arrays.
    """
    sources, targets, has_text = text_pairs(batch.column("translation"), source_lang, target_lang)
    rows = np.asarray(indices, dtype=np.int64)[has_text.to_numpy(zero_copy_only=False)]
    source_ids = token_ids(tokenizer, sources.filter(has_text).to_pylist())
    target_ids = token_ids(tokenizer, targets.filter(has_text).to_pylist(), target=True)
    source_lengths = np.fromiter(map(len, source_ids), dtype=np.int32, count=len(rows))
    target_lengths = np.fromiter(map(len, target_ids), dtype=np.int32, count=len(rows))
    too_long = (source_lengths > max_source_length) | (target_lengths > max_target_length)
    if long_pairs == "filter":
        keep = np.flatnonzero(~too_long)
    else:
        keep = np.arange(len(rows))
        for i in np.flatnonzero(too_long):
            source_ids[i] = cut(source_ids[i], max_source_length, tokenizer.eos_token_id)
            target_ids[i] = cut(target_ids[i], max_target_length, tokenizer.eos_token_id)
        source_lengths = np.minimum(source_lengths, max_source_length)
        target_lengths = np.minimum(target_lengths, max_target_length)
    return pa.table(
        {
            "input_ids": ragged([source_ids[i] for i in keep], source_lengths[keep], id_type),
            "labels": ragged([target_ids[i] for i in keep], target_lengths[keep], id_type),
            "row": rows[keep],
            "status": np.where(too_long[keep], TRUNCATED, KEPT).astype(np.int8),
        }
    )


def cut(ids, limit, eos):
    """At most `limit` ids: the beginning, and the final </s> kept."""
    return ids if len(ids) <= limit else ids[: limit - 1] + [eos]


def ragged(sequences, lengths, id_type):
    """A list<id_type> Arrow column whose rows hold `sequences`, of `lengths` ids each."""
    values = np.fromiter(itertools.chain.from_iterable(sequences), dtype=id_type, count=int(lengths.sum()))
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def count_without_text(split, source_lang, target_lang):
    """How many rows of a split lack text on a side, counted in Arrow batch by batch (no text becomes Python)."""
    missing = 0
    for batch in split.select_columns(["translation"]).with_format("arrow").iter(batch_size=100_000):
        missing += len(batch) - pc.sum(text_pairs(batch.column("translation"), source_lang, target_lang)[2]).as_py()
    return missing


@dataclass
class TokenizedSplit:
    """The pairs of one split that train, tokenized into memory-mapped Arrow files, and what was left out.

    `pairs` has the columns input_ids, labels (ids ending in </s>, `token_type`), row (the
    pair's row in the original split, e.g. for its texts) and status (KEPT or TRUNCATED). It has no indices mapping:
    a batch is one Arrow `take`, and a whole column is read without Python objects.
    """

    pairs: Dataset
    truncated: int
    too_long: int
    without_text: int
    from_cache: bool

    @property
    def rows(self):
        return self.column("row")

    @property
    def source_lengths(self):
        return self.lengths("input_ids")

    @property
    def target_lengths(self):
        return self.lengths("labels")

    def lengths(self, name):
        """The lengths of an ids column's lists in numpy's narrowest unsigned type that holds them (what
        `TokenBucketSampler` keeps), read from the memory-mapped chunks one at a time: no int32 array of the whole
        column on the way (144 MB at 36M pairs)."""
        chunks = self.pairs.data.column(name).chunks
        longest = max((pc.max(pc.list_value_length(chunk)).as_py() or 0 for chunk in chunks), default=0)
        lengths = np.empty(len(self.pairs), dtype=length_type(longest))
        start = 0
        for chunk in chunks:
            lengths[start : start + len(chunk)] = pc.list_value_length(chunk).to_numpy()
            start += len(chunk)
        return lengths

    def column(self, name):
        return self.pairs.data.column(name).to_numpy()

    def __len__(self):
        return len(self.pairs)


def tokenize_split(
    split,
    tokenizer,
    source_lang,
    target_lang,
    max_source_length=256,
    max_target_length=256,
    long_pairs="filter",
    num_proc=None,
):
    """Tokenize a split once into Arrow next to its own files; later calls with the same inputs map the cache.

    The cache key is the split's fingerprint (`split_fingerprint`), the tokenizer's fingerprint, the languages, the
    limits and `long_pairs`. A JSON file with the counts of what was left out is written last and marks the cache
    complete. Run it in one process first (accelerate's `main_process_first`); the others then find the files and
    only map them.
    """
    if long_pairs not in ("filter", "truncate"):
        raise ValueError(f"long_pairs must be 'filter' or 'truncate', not {long_pairs!r}")
    for name, limit in (("max_source_length", max_source_length), ("max_target_length", max_target_length)):
        if limit < 2:
            raise ValueError(f"{name} must be at least 2 (a token and </s>), not {limit}")
    key = Hasher.hash(
        [
            CACHE_FORMAT,
            split_fingerprint(split),
            tokenizer_fingerprint(tokenizer),
            source_lang,
            target_lang,
            max_source_length,
            max_target_length,
            long_pairs,
        ]
    )
    cache_file = counts_file = None  # an in-memory split (no files): datasets uses a temporary cache
    if split.cache_files:
        prefix = os.path.join(os.path.dirname(split.cache_files[0]["filename"]), f"{CACHE_PREFIX}-{key}")
        cache_file, counts_file = Path(f"{prefix}.arrow"), Path(f"{prefix}.json")
    from_cache = counts_file is not None and counts_file.is_file() and bool(glob.glob(f"{prefix}*.arrow"))
    pairs = (
        split.with_format("arrow")
        .map(
            encode_pairs,
            batched=True,
            batch_size=PAIRS_PER_BATCH,
            writer_batch_size=PAIRS_PER_BATCH,
            with_indices=True,
            num_proc=None if from_cache else num_proc,
            remove_columns=split.column_names,
            features=tokenized_features(token_type(tokenizer)),
            cache_file_name=str(cache_file) if cache_file else None,
            new_fingerprint=key,
            desc=f"tokenizing {len(split):,} pairs",
            fn_kwargs={
                "tokenizer": tokenizer,
                "source_lang": source_lang,
                "target_lang": target_lang,
                "max_source_length": max_source_length,
                "max_target_length": max_target_length,
                "long_pairs": long_pairs,
                "id_type": token_type(tokenizer),
            },
        )
        .with_format(None)
    )
    if from_cache:
        counts = json.loads(counts_file.read_text())
    else:
        without_text = count_without_text(split, source_lang, target_lang)
        counts = {
            "truncated": int(np.count_nonzero(pairs.data.column("status").to_numpy() == TRUNCATED)),
            "too_long": len(split) - len(pairs) - without_text,
            "without_text": without_text,
        }
        if counts_file is not None:
            counts_file.write_text(json.dumps(counts))
    return TokenizedSplit(pairs, **counts, from_cache=from_cache)


# ---------------------------------------------------------------------------------------------------------------------
# Batches as tensors.
# ---------------------------------------------------------------------------------------------------------------------


COLLATED = ("input_ids", "labels")  # the columns a batch is made of


class PairCollator:
    """A padded batch from an Arrow table of pairs: source ids and mask, target labels (-100 on padding), and the
    decoder input, the labels shifted right behind the decoder start token (section 3; `padding.pair_batch`)."""

    def __init__(self, pad_token_id, decoder_start_token_id):
        self.pad_token_id, self.decoder_start_token_id = pad_token_id, decoder_start_token_id

    def __call__(self, table: pa.Table):
        sources, targets = (table.column(name).combine_chunks() for name in COLLATED)
        return pair_batch(
            sources.flatten().to_numpy(),
            pc.list_value_length(sources).to_numpy(),
            targets.flatten().to_numpy(),
            pc.list_value_length(targets).to_numpy(),
            self.pad_token_id,
            self.decoder_start_token_id,
        )


def pair_loader(split, sampler, collator, num_workers=0, pin_memory=False):
    """A DataLoader that reads the sampler's batches from the memory-mapped pairs (one Arrow `take` per batch) and
    pads them, in `num_workers` worker processes that prepare the next batches while the model trains. With
    `pin_memory` (for a GPU) the batches come in page-locked memory, which copies to the GPU without blocking the host.

    It has a random generator of its own: a DataLoader draws a seed from the global one each time it is iterated,
    which would shift the dropout masks of every later step by when the loader was iterated (a resumed run starts
    its iterator at another step than the uninterrupted run did).
    """
    return torch.utils.data.DataLoader(
        split.pairs.select_columns(list(COLLATED)).with_format("arrow"),
        sampler=sampler,
        batch_size=None,
        collate_fn=collator,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
        prefetch_factor=4 if num_workers else None,
        generator=torch.Generator(),
    )


@dataclass
class TrainingData:
    """A run's data (section 5.1): the training and validation pairs tokenized once into Arrow next to the dataset,
    their token-bucket batches for this process, and the validation pairs that BLEU is measured on (sources,
    references)."""

    train: TokenizedSplit
    train_loader: torch.utils.data.DataLoader
    valid_loader: torch.utils.data.DataLoader
    bleu_pairs: tuple

    @classmethod
    def load(cls, accelerator, dataset, tokenizer, config, args):
        """The splits of `dataset` for the TrainArguments `args`. The main process tokenizes first; then the first
        process of every other machine, which finds the files on a shared file system or else builds its machine's
        own copy; then all the others, which map the files."""
        with main_process_first(accelerator):
            train, valid = (
                tokenize_split(
                    dataset[split],
                    tokenizer,
                    args.source_lang,
                    args.target_lang,
                    args.max_source_length,
                    args.max_target_length,
                    long_pairs,
                    num_proc=args.num_proc,
                )
                for split, long_pairs in (("train", args.long_pairs), ("validation", "truncate"))
            )
        if not len(train):
            raise UsageError(
                f"no training pair fits --max_source_length {args.max_source_length} / --max_target_length "
                f"{args.max_target_length} ({train.without_text} of them are not text)."
            )
        if not len(valid):
            raise UsageError("the validation split has no pair with text on both sides.")
        per_step = args.gradient_accumulation_steps
        sampler = bucket_sampler(train, "training", args, accelerator, seed=args.seed, batches_per_step=per_step)
        valid_sampler = bucket_sampler(valid, "validation", args, accelerator, shuffle=False, drop_remainder=False)
        steps_per_epoch = sampler.batches_in_epoch(0) // per_step
        if steps_per_epoch == 0:
            raise UsageError(
                f"the training split makes fewer batches of --batch_tokens {args.batch_tokens} than processes x "
                f"--gradient_accumulation_steps ({accelerator.num_processes} x {per_step}); lower either."
            )
        collator = PairCollator(config.pad_token_id, config.decoder_start_token_id)
        pin_memory = accelerator.device.type == "cuda"  # batches then copy to the GPU without blocking (train_step)
        bleu_rows = valid.rows[: args.eval_bleu_samples].tolist()
        bleu_texts = dataset["validation"].select(bleu_rows)["translation"] if bleu_rows else []
        accelerator.print(
            f"train: {len(train)} pairs ({train.too_long} longer than the maximum lengths dropped, {train.truncated} "
            f"truncated, {train.without_text} without text dropped); validation: {len(valid)} pairs "
            f"({valid.without_text} without text dropped); tokenized "
            + ("earlier, read from the cache" if train.from_cache else "now and cached")
            + " next to the dataset\n"
            f"batches of <= {args.batch_tokens} padded tokens x {per_step} accumulated x {accelerator.num_processes} "
            f"processes = <= {args.batch_tokens * per_step * accelerator.num_processes} tokens per optimizer step "
            f"(paper: ~25000 source + ~25000 target); {steps_per_epoch} steps per epoch"
        )
        return cls(
            train=train,
            train_loader=pair_loader(
                train, sampler, collator, num_workers=args.dataloader_num_workers, pin_memory=pin_memory
            ),
            valid_loader=pair_loader(valid, valid_sampler, collator, pin_memory=pin_memory),
            bleu_pairs=(
                [pair[args.source_lang] for pair in bleu_texts],
                [pair[args.target_lang] for pair in bleu_texts],
            ),
        )

    def summary(self, state):
        """The data's figures for training_summary.json, after `state`'s steps."""
        return {
            "epochs": round(state.epoch + state.batch_index / max(len(self.train_loader.sampler), 1), 3),
            "bleu_samples": len(self.bleu_pairs[0]),
            "train_pairs": len(self.train),
            "train_pairs_dropped": self.train.too_long,
            "train_pairs_truncated": self.train.truncated,
            "train_pairs_without_text": self.train.without_text,
        }


def bucket_sampler(split, name, args, accelerator, **options):
    """`TokenBucketSampler` over a split for this process; a --batch_tokens too small for a pair is named."""
    try:
        return TokenBucketSampler(
            split.source_lengths,
            split.target_lengths,
            args.batch_tokens,
            num_replicas=accelerator.num_processes,
            rank=accelerator.process_index,
            **options,
        )
    except ValueError as error:
        raise UsageError(f"--batch_tokens {args.batch_tokens}, {name} split: {error}") from error
