"""Translating files and texts as fairseq users do (scripts/translate.py, the pipeline, `translate_batch`): n-best
lists with scores, a forced target prefix, word alignments, `max_source_length` that says what it cut, and the input
order kept through length-sorted batches."""

import select
import subprocess

import pytest
import torch
from helpers import PAIRS, REPO_ROOT, run_command, script_command, script_env
from transformers import pipeline

from vaswani import VaswaniTranslationPipeline
from vaswani.checks import UsageError
from vaswani.evaluation import bleu as evaluation_bleu
from vaswani.modeling.pipeline_vaswani import translate_batch
from vaswani.scripts import translate


SOURCES = [source for source, _ in PAIRS]


def run(folder, tmp_path, sources, *flags, prefixes=None):
    """The output file's lines of scripts/translate.py with these sources and flags."""
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in sources), encoding="utf-8")
    paths = ["--model", folder, "--input", tmp_path / "in.txt", "--output", tmp_path / "out.txt"]
    if prefixes is not None:
        (tmp_path / "prefixes.txt").write_text("".join(line + "\n" for line in prefixes), encoding="utf-8")
        paths += ["--prefixes", tmp_path / "prefixes.txt"]
    translate.main([*paths, "--device", "cpu", *flags])
    return (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()


def test_translations_keep_the_input_order_through_length_sorted_batches(trained_text_model, tmp_path):
    model, tokenizer, folder = trained_text_model
    lines = run(folder, tmp_path, SOURCES[::-1] + SOURCES, "--batch_size", "3")
    assert lines == [target for _, target in PAIRS[::-1] + PAIRS]  # the model learnt these by heart


def test_nbest_lists_hold_the_beams_hypotheses_with_their_scores(trained_text_model, tmp_path):
    model, tokenizer, folder = trained_text_model
    lines = run(folder, tmp_path, SOURCES[:2], "--nbest", "3", "--scores")
    rows = [line.split("\t") for line in lines]
    assert [(int(i), int(rank)) for i, rank, _, _ in rows] == [(i, r) for i in range(2) for r in range(3)]
    for sentence, source in enumerate(SOURCES[:2]):
        output = model.generate(
            **tokenizer([source], return_tensors="pt"),
            num_return_sequences=3,
            return_dict_in_generate=True,
            output_scores=True,
        )
        mine = rows[3 * sentence : 3 * sentence + 3]
        assert [text for *_, text in mine] == tokenizer.batch_decode(output.sequences, skip_special_tokens=True)
        assert [float(score) for _, _, score, _ in mine] == pytest.approx(output.sequences_scores.tolist(), abs=1e-4)
    assert rows[0][3] == PAIRS[0][1]  # best first


def test_a_forced_prefix_begins_every_translation(trained_text_model, tmp_path):
    model, tokenizer, folder = trained_text_model
    prefixes = ["El amor", "Y", "El Señor", "En el principio"]  # the first is another pair's beginning
    lines = run(folder, tmp_path, SOURCES, "--nbest", "2", prefixes=prefixes)
    for sentence, prefix in enumerate(prefixes):
        for rank in range(2):
            assert lines[2 * sentence + rank].split("\t")[2].startswith(prefix)
    assert lines[2].split("\t")[2] == PAIRS[1][1]  # a prefix the translation has anyway changes nothing
    # Prefixes of different lengths share batches; each sentence gets its own.
    start = [
        model.config.decoder_start_token_id,
        *tokenizer(text_target="El amor", add_special_tokens=False).input_ids,
    ]
    alone = model.generate(**tokenizer([SOURCES[0]], return_tensors="pt"), decoder_input_ids=torch.tensor([start]))
    assert lines[0].split("\t")[2] == tokenizer.decode(alone[0], skip_special_tokens=True)


def test_alignments_are_the_argmax_of_the_head_averaged_cross_attention(trained_text_model, tmp_path):
    model, tokenizer, folder = trained_text_model
    lines = run(folder, tmp_path, SOURCES[:1], "--alignments", "--num_beams", "1")
    source = tokenizer([SOURCES[0]], return_tensors="pt").input_ids
    target = tokenizer(text_target=[PAIRS[0][1]], return_tensors="pt").input_ids
    start = torch.tensor([[model.config.decoder_start_token_id]])
    eager = type(model).from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        attention = eager(
            input_ids=source, decoder_input_ids=torch.cat((start, target[:, :-1]), 1), output_attentions=True
        )
    weights = attention.cross_attentions[-1][0].mean(0)[:, :-1]  # last layer, heads averaged, source </s> left out
    expected = [(int(weights[t].argmax()), t) for t in range(target.shape[1] - 1)]  # the target's </s> left out
    assert lines[0].split("\t")[-1] == " ".join(f"{s}-{t}" for s, t in expected)
    assert model.config._attn_implementation == "sdpa"  # the eager detour is undone


def test_max_source_length_cuts_and_says_what(trained_text_model, tmp_path, capsys):
    model, tokenizer, folder = trained_text_model
    full, limit = (len(tokenizer(source).input_ids) for source in SOURCES[:2])  # the second fits exactly
    assert full > limit
    lines = run(folder, tmp_path, SOURCES[:2], "--max_source_length", str(limit))
    assert f"1 sources longer than --max_source_length {limit} tokens were cut (lines 0, counted from 0)" in (
        capsys.readouterr().err
    )
    cut = tokenizer(SOURCES[0]).input_ids[: limit - 1] + [tokenizer.eos_token_id]
    expected = model.generate(torch.tensor([cut]))
    assert lines[0] == tokenizer.decode(expected[0], skip_special_tokens=True)


@pytest.mark.parametrize("streams", [[], ["--input", "-", "--output", "-"]])
def test_a_pipe_translates_standard_input_to_standard_output(trained_text_model, tmp_path, streams):
    """`... | vaswani-translate --model M > hyp.txt`, as fairseq-interactive and marian-decoder sit in a shell pipeline:
    the output holds the translations only, the same as --output's file; the summary is on standard error."""
    _, _, folder = trained_text_model
    sources = [*SOURCES, "", "Dios es amor, ¿verdad?"]  # a blank line and non-ASCII text keep their places
    lines = run(folder, tmp_path, sources, "--nbest", "2", "--scores")
    command = script_command("translate", "--model", folder, "--device", "cpu", "--nbest", "2", "--scores", *streams)
    piped = run_command(command, input="".join(line + "\n" for line in sources), check=True)
    assert piped.stdout.splitlines() == lines
    assert f"Translated {len(sources)} sentences in" in piped.stderr and "into standard output" in piped.stderr
    nothing = run_command(command, input="")
    assert nothing.returncode == 1 and "error: standard input is empty" in nothing.stderr and not nothing.stdout
    with pytest.raises(SystemExit) as exit_info:
        translate.main(["--model", folder, "--prefixes", "-"])
    assert "--prefixes - and --input - would both read standard input" in str(exit_info.value.code)


def test_a_pipe_is_translated_a_chunk_at_a_time_as_its_lines_come(trained_text_model, tmp_path):
    """A long stream is never held whole: the first --chunk_lines lines are translated and on standard output while
    standard input is still open; the lines end where a file's do ("\\n" only: a form feed or a line separator inside a
    line keeps it one line), so the output equals --output's file for the same text."""
    _, _, folder = trained_text_model
    sources = [SOURCES[0], "Dios\x0ces amor\u2028y luz", *SOURCES[1:], "", SOURCES[2]]
    lines = run(folder, tmp_path, sources, "--chunk_lines", "2")
    assert len(lines) == len(sources)
    command = [str(part) for part in script_command("translate", "--model", folder, "--device", "cpu")]
    process = subprocess.Popen(
        [*command, "--chunk_lines", "2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        cwd=REPO_ROOT, env=script_env(),
    )  # fmt: skip
    text = "".join(line + "\n" for line in sources).encode("utf-8")
    first_chunk = text.index(b"\n", text.index(b"\n") + 1) + 1
    try:
        process.stdin.write(text[:first_chunk])
        process.stdin.flush()
        assert select.select([process.stdout], [], [], 120)[0], "nothing was written before standard input ended"
        first = [process.stdout.readline().decode("utf-8").removesuffix("\n") for _ in range(2)]
        rest, errors = process.communicate(text[first_chunk:], timeout=300)
    finally:
        process.kill()
    assert first == lines[:2]
    assert process.returncode == 0, errors.decode()[-3000:]
    assert first + rest.decode("utf-8").splitlines() == lines


def test_a_line_too_long_in_a_later_chunk_is_refused_by_its_number_and_leaves_no_output_file(
    trained_text_model, tmp_path
):
    _, _, folder = trained_text_model
    sources = [*SOURCES, " ".join(SOURCES * 6)]
    output = tmp_path / "out.txt"
    command = script_command(
        "translate", "--model", folder, "--device", "cpu", "--output", output, "--chunk_lines", "2"
    )
    done = run_command(command, input="".join(line + "\n" for line in sources))
    assert done.returncode == 1 and f"line {len(sources)} of --input is" in done.stderr.splitlines()[-1]
    assert not output.exists() and not list(tmp_path.iterdir())


def test_the_pipeline_answers_as_translate_batch(trained_text_model):
    model, tokenizer, folder = trained_text_model
    translator = pipeline("translation", model=folder, pipeline_class=VaswaniTranslationPipeline)
    options = {"num_return_sequences": 2, "return_scores": True, "return_alignments": True, "max_source_length": 6}
    answers = translator(SOURCES[:2], prefix=["En", "Y"], **options)
    expected = translate_batch(model, tokenizer, SOURCES[:2], prefixes=["En", "Y"], **options)
    assert answers == expected  # the same batch
    assert answers[0][0]["translation_text"].startswith("En") and answers[0][0]["source_tokens_dropped"] > 0
    assert answers[0][0]["score"] >= answers[0][1]["score"]


def test_nbest_beyond_the_beam_is_refused(trained_text_model, tmp_path):
    _, _, folder = trained_text_model
    with pytest.raises(SystemExit):
        run(folder, tmp_path, SOURCES[:1], "--nbest", "5", "--num_beams", "4")


def test_a_blank_line_keeps_its_place_with_an_empty_translation(trained_text_model, tmp_path):
    model, tokenizer, folder = trained_text_model
    sources = [SOURCES[0], "", SOURCES[1], "   "]
    lines = run(folder, tmp_path, sources)
    assert lines == [PAIRS[0][1], "", PAIRS[1][1], ""]
    rows = run(folder, tmp_path, sources, "--nbest", "2", "--scores", "--alignments")
    assert [row.split("\t")[:4] for row in rows[2:4]] == [["1", "0", "0.0000", ""], ["1", "1", "0.0000", ""]]
    translate_text = VaswaniTranslationPipeline(model=model, tokenizer=tokenizer)
    assert translate_text(sources) == [
        {"translation_text": PAIRS[0][1]},
        {"translation_text": ""},
        {"translation_text": PAIRS[1][1]},
        {"translation_text": ""},
    ]
    assert translate_text("") == [{"translation_text": ""}]


def test_an_empty_input_file_is_refused(trained_text_model, tmp_path):
    _, _, folder = trained_text_model
    (tmp_path / "in.txt").write_text("", encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        translate.main(["--model", folder, "--input", tmp_path / "in.txt", "--output", tmp_path / "out.txt"])
    assert "in.txt is empty" in str(exit_info.value.code)  # the message the command exits with (status 1)
    assert not (tmp_path / "out.txt").exists()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_dtype_decodes_in_half_precision_to_float32s_translations(trained_text_model, tmp_path, dtype):
    """--dtype loads the weights in that type (the GPU's decoding precision; bfloat16 and float16 run on the CPU too):
    the translations of a model that learnt them by heart are float32's."""
    model, tokenizer, folder = trained_text_model
    lines = run(folder, tmp_path, SOURCES, "--dtype", dtype, "--scores")
    assert [line.split("\t")[3] for line in lines] == [target for _, target in PAIRS]
    loaded, _ = evaluation_bleu.load_translation_model(folder, device="cpu", dtype=dtype)
    assert {parameter.dtype for parameter in loaded.parameters()} == {getattr(torch, dtype)}


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--dtype", "bfloat16", "--int8"], "--int8 quantizes float32 weights: leave out --dtype bfloat16"),
        (["--dtype", "float16", "--ctranslate2", "ct2"], "--ctranslate2 decodes in its model's own type"),
        (["--dtype", "float64"], "invalid choice: 'float64'"),
    ],
)
def test_a_dtype_that_cannot_decode_is_refused_by_name(trained_text_model, tmp_path, capsys, flags, named):
    _, _, folder = trained_text_model
    with pytest.raises(SystemExit) as exit_info:
        run(folder, tmp_path, SOURCES[:1], *flags)
    assert named in f"{exit_info.value.code} {capsys.readouterr().err}"
    assert not (tmp_path / "out.txt").exists()


def test_a_dtype_the_device_cannot_compute_in_is_refused_before_loading(monkeypatch):
    """bfloat16 on a GPU without it (torch would emulate it), and a type whose matrix product fails on the device."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100")
    with pytest.raises(UsageError, match="Tesla V100 does not: decode with --dtype float16 or float32"):
        evaluation_bleu.check_decoding_dtype("bfloat16", torch.device("cuda"))
    with pytest.raises(UsageError, match="--dtype float16 does not run on meta"):
        evaluation_bleu.check_decoding_dtype("float16", torch.device("meta"))
