"""The architecture of section 3, checked against torch.nn.Transformer and against the paper's formulas.

The comparisons with torch.nn.Transformer run on random weights, biases and LayerNorm gains included (freshly
initialised ones are zero and one, under which a mix-up of biases or of LayerNorms changes nothing), in training
mode, forward and backward. Dropout (section 5.4) is checked call by call, and against torch.nn.Transformer with the
same dropout masks.
"""

import contextlib
import logging as python_logging
import math

import pytest
import torch
from helpers import VOCAB_SIZE
from torch import nn

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniModel, label_smoothed_cross_entropy
from vaswani.modeling.modeling_vaswani import positions_of


def weight_map(config: VaswaniConfig) -> dict[str, tuple[str, slice]]:
    """Each of our parameters -> the `ReferenceTransformer` parameter holding it, and which of its rows: there, the
    three input projections of an attention are one matrix."""
    d_model = config.d_model
    in_projections = {
        "q_proj": slice(0, d_model),
        "k_proj": slice(d_model, 2 * d_model),
        "v_proj": slice(2 * d_model, None),
    }
    every_row = slice(None)
    mapping = {"model.shared.weight": ("embedding", every_row)}
    stacks = {
        "encoder": ({"self_attn": "self_attn"}, {"self_attn_layer_norm": "norm1", "final_layer_norm": "norm2"}),
        "decoder": (
            {"self_attn": "self_attn", "encoder_attn": "multihead_attn"},
            {"self_attn_layer_norm": "norm1", "encoder_attn_layer_norm": "norm2", "final_layer_norm": "norm3"},
        ),
    }
    for stack, (attentions, norms) in stacks.items():
        for index in range(getattr(config, f"{stack}_layers")):
            ours, theirs = f"model.{stack}.layers.{index}", f"transformer.{stack}.layers.{index}"
            for our_attention, their_attention in attentions.items():
                for projection, rows in in_projections.items():
                    mapping[f"{ours}.{our_attention}.{projection}.weight"] = (
                        f"{theirs}.{their_attention}.in_proj_weight",
                        rows,
                    )
                mapping[f"{ours}.{our_attention}.out_proj.weight"] = (
                    f"{theirs}.{their_attention}.out_proj.weight",
                    every_row,
                )
            for kind in ("weight", "bias"):
                mapping[f"{ours}.feed_forward.fc1.{kind}"] = (f"{theirs}.linear1.{kind}", every_row)
                mapping[f"{ours}.feed_forward.fc2.{kind}"] = (f"{theirs}.linear2.{kind}", every_row)
                for our_norm, their_norm in norms.items():
                    mapping[f"{ours}.{our_norm}.{kind}"] = (f"{theirs}.{their_norm}.{kind}", every_row)
    return mapping


class ReferenceTransformer(nn.Module):
    """`torch.nn.Transformer` (post-norm) between the paper's embeddings and its tied output projection.

    Without nn.Transformer's final LayerNorm after each stack (the paper has none) and with no attention biases (the
    paper's projections have none: kept at zero). `dropout`, a module, is put where section 5.4 puts dropout: on the
    embedding sums and on each sublayer output before its residual add (nn.Transformer's dropout1/2/3); the dropouts
    the paper does not have, on the attention weights and inside the feed-forward network, stay at 0.
    """

    def __init__(self, config: VaswaniConfig, dropout: nn.Module | None = None):
        super().__init__()
        self.d_model = config.d_model
        self.embedding = nn.Parameter(torch.empty(config.vocab_size, config.d_model))
        self.transformer = nn.Transformer(
            d_model=config.d_model,
            nhead=config.encoder_attention_heads,
            num_encoder_layers=config.encoder_layers,
            num_decoder_layers=config.decoder_layers,
            dim_feedforward=config.encoder_ffn_dim,
            dropout=0.0,
            activation="relu",
            batch_first=True,
            norm_first=False,
        )
        self.transformer.encoder.norm = nn.Identity()
        self.transformer.decoder.norm = nn.Identity()
        self.dropout = dropout if dropout is not None else nn.Identity()
        for layer in [*self.transformer.encoder.layers, *self.transformer.decoder.layers]:
            for name in ("dropout1", "dropout2", "dropout3"):  # after each sublayer, before the residual add
                if hasattr(layer, name):
                    setattr(layer, name, self.dropout)
        for name, parameter in self.named_parameters():
            if name.endswith(("in_proj_bias", "out_proj.bias")):
                parameter.requires_grad_(False).data.zero_()

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        positions = paper_positional_encoding(ids.shape[1], self.d_model).float()
        return self.dropout(nn.functional.embedding(ids, self.embedding) * math.sqrt(self.d_model) + positions)

    def forward(self, input_ids, attention_mask, decoder_input_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """(encoder output, logits)."""
        padding = attention_mask == 0
        memory = self.transformer.encoder(self.embed(input_ids), src_key_padding_mask=padding)
        decoded = self.transformer.decoder(
            self.embed(decoder_input_ids),
            memory,
            tgt_mask=nn.Transformer.generate_square_subsequent_mask(decoder_input_ids.shape[1]),
            tgt_is_causal=True,
            memory_key_padding_mask=padding,
        )
        return memory, decoded @ self.embedding.T


def reference_for(model: VaswaniForConditionalGeneration, dropout: nn.Module | None = None) -> ReferenceTransformer:
    """A `ReferenceTransformer` holding `model`'s weights, in `model`'s mode; every parameter of each is mapped."""
    reference = ReferenceTransformer(model.config, dropout).train(model.training)
    ours, theirs, mapping = (
        dict(model.named_parameters()),
        dict(reference.named_parameters()),
        weight_map(model.config),
    )
    assert mapping.keys() == ours.keys()
    assert {name for name, _ in mapping.values()} == {name for name, p in theirs.items() if p.requires_grad}
    with torch.no_grad():
        for our_name, (their_name, rows) in mapping.items():
            theirs[their_name][rows].copy_(ours[our_name])
    return reference


def randomise_(model: nn.Module, seed: int = 0) -> nn.Module:
    """Biases and LayerNorm gains and biases drawn at random (initialised, they are 0 and 1); matrices stay as
    initialised (already random)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.uniform_(0.5, 1.5, generator=generator)
            elif name.endswith("bias"):
                parameter.normal_(0.0, 0.5, generator=generator)
    return model


def assert_same_outputs_and_gradients(model, reference, input_ids, attention_mask, decoder_input_ids) -> None:
    """Encoder outputs at real positions, logits, and every parameter's gradient of a loss on all logits, to 1e-5."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    memory, logits = reference(input_ids, attention_mask, decoder_input_ids)
    real = attention_mask.bool()
    tolerance = {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(out.encoder_last_hidden_state[real], memory[real], **tolerance)
    torch.testing.assert_close(out.logits, logits, **tolerance)

    weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(3))  # every logit gets a gradient
    (out.logits * weights).sum().backward()
    (logits * weights).sum().backward()
    ours, theirs = dict(model.named_parameters()), dict(reference.named_parameters())
    for our_name, (their_name, rows) in weight_map(model.config).items():
        their_gradient = theirs[their_name].grad[rows]
        torch.testing.assert_close(ours[our_name].grad, their_gradient, **tolerance, msg=lambda m: f"{our_name}: {m}")


def dropout_config() -> VaswaniConfig:
    """The tiny preset with its dropout (0.1) and every other setting at its default."""
    return VaswaniConfig.from_preset("tiny", vocab_size=VOCAB_SIZE, max_position_embeddings=128)


class FixedMasks:
    """Dropout whose n-th call drops the elements that a generator seeded with n picks: two implementations that
    drop at the same places, in the same order, drop the same elements. Keeps every input it was given."""

    def __init__(self):
        self.inputs = []

    def __call__(self, input: torch.Tensor, p: float) -> torch.Tensor:
        generator = torch.Generator().manual_seed(len(self.inputs))
        self.inputs.append(input)
        return input * (torch.rand(input.shape, generator=generator) >= p) / (1 - p)


class FixedMaskDropout(nn.Module):
    def __init__(self, masks: FixedMasks, p: float):
        super().__init__()
        self.masks, self.p = masks, p

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self.masks(input, self.p) if self.training else input


@contextlib.contextmanager
def recorded_dropout(monkeypatch, masks: FixedMasks):
    """Every `F.dropout` call as (p, training, input), active ones dropping with `masks`; and every `dropout_p` given
    to `F.scaled_dot_product_attention`, where the sdpa kernel drops attention weights."""
    calls, sdpa_dropouts = [], []
    sdpa = nn.functional.scaled_dot_product_attention

    def dropout(input, p=0.5, training=True, inplace=False):
        calls.append((p, training, input))
        return masks(input, p) if training and p > 0 else input

    def recorded_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, *args, **kwargs):
        sdpa_dropouts.append(dropout_p)
        return sdpa(query, key, value, attn_mask, dropout_p, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(nn.functional, "dropout", dropout)
        patch.setattr(nn.functional, "scaled_dot_product_attention", recorded_sdpa)
        yield calls, sdpa_dropouts


def paper_positional_encoding(length: int, d_model: int) -> torch.Tensor:
    """Section 3.5, element by element with Python's math, independent of the model's vectorised code."""
    table = torch.empty(length, d_model, dtype=torch.float64)
    for pos in range(length):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            table[pos, 2 * i] = math.sin(angle)
            table[pos, 2 * i + 1] = math.cos(angle)
    return table


def test_forward_and_backward_match_torch_nn_transformer_on_random_weights(tiny_config, source_batch):
    """Training mode with dropout 0: nothing random, and the code path that training takes."""
    input_ids, attention_mask = source_batch
    decoder_input_ids = torch.tensor([[1, 5, 9, 13, 17], [1, 6, 10, 14, 18]])
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = randomise_(VaswaniForConditionalGeneration(tiny_config)).train()
    assert_same_outputs_and_gradients(model, reference_for(model), input_ids, attention_mask, decoder_input_ids)


def test_positional_encoding_is_the_paper_formula(tiny_model):
    d_model = tiny_model.config.d_model
    computed = tiny_model.model.encoder.embed_positions(torch.arange(50), torch.float64)
    torch.testing.assert_close(computed, paper_positional_encoding(50, d_model), atol=1e-12, rtol=0)


def test_positional_encoding_is_not_saved_and_loads_right(tiny_model, tmp_path):
    assert not any("position" in key for key in tiny_model.state_dict())
    tiny_model.save_pretrained(tmp_path)
    loaded = VaswaniForConditionalGeneration.from_pretrained(tmp_path)
    for stack in (loaded.model.encoder, loaded.model.decoder):
        computed = stack.embed_positions(torch.arange(20), torch.float64)
        torch.testing.assert_close(computed, paper_positional_encoding(20, loaded.config.d_model), atol=1e-12, rtol=0)


def test_max_positions_can_be_raised_after_training(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path)
    longer = VaswaniForConditionalGeneration.from_pretrained(tmp_path, max_position_embeddings=512).eval()
    input_ids = torch.randint(4, 100, (1, 300))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        tiny_model(input_ids=input_ids, decoder_input_ids=input_ids[:, :3])
    limit = tiny_model.config.max_position_embeddings  # the limit itself is allowed, in both stacks
    with torch.no_grad():
        assert (
            tiny_model(input_ids=input_ids[:, :limit], decoder_input_ids=input_ids[:, :limit]).logits.shape[1] == limit
        )
    with torch.no_grad():
        assert longer(input_ids=input_ids, decoder_input_ids=input_ids[:, :3]).logits.isfinite().all()
        short = input_ids[:, :20]
        torch.testing.assert_close(
            longer(input_ids=short, decoder_input_ids=short).logits,
            tiny_model(input_ids=short, decoder_input_ids=short).logits,
        )


def test_embeddings_are_scaled_by_sqrt_d_model(tiny_model):
    ids = torch.tensor([[5, 6]])
    embedding = tiny_model.model.shared
    torch.testing.assert_close(embedding(ids), embedding.weight[ids] * math.sqrt(tiny_model.config.d_model))


def test_three_way_weight_tying_after_init_and_after_loading(tiny_model, tmp_path):
    def tied(model):
        shared = model.model.shared.weight
        return all(
            weight.data_ptr() == shared.data_ptr()
            for weight in (
                model.model.encoder.embed_tokens.weight,
                model.model.decoder.embed_tokens.weight,
                model.lm_head.weight,
            )
        )

    assert tied(tiny_model)
    tiny_model.save_pretrained(tmp_path)
    assert tied(VaswaniForConditionalGeneration.from_pretrained(tmp_path))


def test_padded_source_tokens_do_not_influence_anything(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    decoder_input_ids = torch.tensor([[1, 5, 9], [1, 6, 10]])
    changed = input_ids.clone()
    changed[1, 7:] = torch.tensor([55, 66])  # under the padding mask
    with torch.no_grad():
        before = tiny_model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
        after = tiny_model(input_ids=changed, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    torch.testing.assert_close(before.logits, after.logits)


def test_future_target_tokens_do_not_influence_earlier_positions(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    decoder_input_ids = torch.tensor([[1, 5, 9, 13, 17, 21]])
    for cut in range(1, 6):
        changed = decoder_input_ids.clone()
        changed[0, cut:] = 42
        with torch.no_grad():
            before = tiny_model(input_ids=input_ids[:1], decoder_input_ids=decoder_input_ids).logits
            after = tiny_model(input_ids=input_ids[:1], decoder_input_ids=changed).logits
        torch.testing.assert_close(before[:, :cut], after[:, :cut])
        assert not torch.allclose(before[:, cut:], after[:, cut:])


def test_loss_ignores_minus_100_and_normalises_by_num_items(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    labels = torch.tensor([[7, 8, 9, 2], [10, 2, -100, -100]])
    out = tiny_model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    logits = out.logits.reshape(-1, tiny_model.config.vocab_size)
    expected_sum = nn.functional.cross_entropy(logits, labels.reshape(-1), ignore_index=-100, reduction="sum")
    torch.testing.assert_close(out.loss, expected_sum / 6)
    # Trainer passes the labelled-token count of the whole accumulated batch; the loss is then a sum over it.
    scaled = tiny_model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, num_items_in_batch=12)
    torch.testing.assert_close(scaled.loss, expected_sum / 12)
    # Without decoder inputs the model shifts the labels right behind the decoder start token.
    shifted = torch.tensor([[1, 7, 8, 9], [1, 10, 2, 0]])
    torch.testing.assert_close(
        tiny_model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=shifted).logits, out.logits
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("vocab_size", [40, 2**19 + 3])  # the larger spreads 10 rows over chunks of 3 rows
def test_label_smoothed_loss_and_gradient_equal_torch_cross_entropy(dtype, label_smoothing, vocab_size):
    torch.manual_seed(0)
    logits = (3 * torch.randn(2, 5, vocab_size)).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab_size, (2, 5))
    labels[1, 3:] = -100
    smoothed, plain = label_smoothed_cross_entropy(logits, labels, label_smoothing)

    def cross_entropy(dtype, label_smoothing):
        return nn.functional.cross_entropy(
            logits.to(dtype).flatten(0, 1), labels.flatten(), reduction="none", label_smoothing=label_smoothing
        ).view(2, 5)

    # Against float64: over half a million logits, float32 sums in another order differ by a few 1e-6 (and torch's
    # float32 gradient of the smoothing term, which sums -eps / vocab_size over the vocabulary, by several 1e-4).
    tolerance = {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(smoothed, cross_entropy(torch.float64, label_smoothing).float(), **tolerance)
    torch.testing.assert_close(plain, cross_entropy(torch.float64, 0.0).float(), **tolerance)
    assert smoothed.dtype == torch.float32 and not plain.requires_grad
    assert (smoothed[1, 3:] == 0).all() and (plain[1, 3:] == 0).all()

    weights = torch.rand(2, 5)  # any reduction: a weighted sum exercises every row's incoming gradient
    (gradient,) = torch.autograd.grad((smoothed * weights).sum(), logits)
    (expected_gradient,) = torch.autograd.grad((cross_entropy(torch.float64, label_smoothing) * weights).sum(), logits)
    assert gradient.dtype == dtype
    torch.testing.assert_close(gradient, expected_gradient)
    assert (gradient[1, 3:] == 0).all()


def test_label_smoothed_loss_gradient_passes_gradcheck_in_float64():
    labels = torch.tensor([[3, 0, 11], [-100, 7, 2]])
    logits = torch.randn(2, 3, 12, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: label_smoothed_cross_entropy(z, labels, 0.1)[0], logits)


@pytest.mark.parametrize(
    ("labels", "smoothing", "message"),
    [
        (
            torch.tensor([[1, 12]]),
            0.0,
            r"labels must be in \[0, 12\) \(vocab_size\) or -100 \(ignored\), got labels from 1 to 12",
        ),
        (torch.tensor([[-5, 1]]), 0.0, r"got labels from -5 to 1"),
        (
            torch.tensor([[1, 2, 3]]),
            0.0,
            r"labels have shape \(1, 3\), but the logits have shape \(1, 2, 12\): expected labels of shape \(1, 2\)\.",
        ),
        (torch.tensor([[1, 2]]), 1.0, r"label_smoothing must be in \[0, 1\), got 1.0"),
    ],
)
def test_label_smoothed_loss_refuses_bad_labels(labels, smoothing, message):
    with pytest.raises(ValueError, match=message):
        label_smoothed_cross_entropy(torch.randn(1, 2, 12), labels, smoothing)


@pytest.mark.parametrize(("device", "budget"), [("cpu", 2**21), ("meta", 2**26)])
def test_loss_reads_the_logits_in_row_chunks_as_large_as_its_memory_budget(device, budget):
    """The loss's float32 temporaries stay within a chunk of rows: 2^21 values (8 MiB, the CPU's cache) on the CPU,
    2^26 (256 MiB) on accelerators; every row once, in order, in as few chunks as the budget allows."""
    from vaswani.modeling.modeling_vaswani import VaswaniLabelSmoothedCrossEntropy

    for rows, vocab_size in ((10, 2**19 + 3), (5000, 37000), (3, 2**27)):
        logits = torch.empty(1, vocab_size, device=device).expand(rows, vocab_size)  # the shape, not the memory
        sizes = [len(range(rows)[chunk]) for chunk in VaswaniLabelSmoothedCrossEntropy.row_chunks(logits)]
        covered = [row for chunk in VaswaniLabelSmoothedCrossEntropy.row_chunks(logits) for row in range(rows)[chunk]]
        assert covered == list(range(rows))
        assert set(sizes[:-1]) <= {max(1, budget // vocab_size)} and 0 < sizes[-1] <= max(1, budget // vocab_size)


def test_label_smoothed_loss_of_an_empty_batch_is_empty():
    smoothed, plain = label_smoothed_cross_entropy(torch.randn(0, 12), torch.zeros(0, dtype=torch.long), 0.1)
    assert smoothed.shape == plain.shape == (0,)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("optional", ["attention_dropout", "activation_dropout"])
def test_the_optional_dropouts_drop_in_training_and_nowhere_in_evaluation(implementation, optional, source_batch):
    """config.attention_dropout and config.activation_dropout (0 in the paper): off in evaluation mode, as if absent;
    on in training mode."""
    input_ids, attention_mask = source_batch
    with torch.random.fork_rng():
        torch.manual_seed(0)
        plain = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", vocab_size=VOCAB_SIZE, dropout=0.0))
    config = VaswaniConfig.from_preset("tiny", vocab_size=VOCAB_SIZE, dropout=0.0, **{optional: 0.5})
    dropping = VaswaniForConditionalGeneration(config)
    dropping.load_state_dict(plain.state_dict())
    for model in (plain, dropping):
        model.set_attn_implementation(implementation)

    def logits(model, training):
        with torch.no_grad():
            return model.train(training)(input_ids, attention_mask, decoder_input_ids=input_ids).logits

    torch.testing.assert_close(logits(dropping, False), logits(plain, False))
    torch.testing.assert_close(logits(plain, True), logits(plain, False))  # nothing else drops (dropout is 0)
    assert (logits(dropping, True) - logits(plain, True)).abs().max() > 1e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_eager_attention_probabilities_are_float32s_rounded_once(dtype):
    """The softmax over half-precision scores runs in float32 and is rounded once to the scores' dtype."""
    from vaswani.modeling.modeling_vaswani import eager_attention_forward

    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(2, 4, 50, 16, generator=generator).to(dtype) for _ in range(3))
    module = nn.Module().eval()
    _, weights = eager_attention_forward(module, 4 * query, key, value, None, scaling=0.25)
    scores = torch.matmul(4 * query, key.transpose(2, 3)) * 0.25
    assert torch.equal(weights, torch.softmax(scores.float(), dim=-1).to(dtype))


@pytest.mark.parametrize("scheme", ["tensor2tensor", "fairseq", "bart"])
def test_init_schemes_draw_the_weights_their_sources_do(scheme):
    """config.init_scheme (configuration_vaswani.INIT_SCHEMES): the spread of every kind of weight, measured."""
    config = VaswaniConfig.from_preset("small", vocab_size=8000, init_scheme=scheme)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = VaswaniForConditionalGeneration(config)
    d = config.d_model
    glorot = (2 / (d + d)) ** 0.5  # the std of Glorot-uniform for a d x d matrix
    expected = {
        "tensor2tensor": {"embedding": d**-0.5, "q_proj": glorot, "out_proj": glorot, "fc1": (2 / (d + 4 * d)) ** 0.5},
        "fairseq": {"embedding": d**-0.5, "q_proj": glorot * 2**-0.5, "out_proj": glorot, "fc1": (2 / (5 * d)) ** 0.5},
        "bart": {"embedding": 0.02, "q_proj": 0.02, "out_proj": 0.02, "fc1": 0.02},
    }[scheme]
    layer = model.model.decoder.layers[1]
    found = {
        "embedding": model.model.shared.weight[1:],
        "q_proj": torch.cat(
            [layer.self_attn.q_proj.weight, layer.encoder_attn.k_proj.weight, layer.self_attn.v_proj.weight]
        ),
        "out_proj": layer.encoder_attn.out_proj.weight,
        "fc1": layer.feed_forward.fc1.weight,
    }
    for name, weight in found.items():
        assert weight.std().item() == pytest.approx(expected[name], rel=0.03), name
    assert layer.feed_forward.fc1.bias.abs().max() == 0
    padding_row = model.model.shared.weight[config.pad_token_id]
    assert (padding_row.abs().max() == 0) == (scheme != "tensor2tensor")


def assert_attention_projections_drawn_by(scheme: str, attention: nn.Module, d_model: int) -> None:
    """The distributions INIT_SCHEMES documents for one attention's projections: Glorot-uniform (bound sqrt(6 / (d +
    d))), the query, key and value at gain 1/sqrt(2) under "fairseq"; N(0, 0.02) under "bart"; zero biases."""
    glorot = (6 / (d_model + d_model)) ** 0.5
    input_bound = glorot * 2**-0.5 if scheme == "fairseq" else glorot
    bounds = {"q_proj": input_bound, "k_proj": input_bound, "v_proj": input_bound, "out_proj": glorot}
    for name, bound in bounds.items():
        projection = getattr(attention, name)
        weight, largest = projection.weight, projection.weight.abs().max().item()
        if scheme == "bart":
            assert weight.std().item() == pytest.approx(0.02, rel=0.05), name
            assert largest > 2.5 * 0.02, name  # a normal's tails, which a uniform of that spread (bound 0.035) lacks
        else:
            # The largest of d_model^2 uniform draws lies within 2% of the bound; torch's own default (bound
            # d_model^-0.5) or the other gain would not.
            assert 0.98 * bound < largest <= bound, name
            assert weight.std().item() == pytest.approx(bound / 3**0.5, rel=0.05), name
        assert projection.bias.abs().max() == 0, name


@pytest.mark.parametrize("scheme", ["tensor2tensor", "fairseq", "bart"])
def test_each_attention_draws_its_projections_as_its_init_scheme_says_new_and_loaded(scheme, tmp_path):
    """`_init_weights` draws the projections of every VaswaniAttention (encoder self-attention, decoder self- and
    encoder-decoder attention) by the module's type: in a new model, and for a checkpoint that lacks a layer."""
    config = VaswaniConfig.from_preset("tiny", vocab_size=VOCAB_SIZE, init_scheme=scheme, attention_bias=True)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = VaswaniForConditionalGeneration(config)
    attentions = [module for module in model.modules() if type(module).__name__ == "VaswaniAttention"]
    assert len(attentions) == 3 * 2  # 2 encoder layers with one attention, 2 decoder layers with two
    for attention in attentions:
        assert_attention_projections_drawn_by(scheme, attention, config.d_model)

    model.save_pretrained(tmp_path)
    with torch.random.fork_rng():
        deeper = VaswaniForConditionalGeneration.from_pretrained(tmp_path, encoder_layers=3, decoder_layers=3)
    new_attentions = [
        deeper.model.encoder.layers[2].self_attn,
        deeper.model.decoder.layers[2].self_attn,
        deeper.model.decoder.layers[2].encoder_attn,
    ]
    for attention in new_attentions:
        assert_attention_projections_drawn_by(scheme, attention, config.d_model)
    loaded = deeper.state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded[name], tensor), name


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_dropout_is_on_each_sublayer_output_and_embedding_sum_and_nowhere_else(
    implementation, source_batch, monkeypatch
):
    """Section 5.4: "We apply dropout to the output of each sub-layer, before it is added to the sub-layer input and
    normalized. In addition, we apply dropout to the sums of the embeddings and the positional encodings in both the
    encoder and decoder stacks." Nothing else drops by default: not the attention weights, not the feed-forward
    network's inner activations, nothing in evaluation mode."""
    input_ids, attention_mask = source_batch
    decoder_input_ids = torch.tensor([[1, 5, 9, 13, 17], [1, 6, 10, 14, 18]])
    config = dropout_config()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = VaswaniForConditionalGeneration(config).train()
    model.set_attn_implementation(implementation)

    dropped_where, expected, hooks = {}, [], []  # label -> the tensor section 5.4 drops there
    for stack in ("encoder", "decoder"):
        expected.append(f"{stack} embeddings + positions")
        for index, layer in enumerate(getattr(model.model, stack).layers):
            sublayers = {"self-attention": layer.self_attn.out_proj}
            if stack == "decoder":
                sublayers["encoder-decoder attention"] = layer.encoder_attn.out_proj
            sublayers["feed-forward"] = layer.feed_forward.fc2
            for name, module in sublayers.items():
                label = f"{stack} layer {index} {name} output"
                expected.append(label)
                hooks.append(
                    module.register_forward_hook(
                        lambda module, args, output, label=label: dropped_where.__setitem__(label, output)
                    )
                )
    with recorded_dropout(monkeypatch, FixedMasks()) as (calls, sdpa_dropouts):
        model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
        for hook in hooks:
            hook.remove()
        training_calls = len(calls)
        model.eval()(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    with torch.no_grad():
        for stack, ids, mask in (("encoder", input_ids, attention_mask), ("decoder", decoder_input_ids, None)):
            positions = model.model.encoder.embed_positions(positions_of(mask, ids.shape[1], 0, None), torch.float32)
            dropped_where[f"{stack} embeddings + positions"] = model.model.shared(ids) + positions

    def name_of(tensor):
        for label, output in dropped_where.items():
            if output.shape == tensor.shape and torch.equal(output, tensor):
                return label
        return f"another tensor of shape {tuple(tensor.shape)}"

    dropped = [(p, name_of(input)) for p, training, input in calls[:training_calls] if training and p > 0]
    assert [label for _, label in dropped] == expected
    assert {p for p, _ in dropped} == {config.dropout}
    assert not any(training and p > 0 for p, training, _ in calls[training_calls:]), "dropout in evaluation mode"
    assert not any(sdpa_dropouts), "dropout on the attention weights"


def test_dropout_where_torch_nn_transformer_drops_with_the_same_masks_gives_its_outputs_and_gradients(
    source_batch, monkeypatch
):
    """What is dropped is what is added to the residual stream: the same masks at the places nn.Transformer uses
    (the embedding sums, dropout1/2/3) give its outputs and gradients."""
    input_ids, attention_mask = source_batch
    decoder_input_ids = torch.tensor([[1, 5, 9, 13, 17], [1, 6, 10, 14, 18]])
    config = dropout_config()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = randomise_(VaswaniForConditionalGeneration(config)).train()
    reference_masks, our_masks = FixedMasks(), FixedMasks()
    reference = reference_for(model, FixedMaskDropout(reference_masks, config.dropout))
    with recorded_dropout(monkeypatch, our_masks):
        assert_same_outputs_and_gradients(model, reference, input_ids, attention_mask, decoder_input_ids)
    assert len(our_masks.inputs) == len(reference_masks.inputs) == 2 + 2 * 2 + 3 * 2


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_gradient_checkpointing_replays_the_dropout_masks(source_batch, use_reentrant):
    """With dropout on, the recomputed forward must draw the masks the first forward drew (torch.utils.checkpoint
    restores the RNG state): the same loss, and the same gradients.

    Bit-identical with transformers' default, non-reentrant checkpointing. Reentrant checkpointing runs each layer's
    backward on its own and hands back the gradient of its inputs, so that a tensor used in several places sums its
    gradients in another grouping: the encoder output (keys and values of every decoder layer) and the tied
    embedding (encoder input, decoder input, output projection). The encoder's gradients then differ by about one
    float32 rounding (8e-8 on gradients up to 0.7), the decoder's not at all; a mask drawn anew differs by 1e-2.
    """
    input_ids, attention_mask = source_batch
    labels = torch.tensor([[7, 8, 9, 2], [10, 11, 2, -100]])
    losses, gradients = [], []
    for checkpointing, seed in ((False, 1), (True, 1), (False, 2)):
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = VaswaniForConditionalGeneration(dropout_config()).train()
            if checkpointing:
                model.activation_checkpointing_enable({"use_reentrant": use_reentrant})
            torch.manual_seed(seed)
            loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
            loss.backward()
        losses.append(loss.detach())
        gradients.append({name: p.grad for name, p in model.named_parameters()})
    assert not torch.equal(losses[0], losses[2]), "dropout should be on: another seed, another loss"
    assert torch.equal(losses[1], losses[0])
    assert gradients[1].keys() == gradients[0].keys()
    tolerance = {"rtol": 1e-6, "atol": 1e-7} if use_reentrant else {"rtol": 0, "atol": 0}
    for name, gradient in gradients[0].items():
        torch.testing.assert_close(gradients[1][name], gradient, **tolerance, msg=lambda m: f"{name}: {m}")


def test_gradient_checkpointing_does_not_warn_about_a_cache_in_the_encoder(tiny_config, source_batch):
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging

    input_ids, attention_mask = source_batch
    model = VaswaniForConditionalGeneration(tiny_config).train()
    model.activation_checkpointing_enable()
    python_logging.Logger.warning_once.cache_clear()  # the library warns once per process: whichever test came first
    with CaptureLogger(logging.get_logger("transformers.modeling_layers")) as captured:
        model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids[:, :4]).loss.backward()
    assert "Caching is incompatible" not in captured.out


def test_preset_parameter_counts_match_the_paper():
    # Table 3: base 65M and big 213M parameters, with the shared 37000-token vocabulary of section 5.1.
    paper = {"base": (65e6, 0.05), "big": (213e6, 0.02)}
    for preset, (expected, tolerance) in paper.items():
        with torch.device("meta"):
            model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset(preset, vocab_size=37000))
        count = model.num_parameters()
        print(f"{preset}: {count / 1e6:.1f}M parameters (paper: {expected / 1e6:.0f}M)")
        assert abs(count - expected) / expected < tolerance


def test_bare_model_and_encoder_decoder_work_on_their_own(tiny_config, source_batch):
    input_ids, attention_mask = source_batch
    model = VaswaniModel(tiny_config).eval()
    with torch.no_grad():
        full = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :3])
        encoded = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
        decoded = model.get_decoder()(
            input_ids=input_ids[:, :3],
            encoder_hidden_states=encoded.last_hidden_state,
            encoder_attention_mask=attention_mask,
        )
    torch.testing.assert_close(full.encoder_last_hidden_state, encoded.last_hidden_state)
    torch.testing.assert_close(full.last_hidden_state, decoded.last_hidden_state)


def test_encoder_and_decoder_lookups_keep_pretrained_models_contract(tiny_model):
    """`get_encoder()` and `get_decoder()` give the stacks; `get_encoder(modality)` for a modality without an encoder
    gives the model itself, as `PreTrainedModel.get_encoder` does (transformers' exporters ask every model)."""
    assert tiny_model.get_encoder() is tiny_model.model.encoder
    assert tiny_model.get_decoder() is tiny_model.model.decoder
    for modality in ("image", "video", "audio"):
        assert tiny_model.get_encoder(modality=modality) is tiny_model
        assert tiny_model.model.get_encoder(modality=modality) is tiny_model.model


def test_output_attentions_and_hidden_states(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    tiny_model.set_attn_implementation("eager")
    with torch.no_grad():
        out = tiny_model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=input_ids[:, :4],
            output_attentions=True,
            output_hidden_states=True,
        )
    layers, heads = tiny_model.config.encoder_layers, tiny_model.config.encoder_attention_heads
    assert len(out.encoder_attentions) == layers and out.encoder_attentions[0].shape == (2, heads, 9, 9)
    assert len(out.decoder_attentions) == layers and out.decoder_attentions[0].shape == (2, heads, 4, 4)
    assert len(out.cross_attentions) == layers and out.cross_attentions[0].shape == (2, heads, 4, 9)
    assert len(out.encoder_hidden_states) == layers + 1 and len(out.decoder_hidden_states) == layers + 1
    # Padded source positions get no attention; future target positions get none either.
    assert out.encoder_attentions[0][1, :, :, 7:].abs().max() == 0
    assert torch.triu(out.decoder_attentions[0][0, 0], diagonal=1).abs().max() == 0


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({"input_ids": torch.tensor([[5, 100, 2]]), "decoder_input_ids": torch.tensor([[1]])}, "vocab_size"),
        ({"input_ids": torch.tensor([[5, -3, 2]]), "decoder_input_ids": torch.tensor([[1]])}, "vocab_size"),
        ({"input_ids": torch.tensor([[5, 6, 2]]), "decoder_input_ids": torch.tensor([[1, 100]])}, "vocab_size"),
        (
            {
                "input_ids": torch.tensor([[5, 6, 2]]),
                "attention_mask": torch.ones(1, 4),
                "decoder_input_ids": torch.tensor([[1]]),
            },
            r"attention_mask has shape \(1, 4\), but the sequences it masks have shape \(1, 3\) \(batch size, "
            r"sequence length\)\.$",
        ),
        (
            {
                "input_ids": torch.tensor([[5, 6, 2]]),
                "decoder_input_ids": torch.tensor([[1, 4]]),
                "decoder_attention_mask": torch.ones(2, 2),
            },
            "decoder_attention_mask has shape",
        ),
        ({"input_ids": torch.zeros(0, 5, dtype=torch.long), "decoder_input_ids": torch.tensor([[1]])}, "non-empty"),
        ({"input_ids": torch.zeros(1, 0, dtype=torch.long), "decoder_input_ids": torch.tensor([[1]])}, "non-empty"),
        (
            {"input_ids": torch.tensor([[5, 6, 2]]), "decoder_input_ids": torch.zeros(1, 0, dtype=torch.long)},
            "non-empty",
        ),
    ],
)
def test_bad_input_gets_a_clear_error(tiny_model, inputs, message):
    with pytest.raises(ValueError, match=message):
        tiny_model(**inputs)
