r"""A top-$k$ mixture of experts: the feed-forward of Mixtral, Qwen3-MoE and Qwen3-Next.

A router scores the $E$ experts for each token, the $k$ best of them run on it, and their
outputs are added with the router's weights; a shared expert, where the model has one, runs
on every token:

$$
\begin{aligned}
p &= \operatorname{softmax}(W_r\, x) \in \mathbb{R}^{E}, \\
S &= \text{the indices of the } k \text{ largest } p_e, \\
w_e &= p_e \quad \text{or, with } \texttt{normalize}, \quad
      w_e = p_e \big/ \textstyle\sum_{e' \in S} p_{e'}, \\
E_e(x) &= W_{d,e}\, (\operatorname{act}(W_{g,e}\, x) \odot W_{u,e}\, x), \\
y &= \textstyle\sum_{e \in S} w_e\, E_e(x)
     \;+\; \sigma(w_s \cdot x)\, E_{\text{shared}}(x) .
\end{aligned}
$$

Only the chosen experts run, each on the tokens that chose it: a token costs $k$ experts'
work, not $E$. The weights are kept as transformers keeps them (`gate.weight` `(E, D)`,
`experts.gate_up_proj` `(E, 2H, D)`, `experts.down_proj` `(E, D, H)`, `shared_expert`,
`shared_expert_gate`), so a decoder layer's `mlp` state dict loads as it is.

Examples:
    >>> _ = torch.manual_seed(0)
    >>> moe = MixtureOfExperts(16, 32, num_experts=8, top_k=2)
    >>> moe(torch.randn(2, 5, 16)).shape  # (batch, num_tokens, emb_dim)
    torch.Size([2, 5, 16])
    >>> probs, chosen = moe.route(torch.randn(3, 16))  # each token's 2 experts
    >>> chosen.shape, bool(torch.allclose(probs.sum(-1), torch.ones(3)))
    (torch.Size([3, 2]), True)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.checks import check_flag, check_input, check_size

__all__ = ["Experts", "MixtureOfExperts"]


class Experts(nn.Module):
    """$E$ gated feed-forwards in two stacked weights: `gate_up_proj` `(E, 2H, D)` (each
    expert's $W_g$ over its $W_u$) and `down_proj` `(E, D, H)`."""

    def __init__(
        self, emb_dim: int, hidden_dim: int, num_experts: int, act: Callable[[Tensor], Tensor]
    ) -> None:
        super().__init__()
        self.act = act
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * hidden_dim, emb_dim))
        self.down_proj = nn.Parameter(torch.empty(num_experts, emb_dim, hidden_dim))
        for weight in (self.gate_up_proj, self.down_proj):
            nn.init.normal_(weight, std=weight.shape[-1] ** -0.5)

    def extra_repr(self) -> str:
        num_experts, emb_dim, hidden_dim = self.down_proj.shape
        return f"{num_experts} x ({emb_dim} -> {hidden_dim} -> {emb_dim})"

    def run(self, expert: int, x: Tensor) -> Tensor:
        """Expert `expert` on the tokens `x` `(n, D)` -> `(n, D)`."""
        gate, up = F.linear(x, self.gate_up_proj[expert]).chunk(2, dim=-1)  # (n, H) each
        out: Tensor = F.linear(self.act(gate) * up, self.down_proj[expert])  # (n, D)
        return out


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
    ) -> None:
        super().__init__()
        self.emb_dim, self.num_experts = check_size("emb_dim", emb_dim), check_size(
            "num_experts", num_experts)  # fmt: skip
        self.top_k = check_size("top_k", top_k)
        if top_k > num_experts:
            raise ValueError(f"top_k must be at most num_experts={num_experts}, got {top_k}")
        self.normalize = check_flag("normalize", normalize)
        if check_flag("shared_gate", shared_gate) and shared_expert is None:
            raise ValueError("shared_gate=True needs a shared_expert to gate")
        self.gate = nn.Linear(emb_dim, num_experts, bias=False)  # W_r: the router
        self.experts = Experts(emb_dim, check_size("hidden_dim", hidden_dim), num_experts, act)
        self.shared_expert = shared_expert
        self.shared_expert_gate = nn.Linear(emb_dim, 1, bias=False) if shared_gate else None

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Tokens `x` `(n, D)` -> each one's `top_k` experts' weights `w` and indices, `(n, k)`."""
        probs = torch.softmax(self.gate(x), dim=-1)  # p = softmax(W_r x)      (n, E)
        weights, chosen = probs.topk(self.top_k, dim=-1)  # the k largest     (n, k)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, chosen

    def forward(self, x: Tensor) -> Tensor:
        """`(b, T, emb_dim)` -> `(b, T, emb_dim)`."""
        check_input(x, self.emb_dim, batched=True, like=self.gate.weight)
        flat = x.reshape(-1, self.emb_dim)  # (n, D), n = b T
        weights, chosen = self.route(flat)  # (n, k) each
        out = torch.zeros_like(flat)
        for expert in chosen.unique().tolist():  # only the experts some token chose run
            rows, slot = (chosen == expert).nonzero(as_tuple=True)  # its tokens, their slot
            routed = self.experts.run(expert, flat[rows]) * weights[rows, slot, None]
            out = out.index_add(0, rows, routed)  # y += w_e E_e(x)
        if self.shared_expert is not None:
            shared: Tensor = self.shared_expert(flat)  # (n, D), every token
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(flat)) * shared
            out = out + shared
        return out.view(x.shape)

    def extra_repr(self) -> str:
        shared = "" if self.shared_expert is None else ", a shared expert"
        gated = "" if self.shared_expert_gate is None else " (gated)"
        return f"{self.num_experts} experts, top_k={self.top_k}, normalize={self.normalize}" + (
            shared + gated)  # fmt: skip
