"""Run by tests/test_convert_fairseq.py with the Python of a virtual environment holding fairseq (.ci/run makes it):
builds small random fairseq Transformers of every variant vaswani converts, saves them as fairseq's trainer does, loads
them back through fairseq's own checkpoint_utils, and writes what fairseq computes with them.

    python tests/fairseq_reference.py OUTPUT_DIR

OUTPUT_DIR gets a shared `data/` (BPE codes learned by subword-nmt, fairseq dictionaries made from the BPE'd corpus)
and, per variant, `VARIANT/checkpoint.pt` and `VARIANT/reference.pt`: the source token ids fairseq's own Moses and
subword-nmt encoding gives, the encoder output, the decoder's log-probabilities for a given target, and the greedy and
beam-search outputs of fairseq's SequenceGenerator with their scores.
"""

import argparse
import io
import sys
from pathlib import Path

import torch
from fairseq import checkpoint_utils, tasks
from fairseq.data import Dictionary, data_utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models.transformer import TransformerModel
from fairseq.sequence_generator import SequenceGenerator
from omegaconf import OmegaConf
from subword_nmt.apply_bpe import BPE
from subword_nmt.learn_bpe import learn_bpe


CORPUS = [
    "The cat sat on the mat, and the dog sat beside it.",
    "In the beginning God created the heavens and the earth.",
    "A well-known rule: translation needs the whole sentence.",
    "Attention is all you need, said the eight authors.",
    "The quick brown fox jumps over the lazy dog.",
    "Neural machine translation learns from parallel text.",
] * 3
SENTENCES = ["The cat sat on the mat.", "A well-known dog jumps over the quick fox, and said it.", "Attention!"]
# A fixed cap on the output (fairseq's max_len_b with max_len_a 0): random models rarely stop by themselves.
MAX_LEN_B = 12
TINY = {
    "encoder_embed_dim": 32,
    "decoder_embed_dim": 32,
    "encoder_ffn_embed_dim": 64,
    "decoder_ffn_embed_dim": 48,
    "encoder_layers": 2,
    "decoder_layers": 3,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "max_source_positions": 64,
    "max_target_positions": 64,
}
VARIANTS = {
    # The published models of Ott et al. (2018): one dictionary, every embedding shared.
    "wmt_en_de_shared": ("transformer_wmt_en_de", {"share_all_embeddings": True}, "cfg"),
    "vaswani_big_shared": ("transformer_vaswani_wmt_en_de_big", {"share_all_embeddings": True}, "cfg"),
    "decoder_tied": ("transformer", {"share_decoder_input_output_embed": True, "decoder_attention_heads": 2}, "cfg"),
    "untied": ("transformer", {}, "cfg"),
    "old_style_args": ("transformer_wmt_en_de", {"share_all_embeddings": True}, "args"),
}


def prepare_data(data_dir: Path) -> BPE:
    data_dir.mkdir(parents=True, exist_ok=True)
    from sacremoses import MosesTokenizer

    moses = MosesTokenizer("en")
    tokenized = [moses.tokenize(line, aggressive_dash_splits=True, return_str=True, escape=True) for line in CORPUS]
    codes = io.StringIO()
    learn_bpe(io.StringIO("\n".join(tokenized) + "\n"), codes, num_symbols=60, min_frequency=2)
    (data_dir / "bpecodes").write_text(codes.getvalue(), encoding="utf-8")
    bpe = BPE(io.StringIO(codes.getvalue()))
    dictionary = Dictionary()
    for line in tokenized:
        for token in bpe.process_line(line).split():
            dictionary.add_symbol(token)
    dictionary.finalize(padding_factor=8)  # as fairseq-preprocess does
    for lang in ("en", "de"):
        dictionary.save(str(data_dir / f"dict.{lang}.txt"))


def build_model(data_dir: Path, arch: str, options: dict) -> tuple[TransformerModel, argparse.Namespace]:
    args = argparse.Namespace(
        task="translation", data=str(data_dir), source_lang="en", target_lang="de", arch=arch, **{**TINY, **options}
    )
    from fairseq.models import ARCH_CONFIG_REGISTRY

    ARCH_CONFIG_REGISTRY[arch](args)
    task = tasks.setup_task(args)
    return task.build_model(args), args


def save(model, args, path: Path, style: str) -> None:
    """As fairseq's trainer writes a checkpoint (Trainer.state_dict), or old style, with the argparse options."""
    state = {
        "args": args if style == "args" else None,
        "model": model.state_dict(),
        "optimizer_history": [
            {
                "criterion_name": "LabelSmoothedCrossEntropyCriterion",
                "optimizer_name": "FairseqAdam",
                "lr_scheduler_state": {"best": None},
                "num_updates": 0,
            }
        ],
        "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0}},
    }
    if style == "cfg":
        state["cfg"] = OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True, enum_to_str=True)
    checkpoint_utils.torch_persistent_save(state, str(path))


def reference(folder: Path, data_dir: Path) -> dict:
    # fairseq's own way in: checkpoint_utils reads the file, Moses and subword-nmt encode the text.
    hub = TransformerModel.from_pretrained(
        str(folder),
        checkpoint_file="checkpoint.pt",
        data_name_or_path=str(data_dir),
        tokenizer="moses",
        bpe="subword_nmt",
        bpe_codes=str(data_dir / "bpecodes"),
    )
    model, task = hub.models[0], hub.task
    model.eval()
    sources = [hub.encode(sentence) for sentence in SENTENCES]
    batch = data_utils.collate_tokens(sources, pad_idx=task.source_dictionary.pad(), left_pad=False)
    lengths = torch.tensor([len(s) for s in sources])
    with torch.no_grad():
        encoder_out = model.encoder(batch, src_lengths=lengths)["encoder_out"][0].transpose(0, 1)
        targets = [torch.cat((s.flip(0)[1:], s[-1:])) for s in sources]  # any target: the source reversed + </s>
        target = data_utils.collate_tokens(targets, pad_idx=1, eos_idx=2, left_pad=False)
        previous = data_utils.collate_tokens(targets, pad_idx=1, eos_idx=2, left_pad=False, move_eos_to_beginning=True)
        logits = model(batch, lengths, previous)[0]
        log_probs = model.get_normalized_probs((logits,), log_probs=True)
    sample = {"net_input": {"src_tokens": batch, "src_lengths": lengths}}
    outputs = {
        "sources": sources,
        "encoder_out": encoder_out,
        "target": target,
        "previous": previous,
        "logits": logits,
        "log_probs": log_probs,
        "decoded": [hub.decode(s) for s in sources],
    }
    for name, beam, penalty in (("greedy", 1, 1.0), ("beam", 4, 0.6)):
        generator = SequenceGenerator(
            [model], task.target_dictionary, beam_size=beam, max_len_a=0, max_len_b=MAX_LEN_B, len_penalty=penalty
        )
        with torch.no_grad():
            hypotheses = generator.generate([model], sample)
        outputs[name] = [[(h["tokens"], h["score"]) for h in sentence] for sentence in hypotheses]
    return outputs


def main(output_dir: Path) -> None:
    # fairseq 0.12 predates torch's weights_only default (2.6), which refuses the options its checkpoints hold.
    torch.serialization.add_safe_globals([argparse.Namespace])
    torch.manual_seed(0)
    data_dir = output_dir / "data"
    prepare_data(data_dir)
    for variant, (arch, options, style) in VARIANTS.items():
        folder = output_dir / variant
        folder.mkdir(parents=True, exist_ok=True)
        model, args = build_model(data_dir, arch, options)
        save(model, args, folder / "checkpoint.pt", style)
        # What fairseq itself reads back from the file is what is compared.
        torch.save(reference(folder, data_dir), folder / "reference.pt")
    # Variants vaswani refuses: the checkpoint only, no reference.
    for variant, options in {
        "pre_norm": {"encoder_normalize_before": True, "decoder_normalize_before": True},
        "learned_positions": {"encoder_learned_pos": True, "decoder_learned_pos": True},
        "layer_drop": {"encoder_layerdrop": 0.1},
        "gelu": {"activation_fn": "gelu"},
    }.items():
        folder = output_dir / variant
        folder.mkdir(parents=True, exist_ok=True)
        model, args = build_model(data_dir, "transformer", {"share_all_embeddings": True, **options})
        save(model, args, folder / "checkpoint.pt", "cfg")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
