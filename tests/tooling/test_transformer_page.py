"""The transformer-block chapter (docs/transformer.md): the book's chapter-4 numbers it prints.

Each test computes, with the package's classes, a number the book (Raschka, *Build a Large
Language Model (From Scratch)*, chapter 4) prints, and compares it with the book's value:
parameter counts exactly, floats to a tolerance that float32 on any CPU meets.
"""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch
from torch import Tensor, nn
from torch.testing import assert_close

from attention.derivation.text import text_to_token_ids
from attention.model.gpt import (
    GELU,
    GPT_CONFIG_124M,
    FeedForward,
    GPTModel,
    LayerNorm,
    TransformerBlock,
)
from tests.expected import BOOK_BATCH, BOOK_LOGITS_FIRST

# Section 4.2: torch.manual_seed(123); torch.randn(2, 5) through Linear(5, 6) and ReLU.
BOOK_RELU_OUT = torch.tensor(
    [[0.2260, 0.3470, 0.0000, 0.2216, 0.0000, 0.0000],
     [0.2133, 0.2394, 0.0000, 0.5198, 0.3297, 0.0000]]
)  # fmt: skip
BOOK_RELU_MEAN = torch.tensor([0.1324, 0.2170])
BOOK_RELU_VAR = torch.tensor([0.0231, 0.0398])  # unbiased, as the book prints it
BOOK_LN_VAR = torch.tensor([0.9995, 0.9997])  # LayerNorm(emb_dim=6) of it (the notebook)
PRINTED = 6e-5  # half a unit in the 4th decimal the book prints, plus float32 noise

# Section 4.4: ExampleDeepNeuralNetwork([3, 3, 3, 3, 3, 1]), seed 123, input [[1., 0., -1.]]:
# mean absolute gradient of layers.{i}.0.weight, without and with shortcut connections.
BOOK_GRADIENTS = {
    False: [0.00020173587836325169, 0.00012011159560643137, 0.0007152039906941354,
            0.0013988736318424344, 0.005049645435065031],
    True: [0.22169792652130127, 0.20694106817245483, 0.32896995544433594,
           0.2665732204914093, 1.3258540630340576],
}  # fmt: skip

# Section 4.6: the model's parameter counts, without and with the output layer tied.
BOOK_PARAMS = 163_009_536
BOOK_PARAMS_TIED = 124_412_160


class ExampleDeepNeuralNetwork(nn.Module):
    """The book's toy of section 4.4 (on the package's GELU), as the page defines it."""

    def __init__(self, layer_sizes: list[int], use_shortcut: bool) -> None:
        super().__init__()
        self.use_shortcut = use_shortcut
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(d_in, d_out), GELU()) for d_in, d_out in pairwise(layer_sizes)
        )

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            layer_output = layer(x)
            if self.use_shortcut and x.shape == layer_output.shape:
                x = x + layer_output
            else:
                x = layer_output
        return x


@pytest.fixture(scope="module")
def book_model() -> GPTModel:
    torch.manual_seed(123)
    return GPTModel(GPT_CONFIG_124M)


def test_layer_norm_gives_the_books_means_and_variances() -> None:
    torch.manual_seed(123)
    batch_example = torch.randn(2, 5)
    layer = nn.Sequential(nn.Linear(5, 6), nn.ReLU())
    with torch.no_grad():
        out = layer(batch_example)
        assert_close(out, BOOK_RELU_OUT, atol=PRINTED, rtol=0)
        assert_close(out.mean(dim=-1), BOOK_RELU_MEAN, atol=PRINTED, rtol=0)
        assert_close(out.var(dim=-1), BOOK_RELU_VAR, atol=PRINTED, rtol=0)
        ln = LayerNorm(emb_dim=6)
        out_ln = ln(out)
        assert out_ln.mean(dim=-1).abs().max() < 1e-6
        var_ln = out_ln.var(dim=-1, unbiased=False)
        assert_close(var_ln, BOOK_LN_VAR, atol=PRINTED, rtol=0)
        raw_ln = LayerNorm(emb_dim=5)(batch_example)  # the printed book's: variance 1.0000
        assert raw_ln.mean(dim=-1).abs().max() < 1e-6
        assert_close(raw_ln.var(dim=-1, unbiased=False), torch.ones(2), atol=PRINTED, rtol=0)
        # the page's explanation: eps under the root, next to the rows' small variance
        sigma2 = out.var(dim=-1, unbiased=False)
        assert_close(var_ln, sigma2 / (sigma2 + ln.eps), atol=1e-6, rtol=0)


def test_gelu_against_relu_on_the_books_grid() -> None:
    x = torch.linspace(-3, 3, 100)
    y_gelu, y_relu = GELU()(x), nn.ReLU()(x)
    assert (y_gelu <= y_relu + 1e-6).all()  # below ReLU everywhere ...
    assert torch.isclose(y_gelu[-1], y_relu[-1], atol=0.01)  # ... and close at x = 3
    assert -0.171 < float(y_gelu.min()) < -0.169  # negative below 0, down to about -0.17
    assert_close(GELU()(torch.tensor([-1.0, 1.0])), torch.tensor([-0.1588, 0.8412]),
                 atol=PRINTED, rtol=0)  # fmt: skip


def test_feed_forward_keeps_the_books_shape_and_acts_on_each_token_alone() -> None:
    torch.manual_seed(123)
    ffn = FeedForward(GPT_CONFIG_124M)
    x = torch.rand(2, 3, 768)
    with torch.no_grad():
        out = ffn(x)
        assert out.shape == (2, 3, 768)
        assert ffn.layers[0](x).shape == (2, 3, 4 * 768)
        assert_close(ffn(x[:, 1:2]), out[:, 1:2])
    assert sum(p.numel() for p in ffn.parameters()) == 4_722_432


@pytest.mark.parametrize("use_shortcut", [False, True])
def test_shortcuts_give_the_books_gradient_means(use_shortcut: bool) -> None:
    torch.manual_seed(123)
    model = ExampleDeepNeuralNetwork([3, 3, 3, 3, 3, 1], use_shortcut)
    output = model(torch.tensor([[1.0, 0.0, -1.0]]))
    nn.functional.mse_loss(output, torch.tensor([[0.0]])).backward()
    means = [
        float(p.grad.abs().mean())
        for name, p in model.named_parameters()
        if "weight" in name and p.grad is not None
    ]
    assert means == pytest.approx(BOOK_GRADIENTS[use_shortcut], rel=1e-4)


def test_transformer_block_keeps_the_books_shape() -> None:
    torch.manual_seed(123)
    x = torch.rand(2, 4, 768)
    block = TransformerBlock(GPT_CONFIG_124M)
    with torch.no_grad():
        assert block(x).shape == (2, 4, 768)  # training mode, dropout on, as in the book
        block.eval()  # the page's equations, one a line, against the forward
        x_mid = x + block.att(block.norm1(x))
        assert_close(x_mid + block.ff(block.norm2(x_mid)), block(x))
    counts = {name: sum(p.numel() for p in getattr(block, name).parameters())
              for name in ("att", "ff")}  # fmt: skip
    assert counts == {"att": 4 * 768 * 768 + 768, "ff": 4_722_432}


@pytest.mark.slow(seconds=3)
def test_the_books_model_its_parameters_and_its_logits(book_model: GPTModel) -> None:
    total = sum(p.numel() for p in book_model.parameters())
    assert total == BOOK_PARAMS
    assert total - sum(p.numel() for p in book_model.out_head.parameters()) == BOOK_PARAMS_TIED
    texts = ["Every effort moves you", "Every day holds a"]
    batch = torch.cat([text_to_token_ids(text) for text in texts])
    assert torch.equal(batch, BOOK_BATCH)
    torch.manual_seed(123)
    model = GPTModel(GPT_CONFIG_124M)  # fresh under the seed: the book's dropout masks too
    with torch.no_grad():
        logits = model(batch)
    assert logits.shape == (2, 4, 50257)
    assert_close(logits[:, 0, :3], BOOK_LOGITS_FIRST, atol=PRINTED, rtol=0)


@pytest.mark.slow(seconds=2)
def test_the_residual_stream_is_the_embeddings_plus_every_branchs_write(
    book_model: GPTModel,
) -> None:
    """The page's decomposition: h_L = h_0 + sum of the writes, logits = LN_f(h_L) W_out^T."""
    book_model.eval()
    entering: list[Tensor] = []
    between: list[Tensor] = []
    leaving: list[Tensor] = []

    def record_block(module: nn.Module, args: tuple[Tensor, ...], output: Tensor) -> None:
        entering.append(args[0])
        leaving.append(output)

    def record_norm2(module: nn.Module, args: tuple[Tensor, ...], output: Tensor) -> None:
        between.append(args[0])

    hooks = []
    for block in book_model.trf_blocks:
        assert isinstance(block, TransformerBlock)
        hooks.append(block.register_forward_hook(record_block))
        hooks.append(block.norm2.register_forward_hook(record_norm2))
    idx = text_to_token_ids("Every effort moves you")
    try:
        with torch.no_grad():
            logits = book_model(idx)
    finally:
        for hook in hooks:
            hook.remove()
    assert len(entering) == len(between) == len(leaving) == 12
    writes = [m - e for e, m in zip(entering, between, strict=True)]
    writes += [o - m for m, o in zip(between, leaving, strict=True)]
    assert_close(leaving[-1], entering[0] + sum(writes), atol=1e-4, rtol=0)
    assert_close(logits, book_model.out_head(book_model.final_norm(leaving[-1])))
    # the embeddings: token + position vectors, 768 standard-normal features each
    assert 35 < float(entering[0].norm(dim=-1).mean()) < 44
