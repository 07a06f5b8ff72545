"""docs/model.md's GPT (nanoGPT's GPT with bias=True) as a PyTorch module (dropout 0 unless asked):
the module scripts/compare_with_pytorch.py trains beside `bigbatch train --model gpt` and
bench/pytorch_step.py times. The attention is written out as nanoGPT's manual path
(softmax(q k^T / sqrt(D)) under the causal mask, then @ v): Debian 12's PyTorch 1.13 has no
F.scaled_dot_product_attention, which computes the same function.
"""
import math

import torch
from torch import nn


class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads, dropout):
        super().__init__()
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.heads = heads
        self.attn_dropout, self.resid_dropout = nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        probabilities = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        y = (self.attn_dropout(probabilities) @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class GptMlp(nn.Module):
    def __init__(self, width, dropout):
        super().__init__()
        self.c_fc = nn.Linear(width, 4 * width)
        self.c_proj = nn.Linear(4 * width, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(nn.functional.gelu(self.c_fc(x), approximate="tanh")))


class GptBlock(nn.Module):
    def __init__(self, width, heads, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, dropout)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = GptMlp(width, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    """docs/model.md's GPT. Dropout draws PyTorch's masks, not bigbatch's: runs that must
    agree to rounding use dropout 0."""

    def __init__(self, vocabulary, context, layers, width, heads, dropout=0.0):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocabulary, width),
            wpe=nn.Embedding(context, width),
            drop=nn.Dropout(dropout),
            h=nn.ModuleList([GptBlock(width, heads, dropout) for _ in range(layers)]),
            ln_f=nn.LayerNorm(width)))
        self.lm_head = nn.Linear(width, vocabulary, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln_" not in name:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens):
        b, t = tokens.shape
        x = self.transformer.drop(self.transformer.wte(tokens) +
                                  self.transformer.wpe(torch.arange(t)))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x)).view(b * t, -1)
