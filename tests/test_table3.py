"""Table 3 of the paper, every row: built from its config (configuration/table3.py) at the paper's sizes, with the
parameter count the paper prints, and trained in miniature by benchmarks/table3.py."""

import json
import math
import sys

import ctranslate2
import pytest
import torch
from helpers import make_dataset, pad_pairs, run_command, tiny_model_config, trained_on, word_tokenizer

from vaswani import VaswaniForConditionalGeneration
from vaswani.checks import UsageError
from vaswani.configuration.table3 import TABLE3
from vaswani.export.ctranslate2 import export, translate_ids, vocabulary


def on_meta(config) -> VaswaniForConditionalGeneration:
    with torch.device("meta"):  # the shapes without the memory: the big model's 213M parameters cost nothing
        return VaswaniForConditionalGeneration(config)


def parameters(row, vocab_size: int) -> int:
    return on_meta(row.config(vocab_size=vocab_size)).num_parameters()


def test_every_row_is_built_as_the_paper_describes_it():
    rows = {row.name: row.config(vocab_size=37000) for row in TABLE3}
    attention = {
        name: on_meta(config).model.decoder.layers[0].encoder_attn
        for name, config in rows.items()
        if name.startswith(("(A)", "(B)"))
    }
    # (A): h heads of d_k = d_v = d_model / h; (B): d_k shrunk, d_v kept at 64.
    assert [(a.config.decoder_attention_heads, a.head_dim, a.value_head_dim) for a in attention.values()] == [
        (1, 512, 512), (4, 128, 128), (16, 32, 32), (32, 16, 16), (8, 16, 64), (8, 32, 64)
    ]  # fmt: skip
    assert rows["(C) d_model=256"].d_model == 256 and rows["(E) positional embedding"].positional_encoding == "learned"
    big = rows["big"]
    assert (big.d_model, big.encoder_ffn_dim, big.encoder_attention_heads, big.dropout) == (1024, 4096, 16, 0.3)
    eps = {row.name: row.label_smoothing for row in TABLE3 if row.name.startswith("(D) eps")}
    assert eps == {"(D) eps_ls=0.0": 0.0, "(D) eps_ls=0.2": 0.2}


def vocabularies_matching(row) -> tuple[float, float]:
    """The shared vocabulary sizes at which the row's count rounds to the paper's (to the million), from the count
    at 37,000 tokens (the paper's "about 37000") and one embedding row per token of d_model parameters."""
    paper = (row.params or 65) * 1e6  # an empty cell is the base model's count
    d_model = row.config(vocab_size=37000).d_model
    rest = parameters(row, 37000) - 37000 * d_model
    return (paper - 0.5e6 - rest) / d_model, (paper + 0.5e6 - rest) / d_model


def test_the_parameter_counts_are_the_papers_for_one_shared_vocabulary_but_the_big_models():
    """The counts depend on the vocabulary, which the paper gives as "about 37000" tokens: every row but "big" rounds
    to the paper's figure for one vocabulary, of 41,000 to 41,200 tokens; the paper's 213M for the big model asks for
    about 35,900, so at that vocabulary the big model has 5M more parameters than printed (docs/training.md)."""
    ranges = {row.name: vocabularies_matching(row) for row in TABLE3}
    big = ranges.pop("big")
    lowest, highest = max(low for low, _ in ranges.values()), min(high for _, high in ranges.values())
    assert 41_000 < lowest < highest < 41_250, ranges
    vocabulary = round((lowest + highest) / 2)
    for row in TABLE3:
        count = parameters(row, vocabulary) / 1e6
        expected = (row.params or 65) + (5 if row.name == "big" else 0)
        assert round(count) == expected, f"{row.name}: {count:.2f}M at {vocabulary} tokens; the paper has {row.params}"
    assert 35_300 < big[0] < big[1] < 36_400  # 35,856 tokens, give or take the rounding of 213M


def test_rows_scale_down_for_the_miniature():
    configs = {row.name: row.config(width_divisor=4, layer_divisor=2, vocab_size=100) for row in TABLE3}
    base = configs["base"]
    assert (base.d_model, base.encoder_ffn_dim, base.encoder_layers, base.encoder_attention_heads) == (128, 512, 3, 8)
    assert (configs["(B) d_k=16"].d_k, configs["(B) d_k=16"].d_v) == (4, 16)
    assert configs["(C) N=2"].decoder_layers == 1 and configs["(C) d_model=1024"].d_model == 256
    with pytest.raises(ValueError, match=r"Table 3 row \(C\) N=2: encoder_layers=2 is not divisible by 4"):
        TABLE3[7].config(layer_divisor=4, vocab_size=100)


# Rows (B) and (E) at once, in the tiny preset: queries and keys of 8 dimensions a head, values of 32, learned positions.
ROWS_B_AND_E = {"d_k": 8, "d_v": 32, "positional_encoding": "learned", "max_position_embeddings": 64}


@pytest.fixture(scope="module")
def rows_b_and_e(translation_pairs):
    return trained_on(translation_pairs, tiny_model_config(**ROWS_B_AND_E))


def test_rows_b_and_e_decode_with_every_cache_as_the_model_scores(rows_b_and_e, translation_pairs):
    """The paper's beam search (its own cache, keys and values of different sizes) scores each hypothesis as the model
    does; greedy decoding gives the same translations with the dynamic cache, the static one and none."""
    input_ids, attention_mask, _ = pad_pairs(translation_pairs[:3])
    out = rows_b_and_e.generate(
        input_ids, attention_mask=attention_mask, num_beams=4, output_scores=True, return_dict_in_generate=True
    )
    for sentence, (sequence, score) in enumerate(zip(out.sequences, out.sequences_scores)):
        target = translation_pairs[sentence][1]
        assert sequence[1 : len(target) + 1].tolist() == target
        with torch.no_grad():
            logits = rows_b_and_e(
                input_ids=input_ids[sentence : sentence + 1],
                attention_mask=attention_mask[sentence : sentence + 1],
                decoder_input_ids=sequence[None, : len(target)],
            ).logits[0]
        log_probability = logits.log_softmax(-1).gather(1, torch.tensor(target)[:, None]).sum()
        expected = log_probability / ((5 + len(target)) / 6) ** 0.6
        torch.testing.assert_close(score, expected, atol=1e-5, rtol=1e-5)
    greedy = {
        cache: rows_b_and_e.generate(input_ids, attention_mask=attention_mask, num_beams=1, **options)
        for cache, options in (
            ("dynamic", {}),
            ("static", {"cache_implementation": "static"}),
            ("none", {"use_cache": False}),
        )
    }
    assert torch.equal(greedy["dynamic"], greedy["static"]) and torch.equal(greedy["dynamic"], greedy["none"])


def test_ctranslate2_takes_learned_positions_and_refuses_row_b(translation_pairs, tmp_path):
    learned = trained_on(
        translation_pairs, tiny_model_config(positional_encoding="learned", max_position_embeddings=64)
    )
    batch = [source for source, _ in translation_pairs]
    theirs = translate_ids(
        ctranslate2.Translator(str(export(learned, tmp_path / "e")), device="cpu"), vocabulary(learned), batch
    )
    assert theirs == [target[:-1] for _, target in translation_pairs]  # without </s>, as CTranslate2 returns them
    row_b = VaswaniForConditionalGeneration(tiny_model_config(d_k=8))
    with pytest.raises(
        UsageError, match=r"each head d_model / heads dimensions .* d_k=8 and d_v=16 \(Table 3, row \(B\)\)"
    ):
        export(row_b, tmp_path / "b")


def test_vaswani_visualize_draws_the_learned_table_to_its_end(rows_b_and_e):
    from vaswani.inspection.maps import positional_encoding

    table = positional_encoding(rows_b_and_e, 100)  # 64 positions learned: those are drawn
    assert torch.equal(table, rows_b_and_e.model.encoder.embed_positions.weight)


def test_rows_of_another_width_train_at_the_rate_equation_3_gives_them():
    """benchmarks/table3.py: the base row peaks at --peak_lr; the rows of another d_model (256, 1,024, big) at what
    the paper's d_model^-0.5 makes of it, sqrt(2) and 1/sqrt(2) times; a row of the base width at the base's."""
    from benchmarks.table3 import Table3Arguments, row_peak_lr

    args = Table3Arguments(peak_lr=1e-3)
    peaks = {row.name: row_peak_lr(row.config(args.width_divisor, args.layer_divisor), args) for row in TABLE3}
    assert {name for name, peak in peaks.items() if peak != 1e-3} == {"(C) d_model=256", "(C) d_model=1024", "big"}
    assert peaks["(C) d_model=256"] == pytest.approx(1e-3 * 2**0.5)
    assert peaks["(C) d_model=1024"] == pytest.approx(1e-3 / 2**0.5) == peaks["big"]


def test_the_findings_count_the_seeds_whose_rows_agree_with_the_paper():
    """benchmarks/table3.py's findings: label smoothing hurts dev perplexity and helps dev BLEU (section 5.4), each
    counted per seed; learned positions on par within 2%."""
    from benchmarks.table3 import findings

    def run(perplexity, bleu):
        return {"dev_perplexity": perplexity, "bleu": bleu}

    runs = {
        "base": {1: run(10.0, 20.0), 2: run(10.0, 20.0)},
        "(D) eps_ls=0.0": {1: run(9.0, 19.0), 2: run(11.0, 21.0)},
        "(E) positional embedding": {1: run(10.1, 20.0), 2: run(10.5, 20.0)},
    }
    checks = {check["claim"]: (check["rows"], check["agree"], check["seeds"]) for check in findings(runs)}
    assert checks == {
        "label smoothing hurts perplexity": ("base > (D) eps_ls=0.0", 1, 2),
        "label smoothing improves BLEU": ("BLEU: (D) eps_ls=0.0 < base", 1, 2),
        "learned positions are on par with the sinusoids (within 2%)": ("(E) ~ base", 1, 2),
    }
    runs["(D) eps_ls=0.0"][2] = run(9.0, 19.0)
    assert [check["agree"] for check in findings(runs)] == [2, 2, 1]


def test_the_pictures_labels_of_rows_at_nearly_the_same_point_do_not_cover_each_other():
    """benchmarks.table3.separate: three labels at one point, and one far away that stays where it was put."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.table3 import separate

    figure, axis = plt.subplots()
    labels = [axis.annotate(name, (1.0, 1.0), xytext=(3, 3), textcoords="offset points") for name in ("a", "b", "c")]
    labels.append(axis.annotate("far", (0.1, 0.1), xytext=(3, 3), textcoords="offset points"))
    axis.set(xlim=(0, 2), ylim=(0, 2))
    separate(labels, figure)
    renderer = figure.canvas.get_renderer()
    boxes = [label.get_window_extent(renderer) for label in labels]
    assert not any(boxes[i].overlaps(boxes[j]) for i in range(4) for j in range(i + 1, 4))
    assert labels[3].xyann == (3, 3)
    plt.close(figure)


@pytest.mark.slow
def test_table3_in_miniature_trains_and_scores_every_row_beside_the_papers(tmp_path):
    """benchmarks/table3.py --quick end to end: every row trained and scored, the table, the findings, the plot."""
    make_dataset(tmp_path / "data", {"train": 80, "validation": 6, "test": 4})
    word_tokenizer(tmp_path / "tokenizer")
    output = tmp_path / "table3"
    command = [sys.executable, "-m", "benchmarks.table3", "--quick", "--dataset_dir", tmp_path / "data"]
    run_command([*command, "--tokenizer", tmp_path / "tokenizer", "--output_dir", output], timeout=900, check=True)
    report = json.loads((output / "table3.json").read_text())
    assert [entry["row"] for entry in report["rows"]] == [row.name for row in TABLE3]
    for entry, row in zip(report["rows"], TABLE3):
        config = row.config(16, 2, vocab_size=len(word_tokenizer()))  # --quick: widths / 16, layers / 2
        assert entry["parameters_millions"] * 1e6 == pytest.approx(on_meta(config).num_parameters())
        assert math.isfinite(entry["dev_perplexity"][0]) and 0 <= entry["dev_bleu"][0] <= 100
        assert entry["paper"] == {"params": row.params or 65, "dev_perplexity": row.perplexity, "dev_bleu": row.bleu}
    run = json.loads((output / "runs" / "B_d_k=16-seed1.json").read_text())
    assert (run["config"]["d_k"], run["config"]["d_v"], run["settings"]["max_steps"]) == (1, 4, 4)
    wide = json.loads((output / "runs" / "C_d_model=1024-seed1.json").read_text())
    assert wide["peak_lr"] == pytest.approx(wide["settings"]["peak_lr"] / 2**0.5) and run["peak_lr"] == 1.3e-3
    assert json.loads((output / "runs" / "D_eps_ls=0.2-seed1.json").read_text())["label_smoothing"] == 0.2
    assert len(report["findings"]) == 13 and all(finding["seeds"] == 1 for finding in report["findings"])
    table = (output / "table3.md").read_text()
    assert "| (E) positional embedding |" in table and "| single-head attention is worse than 8 heads |" in table
    assert "| label smoothing improves BLEU | BLEU: (D) eps_ls=0.0 < base |" in table
    assert (output / "table3.png").stat().st_size > 0
