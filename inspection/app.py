"""The attention explorer: a Gradio app over one vaswani model (`vaswani-demo --model FOLDER_OR_REPO`, or a Space).

Type a sentence and get its translation with the paper's decoding (beam search with the GNMT length penalty, or
greedy), the n-best list with the scores the beam ranked by, and a look inside: every layer and head of the three
uses of attention (section 3.2.3) with the tokens on the axes and each weight under the pointer, the source-target
alignment `vaswani-translate --alignments` writes, the positional encoding (section 3.5), and the beam search step
by step: at each step the hypotheses it kept, their scores, those that ended, and the best it dropped.

`Explorer` holds the model (loaded once) and computes what the page shows; `build_app` lays the page out. Requests
are answered one at a time, in order: the model serves one decoding at a time, as it would one user.

The model runs the code saved with it (`trust_remote_code`: its modeling, decoding and pipeline files), and this
folder imports nothing of the vaswani package but its own modules, so that a Space runs it as it is, beside a model
repository, without the package (`vaswani.inspection.space`).
"""

import html
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .maps import KINDS, AttentionMaps, attention_maps, positional_encoding, readable


MAX_BEAMS = 16
"""The largest beam the page offers: the paper's search keeps 2k candidates a step, and past 16 the page's tables
grow long for nothing a reader can see."""

AVERAGE = "average of the heads"


class InputError(ValueError):
    """A request the model cannot answer, said in one sentence a reader of the page acts on."""


class ModelError(ValueError):
    """A model the page cannot serve (not found, or not a vaswani model), said in one sentence."""


@dataclass
class Translation:
    """What one request gives: the translation, the n-best list (rank, score, text), the alignment as
    (source token, target token) pairs, the beam search's steps as table rows, and the attention maps of the pair."""

    text: str
    nbest: list[list]
    alignment: list[tuple[str, str]]
    beam_steps: list[list]
    maps: AttentionMaps


class Explorer:
    """One model and its tokenizer, loaded once (`model_path`: a folder written by save_pretrained, or a Hub id), and
    everything the page computes from them.

    All of the model's work runs on one thread of its own, the one that loaded it, whichever of Gradio's worker threads
    asks: torch's CPU threads (an OpenMP team for each thread that calls torch) run at full speed only for the thread
    that started them, and a model loaded on one thread and called from others decoded a 20-token sentence 2-3x
    slower on 2 cores (0.9-1.3 s against 0.46 s)."""

    def __init__(self, model_path: str, tokenizer_path: str | None = None):
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="model")
        self.worker.submit(self.load, model_path, tokenizer_path).result()

    def load(self, model_path: str, tokenizer_path: str | None) -> None:
        from transformers import AutoConfig, pipeline

        try:
            config = AutoConfig.from_pretrained(model_path, trust_remote_code=True)
        except (OSError, ValueError) as error:
            raise ModelError(f"{model_path} is neither a model folder nor a model on the Hub ({error}).") from error
        if config.model_type != "vaswani":
            raise ModelError(f"{model_path} holds a model of type {config.model_type!r}, not a vaswani model.")
        # The fused attention kernels never form the weight matrix; the eager implementation returns it.
        self.translator = pipeline(
            "translation",
            model=model_path,
            tokenizer=tokenizer_path or model_path,
            trust_remote_code=True,
            model_kwargs={"attn_implementation": "eager"},
        )
        self.model, self.tokenizer = self.translator.model.eval(), self.translator.tokenizer
        self.max_source_tokens = self.model.get_encoder().embed_positions.max_positions
        self.max_beams = min(MAX_BEAMS, self.model.config.vocab_size // 2)
        generation = self.model.generation_config
        self.default_beams, self.default_penalty = generation.num_beams, generation.length_penalty

    def check(self, text: str, num_beams: int, nbest: int) -> None:
        """Refuse what the model cannot answer, naming what is wrong (an `InputError`)."""
        if not text.strip():
            raise InputError("Type or paste a sentence to translate.")
        length = len(self.tokenizer(text).input_ids)
        if length > self.max_source_tokens:
            raise InputError(
                f"The text is {length} tokens long and this model reads at most {self.max_source_tokens}: "
                "shorten it, or translate it a sentence at a time."
            )
        if not 1 <= num_beams <= self.max_beams:
            raise InputError(f"The beam size must be between 1 and {self.max_beams}; {num_beams} was asked for.")
        if not 1 <= nbest <= num_beams:
            raise InputError(f"The n-best list holds at most the beam size ({num_beams}) hypotheses; {nbest} asked.")

    def translate(self, text: str, num_beams: int, length_penalty: float, nbest: int) -> Translation:
        """The paper's decoding of `text` (greedy for `num_beams` 1) with `length_penalty`, and what the page shows
        of it."""
        return self.worker.submit(self.translated, text, num_beams, length_penalty, nbest).result()

    def translated(self, text: str, num_beams: int, length_penalty: float, nbest: int) -> Translation:
        num_beams, nbest = int(num_beams), int(nbest)
        self.check(text, num_beams, nbest)
        steps = []
        searched = {"beam_steps": steps} if num_beams > 1 else {}
        answers = self.translator(
            text,
            num_beams=num_beams,
            num_return_sequences=nbest,
            length_penalty=length_penalty,
            return_scores=True,
            return_alignments=True,
            **searched,
        )
        best = answers[0]["translation_text"]
        source_words = self.tokens(text)
        target_words = self.tokens(best, target=True)
        alignment = [(source_words[s], target_words[t]) for s, t in answers[0]["alignment"]]
        return Translation(
            text=best,
            nbest=[
                [rank + 1, round(answer["score"], 4), answer["translation_text"]]
                for rank, answer in enumerate(answers)
            ],
            alignment=alignment,
            beam_steps=self.step_rows(steps),
            maps=attention_maps(self.model, self.tokenizer, text, best),
        )

    def tokens(self, text: str, target: bool = False) -> list[str]:
        """The tokens of `text` without the special ones: what an alignment's indices count."""
        encoded = self.tokenizer(text_target=text) if target else self.tokenizer(text)
        ids = [i for i in encoded.input_ids if i not in self.tokenizer.all_special_ids]
        return readable(self.tokenizer, ids)

    def step_rows(self, steps) -> list[list]:
        """The paper's beam search at work on one sentence (`BeamStep`s): a row per step with the hypotheses it kept
        live and their summed log-probabilities, those that ended at it, the best finished score so far (divided by
        lp(|Y|)), and the best candidate it dropped."""
        rows = []
        for number, step in enumerate(steps, start=1):

            def shown(mask):
                return "; ".join(
                    f"{self.tokenizer.decode(step.tokens[0, i], skip_special_tokens=True) or '</s>'} "
                    f"({step.scores[0, i].item():.2f})"
                    for i in mask[0].nonzero().view(-1).tolist()
                )

            dropped = ~step.live & ~step.ended & (step.scores > -float("inf"))
            first_dropped = dropped & (dropped.cumsum(1) == 1)
            best_finished = step.finished_scores[0, 0].item()
            rows.append(
                [
                    number,
                    shown(step.live),
                    shown(step.ended),
                    "" if best_finished == -float("inf") else f"{best_finished:.3f}",
                    shown(first_dropped),
                ]
            )
        return rows

    def positional_figure(self, num_positions: int = 100):
        from .figures import positional_encoding_figure

        encoding = self.worker.submit(positional_encoding, self.model, num_positions).result()
        return positional_encoding_figure(encoding, self.model.config.positional_encoding)


def attention_html(maps: AttentionMaps | None, kind: str, layer: int, head: str) -> str:
    """One attention map as an HTML table: rows the querying tokens, columns the attended ones, each cell shaded by
    its weight, which the pointer shows (the cell's title)."""
    if maps is None:
        return "<p>Translate a sentence to see its attention.</p>"
    weights, rows, columns = maps.kinds()[kind]
    layer, stack = int(layer), "encoder" if kind == KINDS[0] else "decoder"
    if layer > len(weights) or (head != AVERAGE and int(head) > weights[0].shape[0]):
        return f"<p>The {stack} has {len(weights)} layers of {weights[0].shape[0]} heads.</p>"
    layer_weights = weights[layer - 1]
    matrix = layer_weights.mean(0) if head == AVERAGE else layer_weights[int(head) - 1]
    largest = max(matrix.max().item(), 1e-9)
    cells = []
    for row_token, row in zip(rows, matrix.tolist()):
        shaded = "".join(
            f'<td title="{html.escape(row_token)} &rarr; {html.escape(column)}: {weight:.3f}" '
            f'style="background: rgba(68, 1, 84, {weight / largest:.3f}); width: 1.6em; height: 1.6em"></td>'
            for column, weight in zip(columns, row)
        )
        cells.append(f'<tr><th style="text-align: right">{html.escape(row_token)}</th>{shaded}</tr>')
    header = "".join(
        f'<th style="writing-mode: vertical-rl; transform: rotate(180deg)">{html.escape(column)}</th>'
        for column in columns
    )
    which = "the average of its heads" if head == AVERAGE else f"head {head}"
    caption = (
        f"{kind.capitalize()}, layer {layer}, {which}: rows attend to columns, shaded up to the largest weight "
        f"({largest:.3f}); the pointer shows each weight."
    )
    return (
        f'<table class="attention" style="border-collapse: collapse"><caption>{html.escape(caption)}</caption>'
        f"<tr><th></th>{header}</tr>{''.join(cells)}</table>"
    )


def alignment_html(pairs: list[tuple[str, str]]) -> str:
    """The hard alignment (fairseq's `--print-alignment hard`) as source -> target token pairs."""
    if not pairs:
        return "<p>No alignment: translate a sentence.</p>"
    items = "".join(f"<li>{html.escape(source)} &rarr; {html.escape(target)}</li>" for source, target in pairs)
    return f"<p>Each target token and the source token its last layer's encoder-decoder attention weighs most:</p><ul>{items}</ul>"


def build_app(explorer: Explorer):
    """The page over `explorer`'s model (a `gradio.Blocks`; `.launch()` serves it)."""
    import gradio as gr

    config = explorer.model.config
    layers = max(config.encoder_layers, config.decoder_layers)
    heads = [AVERAGE] + [
        str(h) for h in range(1, max(config.encoder_attention_heads, config.decoder_attention_heads) + 1)
    ]
    with gr.Blocks(title="vaswani: attention explorer") as app:
        gr.Markdown(
            f"# Attention explorer\n{config.encoder_layers}-layer encoder, {config.decoder_layers}-layer decoder, "
            f"d_model {config.d_model}, {config.encoder_attention_heads} heads, {config.vocab_size:,} tokens. "
            "Translate a sentence, then look "
            "inside: attention, alignment, positional encoding and the beam search step by step."
        )
        maps = gr.State(None)
        with gr.Row():
            source = gr.Textbox(label="Sentence", lines=2, scale=3, elem_id="sentence")
            with gr.Column(scale=2):
                num_beams = gr.Slider(
                    1, explorer.max_beams, value=explorer.default_beams, step=1, label="Beam size (1: greedy)"
                )
                length_penalty = gr.Slider(0.0, 2.0, value=explorer.default_penalty, step=0.1, label="Length penalty")
                nbest = gr.Slider(1, explorer.max_beams, value=1, step=1, label="Hypotheses listed")
        run = gr.Button("Translate", variant="primary", elem_id="translate")
        translation = gr.Textbox(label="Translation", interactive=False, elem_id="translation")
        nbest_table = gr.Dataframe(headers=["rank", "score", "translation"], label="n-best list", interactive=False)
        with gr.Tab("Attention"):
            with gr.Row():
                kind = gr.Dropdown(list(KINDS), value=KINDS[2], label="Attention")
                layer = gr.Dropdown([str(n) for n in range(1, layers + 1)], value="1", label="Layer")
                head = gr.Dropdown(heads, value=AVERAGE, label="Head")
            attention = gr.HTML(attention_html(None, "", 1, AVERAGE), elem_id="attention")
        with gr.Tab("Alignment"):
            alignment = gr.HTML(alignment_html([]))
        with gr.Tab("Beam search"):
            steps = gr.Dataframe(
                headers=["step", "kept live (score)", "ended (score)", "best finished", "best dropped (score)"],
                label="The paper's beam search, step by step (scores: summed log-probabilities)",
                interactive=False,
            )
        with gr.Tab("Positional encoding"):
            gr.Plot(explorer.positional_figure())

        def answer(text, beams, penalty, listed, shown_kind, shown_layer, shown_head):
            try:
                result = explorer.translate(text, beams, penalty, listed)
            except InputError as error:
                raise gr.Error(str(error)) from None
            return (
                result.text,
                result.nbest,
                result.maps,
                attention_html(result.maps, shown_kind, shown_layer, shown_head),
                alignment_html(result.alignment),
                result.beam_steps,
            )

        run.click(
            answer,
            [source, num_beams, length_penalty, nbest, kind, layer, head],
            [translation, nbest_table, maps, attention, alignment, steps],
            api_name="translate",
            concurrency_limit=1,
        )
        for control in (kind, layer, head):
            control.change(attention_html, [maps, kind, layer, head], attention, api_name=False)
    return app
