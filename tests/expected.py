"""Numbers printed by the seed notebooks (../shared/seeds) and the book, used as test data.

Each constant names its source. They are printed to 4 decimals, so tests compare with
`ATOL = 6e-5` (half a unit in the last printed place, plus float32 noise).
"""

from __future__ import annotations

import torch

ATOL = 6e-5

# --- seeds 000/001/002: "Your journey starts with one step", query x^2 = "journey" ---------------
SCORES_JOURNEY = torch.tensor([0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865])
SUM_NORMALISED_JOURNEY = torch.tensor([0.1455, 0.2278, 0.2249, 0.1285, 0.1077, 0.1656])
SOFTMAX_JOURNEY = torch.tensor([0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581])
CONTEXT_JOURNEY = torch.tensor([0.4419, 0.6515, 0.5683])
ATTN_SCORES = torch.tensor(
    [
        [0.9995, 0.9544, 0.9422, 0.4753, 0.4576, 0.6310],
        [0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865],
        [0.9422, 1.4754, 1.4570, 0.8296, 0.7154, 1.0605],
        [0.4753, 0.8434, 0.8296, 0.4937, 0.3474, 0.6565],
        [0.4576, 0.7070, 0.7154, 0.3474, 0.6654, 0.2935],
        [0.6310, 1.0865, 1.0605, 0.6565, 0.2935, 0.9450],
    ]
)
ATTN_WEIGHTS = torch.tensor(
    [
        [0.2098, 0.2006, 0.1981, 0.1242, 0.1220, 0.1452],
        [0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581],
        [0.1390, 0.2369, 0.2326, 0.1242, 0.1108, 0.1565],
        [0.1435, 0.2074, 0.2046, 0.1462, 0.1263, 0.1720],
        [0.1526, 0.1958, 0.1975, 0.1367, 0.1879, 0.1295],
        [0.1385, 0.2184, 0.2128, 0.1420, 0.0988, 0.1896],
    ]
)
CONTEXT_VECS = torch.tensor(
    [
        [0.4421, 0.5931, 0.5790],
        [0.4419, 0.6515, 0.5683],
        [0.4431, 0.6496, 0.5671],
        [0.4304, 0.6298, 0.5510],
        [0.4671, 0.5910, 0.5266],
        [0.4177, 0.6503, 0.5645],
    ]
)

# --- the book, ch. 3, on the same six 3-d inputs (d_in=3, d_out=2) --------------------------------
SA_V1_SEED123 = torch.tensor(
    [
        [0.2996, 0.8053],
        [0.3061, 0.8210],
        [0.3058, 0.8203],
        [0.2948, 0.7939],
        [0.2927, 0.7891],
        [0.2990, 0.8040],
    ]
)
SA_V2_SEED789 = torch.tensor(
    [
        [-0.0739, 0.0713],
        [-0.0748, 0.0703],
        [-0.0749, 0.0702],
        [-0.0760, 0.0685],
        [-0.0763, 0.0679],
        [-0.0754, 0.0693],
    ]
)
CAUSAL_SEED123 = torch.tensor(
    [
        [-0.4519, 0.2216],
        [-0.5874, 0.0058],
        [-0.6300, -0.0632],
        [-0.5675, -0.0843],
        [-0.5526, -0.0981],
        [-0.5299, -0.1081],
    ]
)
WRAPPER_SEED123 = torch.tensor(
    [
        [-0.4519, 0.2216, 0.4772, 0.1063],
        [-0.5874, 0.0058, 0.5891, 0.3257],
        [-0.6300, -0.0632, 0.6202, 0.3860],
        [-0.5675, -0.0843, 0.5478, 0.3589],
        [-0.5526, -0.0981, 0.5321, 0.3428],
        [-0.5299, -0.1081, 0.5077, 0.3493],
    ]
)
MHA_SEED123 = torch.tensor(
    [
        [0.3190, 0.4858],
        [0.2943, 0.3897],
        [0.2856, 0.3593],
        [0.2693, 0.3873],
        [0.2639, 0.3928],
        [0.2575, 0.4028],
    ]
)

# --- seed 003: GPT-2 token ids of "I HAD always thought Jack Gisburn rather a cheap" (The Verdict,
# E. Wharton, 1908), embedded by nn.Embedding(50257, 5) created right after torch.manual_seed(123)
VERDICT_IDS = [40, 367, 2885, 1464, 1807, 3619, 402, 271, 10899, 2138, 257, 7026]
VERDICT_EMBEDDINGS_6 = torch.tensor(
    [
        [1.1721, -0.4372, -0.4053, 0.7086, 0.9533],
        [2.0478, 1.8619, -1.4766, -1.4558, -0.5568],
        [0.4197, 0.6117, -0.2094, 0.9823, 0.9884],
        [1.1062, -0.5667, -1.8651, 0.3535, 2.5554],
        [-0.3660, 1.7561, 0.8017, 0.9675, 1.7021],
        [-1.1976, -1.5655, -1.2657, -0.3559, -0.7629],
    ]
)
# CausalAttention(5, 5, 6, 0.0) after torch.manual_seed(123), on the first six embeddings
VERDICT_CAUSAL = torch.tensor(
    [
        [0.1682, -0.8474, -0.2907, -0.0228, 0.3905],
        [0.1450, -1.4204, 1.1329, 0.2614, 1.5192],
        [0.1730, -1.1179, 0.5192, 0.0413, 0.9298],
        [0.0618, -1.4199, 0.4697, 0.2299, 1.0985],
        [0.1228, -1.2190, 0.3619, 0.0986, 0.8890],
        [0.0015, -0.8100, 0.2812, 0.1129, 0.5850],
    ]
)
# SelfAttention_v2(5, 5) after torch.manual_seed(789), on the first six embeddings
VERDICT_SA_V2 = torch.tensor(
    [
        [0.0805, -0.3446, -0.4164, 0.3569, 0.2441],
        [0.2634, -0.3499, -0.3964, 0.5085, 0.3916],
        [0.1661, -0.3426, -0.4020, 0.4278, 0.3110],
        [0.0424, -0.4120, -0.3911, 0.3255, 0.2813],
        [0.2608, -0.3202, -0.3885, 0.5088, 0.3700],
        [0.1498, -0.3763, -0.2494, 0.3326, 0.3329],
    ]
)
# MultiHeadAttention(5, 2, 6, 0.0, num_heads=2) after torch.manual_seed(123), on the batch
# (embeddings of ids[:6], embeddings of ids[6:12])
VERDICT_MHA = torch.tensor(
    [
        [
            [0.8227, 0.0246],
            [0.6647, -0.0818],
            [0.6566, -0.1010],
            [0.5320, -0.1808],
            [0.4877, -0.2188],
            [0.4077, -0.2375],
        ],
        [
            [0.1708, -0.4087],
            [0.6776, -0.0564],
            [0.5588, -0.1505],
            [0.1270, -0.4430],
            [0.2802, -0.3071],
            [0.2610, -0.3173],
        ],
    ]
)

# The book, chapter 4 (sections 4.5 and 4.6): "Every effort moves you" and "Every day holds a"
# as token ids, and GPTModel(GPT_CONFIG_124M)'s first three logits of each row's first token
# (training mode, fresh from the constructor under torch.manual_seed(123)).
BOOK_BATCH = torch.tensor([[6109, 3626, 6100, 345], [6109, 1110, 6622, 257]])
BOOK_LOGITS_FIRST = torch.tensor([[0.3613, 0.4222, -0.0711], [-0.2564, 0.0900, 0.0335]])
