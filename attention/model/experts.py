r"""A top-$k$ mixture of experts: the feed-forward of Mixtral, Qwen3-MoE, Qwen3-Next,
DeepSeek-V3 and Llama 4.

A router scores the $E$ experts for each token, the $k$ best of them run on it, and their
outputs are added with the router's weights; a shared expert, where the model has one, runs
on every token:

$$
\begin{aligned}
s &= \operatorname{softmax}(W_r\, x) \in \mathbb{R}^{E}, \\
S &= \operatorname{top}_k(s + b), \\
w_e &= \lambda\, s_e \big/ Z, \quad e \in S, \\
E_e(x) &= W_{d,e}\, (\operatorname{act}(W_{g,e}\, x) \odot W_{u,e}\, x), \\
y &= \textstyle\sum_{e \in S} w_e\, E_e(x) + g\, E_{\text{sh}}(x) .
\end{aligned}
$$

Mixtral, Qwen and OLMoE score with the softmax; DeepSeek-V3 with $s = \sigma(W_r\, x)$, and
adds a learned bias $b$ to the scores for choosing only ($b = 0$ elsewhere). $Z$ is
$\sum_{e' \in S} s_{e'}$ with `normalize` (Mixtral; Qwen's `norm_topk_prob`), else 1;
$\lambda$ is DeepSeek-V3's `routed_scaling_factor`, else 1. The shared expert
$E_{\text{sh}}$, where the model has one, runs on every token, with the gate
$g = \sigma(w_s \cdot x)$ in Qwen and $g = 1$ in DeepSeek-V3 and Llama 4. In Llama 4
(`scale_input`) the routed sum is $\sum_{e \in S} E_e(w_e\, x)$, with $w_e = \sigma(\ell_e)$
of its logit: the weight scales what the expert reads. DeepSeek-V3 also limits each token's
experts to `topk_group` of `groups` equal groups of experts, each group scored by the sum of
its two best $s_e + b_e$.

Only the chosen experts run, each on the tokens that chose it: a token costs $k$ experts'
work, not $E$. The weights are kept as transformers keeps them (`gate.weight` `(E, D)`,
`experts.gate_up_proj` `(E, 2H, D)`, `experts.down_proj` `(E, D, H)`, `shared_expert`,
`shared_expert_gate`), so a decoder layer's `mlp` state dict loads as it is (Llama 4's
experts are stored transposed, and `from_hf` transposes them).

Examples:
    >>> _ = torch.manual_seed(0)
    >>> moe = MixtureOfExperts(16, 32, num_experts=8, top_k=2)
    >>> moe(torch.randn(2, 5, 16)).shape  # (batch, num_tokens, emb_dim)
    torch.Size([2, 5, 16])
    >>> weights, chosen = moe.route(torch.randn(3, 16))  # each token's 2 experts
    >>> chosen.shape, bool(torch.allclose(weights.sum(-1), torch.ones(3)))  # normalised
    (torch.Size([3, 2]), True)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.checks import check_flag, check_input, check_positive, check_size

__all__ = ["SCORINGS", "Experts", "MixtureOfExperts", "Router"]

SCORINGS = ("softmax", "sigmoid")
"""How a router turns its logits into scores."""


class Experts(nn.Module):
    """$E$ gated feed-forwards in two stacked weights: `gate_up_proj` `(E, 2H, D)` (each
    expert's $W_g$ over its $W_u$) and `down_proj` `(E, D, H)`."""

    def __init__(
        self, emb_dim: int, hidden_dim: int, num_experts: int, act: Callable[[Tensor], Tensor]
    ) -> None:
        super().__init__()
        self.act = act
        emb_dim, hidden_dim = check_size("emb_dim", emb_dim), check_size("hidden_dim", hidden_dim)
        num_experts = check_size("num_experts", num_experts)
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * hidden_dim, emb_dim))
        self.down_proj = nn.Parameter(torch.empty(num_experts, emb_dim, hidden_dim))
        for weight in (self.gate_up_proj, self.down_proj):
            nn.init.normal_(weight, std=weight.shape[-1] ** -0.5)

    def extra_repr(self) -> str:
        num_experts, emb_dim, hidden_dim = self.down_proj.shape
        return f"{num_experts} x ({emb_dim} -> {hidden_dim} -> {emb_dim})"

    def run(self, expert: int, x: Tensor) -> Tensor:
        """Expert `expert` on the tokens `x` `(n, D)` -> `(n, D)`."""
        if not 0 <= expert < self.down_proj.shape[0]:
            raise ValueError(f"expert must be in 0 .. {self.down_proj.shape[0] - 1}, got {expert}")
        gate, up = F.linear(x, self.gate_up_proj[expert]).chunk(2, dim=-1)  # (n, H) each
        out: Tensor = F.linear(self.act(gate) * up, self.down_proj[expert])  # (n, D)
        return out


class Router(nn.Module):
    """Each token's `top_k` experts and their weights $w$ (the module's first three lines).

    Args:
        emb_dim: $D$.
        num_experts: $E$.
        top_k: experts per token.
        scoring: `"softmax"` or `"sigmoid"` of the logits $W_r x$.
        normalize: divide the chosen scores by their sum.
        groups: equal groups of experts (DeepSeek-V3's `n_group`); 1: none.
        topk_group: the groups a token may choose from.
        scale: $\\lambda$, multiplies the weights (DeepSeek-V3's `routed_scaling_factor`).
        choice_bias: a bias $b$ added to the scores for choosing only
            (`e_score_correction_bias`, a buffer: DeepSeek-V3 sets it outside the gradient).
    """

    def __init__(
        self,
        emb_dim: int,
        num_experts: int,
        top_k: int,
        *,
        scoring: str = "softmax",
        normalize: bool = True,
        groups: int = 1,
        topk_group: int = 1,
        scale: float = 1.0,
        choice_bias: bool = False,
    ) -> None:
        super().__init__()
        self.num_experts = check_size("num_experts", num_experts)
        self.top_k = check_size("top_k", top_k)
        if scoring not in SCORINGS:
            raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
        self.groups = check_size("groups", groups)
        self.topk_group = check_size("topk_group", topk_group)
        if num_experts % groups or topk_group > groups:
            raise ValueError(
                f"groups must divide num_experts={num_experts} and topk_group be at most "
                f"groups, got groups={groups}, topk_group={topk_group}"
            )
        if top_k > num_experts // groups * topk_group:
            raise ValueError(
                f"top_k must be at most num_experts={num_experts} (of the "
                f"groups a token keeps: {num_experts // groups * topk_group}), "
                f"got {top_k}"
            )
        self.scoring, self.normalize = scoring, check_flag("normalize", normalize)
        self.scale = check_positive("scale", scale)
        self.weight = nn.Parameter(torch.empty(num_experts, check_size("emb_dim", emb_dim)))
        nn.init.normal_(self.weight, std=emb_dim**-0.5)
        self.e_score_correction_bias: Tensor | None
        self.register_buffer(
            "e_score_correction_bias",
            torch.zeros(num_experts) if check_flag("choice_bias", choice_bias) else None,
        )

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Tokens `x` `(n, D)` -> their experts' weights $w$ (in `x`'s dtype) and indices,
        `(n, top_k)` each. Scored in float32 at least, as transformers does: a choice between
        close scores does not hang on bfloat16's rounding."""
        check_input(x, self.weight.shape[1], batched=False, like=self.weight)
        if x.ndim != 2:
            raise ValueError(
                f"x must be (num_tokens, emb_dim={self.weight.shape[1]}), got {tuple(x.shape)}"
            )
        wide = torch.promote_types(x.dtype, torch.float32)
        logits = F.linear(x.to(wide), self.weight.to(wide))  # W_r x            (n, E)
        scores = logits.softmax(-1) if self.scoring == "softmax" else logits.sigmoid()
        bias = self.e_score_correction_bias
        choice = scores if bias is None else scores + bias.to(wide)  # s + b: for choosing only
        if self.groups > 1:  # keep the topk_group groups whose two best scores sum highest
            grouped = choice.unflatten(-1, (self.groups, -1))  # (n, groups, E / groups)
            best = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(-1)
            kept = torch.zeros_like(best, dtype=torch.bool).scatter(
                -1, best.topk(self.topk_group, dim=-1).indices, True
            )  # (n, groups)
            choice = grouped.masked_fill(~kept[..., None], -math.inf).flatten(-2)
        chosen = choice.topk(self.top_k, dim=-1).indices  # S                   (n, k)
        weights = scores.gather(-1, chosen)  # s_e, e in S
        if self.normalize:  # + 1e-20: chosen sigmoids that all underflow give 0, not 0 / 0
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return (weights * self.scale).to(x.dtype), chosen

    def extra_repr(self) -> str:
        groups = f", {self.topk_group} of {self.groups} groups" if self.groups > 1 else ""
        return (
            f"{self.num_experts} experts, top_k={self.top_k}, {self.scoring}, "
            f"normalize={self.normalize}{groups}"
        )


class MixtureOfExperts(nn.Module):
    """A top-`top_k` mixture of `num_experts` gated feed-forwards (the module's equations).

    Args:
        emb_dim: $D$.
        hidden_dim: each expert's width $H$.
        num_experts: $E$.
        top_k: experts per token, at most `num_experts`.
        act: the gate's activation (SiLU: SwiGLU experts).
        normalize: divide the chosen experts' weights by their sum (Mixtral; Qwen's
            `norm_topk_prob`).
        shared_expert: a feed-forward that runs on every token (Qwen3-Next's), or None.
        shared_gate: scale the shared expert's output by $\\sigma(w_s \\cdot x)$.
        scale_input: the weight scales the expert's input, $E_e(w_e x)$ (Llama 4), not its
            output.
        **routing: the rest of [`Router`][attention.model.experts.Router]'s settings
            (`scoring`, `groups`, `topk_group`, `scale`, `choice_bias`).

    Raises:
        TypeError: a size that is not an int, a switch that is not a bool.
        ValueError: a size below 1, `top_k` above `num_experts`, or `shared_gate` without a
            shared expert.
    """

    def __init__(
        self,
        emb_dim: int,
        hidden_dim: int,
        num_experts: int,
        top_k: int,
        *,
        act: Callable[[Tensor], Tensor] = F.silu,
        normalize: bool = True,
        shared_expert: nn.Module | None = None,
        shared_gate: bool = False,
        scale_input: bool = False,
        **routing: Any,
    ) -> None:
        super().__init__()
        self.emb_dim, self.num_experts = check_size("emb_dim", emb_dim), num_experts
        self.top_k = check_size("top_k", top_k)
        if check_flag("shared_gate", shared_gate) and shared_expert is None:
            raise ValueError("shared_gate=True needs a shared_expert to gate")
        self.gate = Router(emb_dim, num_experts, top_k, normalize=normalize, **routing)
        self.scale_input = check_flag("scale_input", scale_input)
        self.experts = Experts(emb_dim, check_size("hidden_dim", hidden_dim), num_experts, act)
        self.shared_expert = _check_shared(shared_expert, emb_dim)
        self.shared_expert_gate = nn.Linear(emb_dim, 1, bias=False) if shared_gate else None

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Tokens `x` `(n, D)` -> each one's `top_k` experts' weights $w$ and indices, `(n, k)`.

        Raises:
            TypeError, ValueError: `x` not a floating `(n, emb_dim)` tensor of the router's
                dtype and device.
        """
        weights: Tensor
        chosen: Tensor
        weights, chosen = self.gate(x)
        return weights, chosen

    def forward(self, x: Tensor) -> Tensor:
        """`(b, T, emb_dim)` -> `(b, T, emb_dim)`."""
        check_input(x, self.emb_dim, batched=True, like=self.gate.weight)
        flat = x.reshape(-1, self.emb_dim)  # (n, D), n = b T
        weights, chosen = self.route(flat)  # (n, k) each
        out = torch.zeros_like(flat)
        for expert in chosen.unique().tolist():  # only the experts some token chose run
            rows, slot = (chosen == expert).nonzero(as_tuple=True)  # its tokens, their slot
            w = weights[rows, slot, None]  # (m, 1)
            routed = (
                self.experts.run(expert, flat[rows] * w)
                if self.scale_input  # E_e(w x)
                else self.experts.run(expert, flat[rows]) * w
            )  # w E_e(x)
            out = out.index_add(0, rows, routed)  # y += w_e E_e(x)
        if self.shared_expert is not None:
            shared: Tensor = self.shared_expert(flat)  # (n, D), every token
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(flat)) * shared
            out = out + shared
        return out.view(x.shape)

    def extra_repr(self) -> str:
        """Shown by `print(module)`: what the router and experts (printed below) do not say."""
        shared = "" if self.shared_expert is None else ", a shared expert"
        gated = "" if self.shared_expert_gate is None else " (gated)"
        scaled = ", the weights scale the inputs" if self.scale_input else ""
        return f"top_k={self.top_k} of {self.num_experts} experts" + shared + gated + scaled


def _check_shared(expert: nn.Module | None, emb_dim: int) -> nn.Module | None:
    """`expert` unless it is not a module mapping `(n, emb_dim)` to `(n, emb_dim)` (run once
    on a token of zeros, in its parameters' dtype)."""
    if expert is None:
        return None
    if not isinstance(expert, nn.Module):
        raise TypeError(f"shared_expert must be an nn.Module or None, got {type(expert).__name__}")
    like = next(expert.parameters(), torch.empty(0))
    got: object
    try:
        with torch.no_grad():
            got = tuple(expert(like.new_zeros(1, emb_dim)).shape)
    except (RuntimeError, ValueError, TypeError) as error:
        got = f"an error: {error}"
    if got != (1, emb_dim):
        raise ValueError(
            f"shared_expert must map (n, emb_dim={emb_dim}) to (n, {emb_dim}); on "
            f"(1, {emb_dim}) it gave {got}"
        )
    return expert
