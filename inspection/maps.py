"""What a model computes for one sentence pair, in the form a picture needs: the attention weights of every layer and
head (section 3.2.3's three uses), the positional encoding (section 3.5), and the tokens that label them."""

from dataclasses import dataclass

import torch


KINDS = ("encoder self-attention", "decoder self-attention", "encoder-decoder attention")
"""The three uses of attention in the model (section 3.2.3), by the names the pictures give them."""


@dataclass
class AttentionMaps:
    """The attention weights of one (source, target) pair, one (heads, queries, keys) tensor per layer: the encoder's
    self-attention (source x source), the decoder's masked self-attention and its encoder-decoder attention (rows: the
    decoder input, the target shifted right behind the start token, so that row t is the state that predicts target
    token t; columns: the decoder input, and the source)."""

    source_tokens: list[str]
    decoder_tokens: list[str]
    encoder_self: tuple[torch.Tensor, ...]
    decoder_self: tuple[torch.Tensor, ...]
    encoder_decoder: tuple[torch.Tensor, ...]

    def kinds(self) -> dict[str, tuple[tuple[torch.Tensor, ...], list[str], list[str]]]:
        """Each use of attention by its name: its weights, the labels of its rows and of its columns."""
        uses = (
            (self.encoder_self, self.source_tokens, self.source_tokens),
            (self.decoder_self, self.decoder_tokens, self.decoder_tokens),
            (self.encoder_decoder, self.decoder_tokens, self.source_tokens),
        )
        return dict(zip(KINDS, uses))


def attention_maps(model, tokenizer, text: str, target: str) -> AttentionMaps:
    """The attention weights of every layer and head of `model` (loaded with `attn_implementation="eager"`: the fused
    kernels never form the weights) for one (source, target) pair, with the tokens of both as labels."""
    encoded = tokenizer([text], text_target=[target], return_tensors="pt")
    with torch.no_grad():
        output = model(
            input_ids=encoded["input_ids"].to(model.device),
            attention_mask=encoded["attention_mask"].to(model.device),
            labels=encoded["labels"].to(model.device),
            output_attentions=True,
        )
    decoder_input = model.prepare_decoder_input_ids_from_labels(encoded["labels"])[0].tolist()

    def first(weights):
        return tuple(layer[0].float().cpu() for layer in weights)

    return AttentionMaps(
        source_tokens=readable(tokenizer, encoded["input_ids"][0].tolist()),
        decoder_tokens=readable(tokenizer, decoder_input),
        encoder_self=first(output.encoder_attentions),
        decoder_self=first(output.decoder_attentions),
        encoder_decoder=first(output.cross_attentions),
    )


def readable(tokenizer, ids: list[int]) -> list[str]:
    """Each token of `ids` as the text it stands for (byte-level BPE's "Ã©" as "é", a Moses BPE's "@@" dropped),
    with the space that begins a word shown as "_"; a token that holds part of a character shows "\ufffd"."""
    texts = [tokenizer.convert_tokens_to_string([token]) for token in tokenizer.convert_ids_to_tokens(ids)]
    return ["_" + text[1:] if text.startswith(" ") else text for text in texts]


def positional_encoding(model, num_positions: int) -> torch.Tensor:
    """The (positions, d_model) matrix the model adds to its embeddings, computed by the model itself; learned
    positions (Table 3, row (E)) stop at their table's end."""
    positions = model.get_encoder().embed_positions
    with torch.no_grad():
        return positions(torch.arange(min(num_positions, positions.max_positions)), torch.float32).cpu()
