"""The shared transformer models rebuilt in PyTorch from the configs in their
meta.json (the architectures of transformers' GPT2LMHeadModel,
LlamaForCausalLM and BertModel, written out so that the tests need no
package besides torch), and the MLP."""

import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def config(models, name):
    """The `config` of a shared model's meta.json."""
    return json.loads((models / name / "meta.json").read_text())["source"]["config"]


class MLP(nn.Sequential):
    """The shared `mlp`: Linear(64, 128), GELU, Linear(128, 64), LayerNorm(64)."""

    def __init__(self, width=64, hidden=128):
        super().__init__(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width), nn.LayerNorm(width))


class _GPT2Block(nn.Module):
    def __init__(self, n, heads, eps):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(n, eps=eps)
        self.c_attn = nn.Linear(n, 3 * n)
        self.c_proj = nn.Linear(n, n)
        self.ln_2 = nn.LayerNorm(n, eps=eps)
        self.fc = nn.Linear(n, 4 * n)
        self.proj = nn.Linear(4 * n, n)

    def forward(self, x):
        b, t, n = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(n, dim=-1)
        q, k, v = (z.view(b, t, self.heads, n // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(a.transpose(1, 2).reshape(b, t, n))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    """GPT2LMHeadModel: learned positions, pre-norm blocks, tied head."""

    def __init__(self, c):
        super().__init__()
        n, eps = c["n_embd"], c["layer_norm_epsilon"]
        self.wte = nn.Embedding(c["vocab_size"], n)
        self.wpe = nn.Embedding(c["n_positions"], n)
        self.h = nn.ModuleList(_GPT2Block(n, c["n_head"], eps) for _ in range(c["n_layer"]))
        self.ln_f = nn.LayerNorm(n, eps=eps)

    def forward(self, input_ids):
        t = input_ids.shape[1]
        x = self.wte(input_ids) + self.wpe(torch.arange(t, device=input_ids.device))
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()


class _RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class _LlamaLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        n, self.heads, self.kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        self.d = n // self.heads
        self.input_layernorm = _RMSNorm(n, c["rms_norm_eps"])
        self.q_proj = nn.Linear(n, self.heads * self.d, bias=False)
        self.k_proj = nn.Linear(n, self.kv * self.d, bias=False)
        self.v_proj = nn.Linear(n, self.kv * self.d, bias=False)
        self.o_proj = nn.Linear(self.heads * self.d, n, bias=False)
        self.post_attention_layernorm = _RMSNorm(n, c["rms_norm_eps"])
        self.gate_proj = nn.Linear(n, c["intermediate_size"], bias=False)
        self.up_proj = nn.Linear(n, c["intermediate_size"], bias=False)
        self.down_proj = nn.Linear(c["intermediate_size"], n, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, t, self.heads, self.d).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.kv, self.d).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.kv, self.d).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if self.kv != self.heads:
            k = k.repeat_interleave(self.heads // self.kv, dim=1)
            v = v.repeat_interleave(self.heads // self.kv, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, -1))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    """LlamaForCausalLM: RMSNorm, rotary positions, SwiGLU."""

    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(_LlamaLayer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = _RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        d = c["hidden_size"] // c["num_attention_heads"]
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, input_ids):
        t = input_ids.shape[1]
        freqs = torch.outer(torch.arange(t, dtype=torch.float32, device=input_ids.device), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


class _BertLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        n, eps = c["hidden_size"], c["layer_norm_eps"]
        self.heads = c["num_attention_heads"]
        self.query, self.key, self.value = nn.Linear(n, n), nn.Linear(n, n), nn.Linear(n, n)
        self.attn_out = nn.Linear(n, n)
        self.attn_norm = nn.LayerNorm(n, eps=eps)
        self.intermediate = nn.Linear(n, c["intermediate_size"])
        self.out = nn.Linear(c["intermediate_size"], n)
        self.out_norm = nn.LayerNorm(n, eps=eps)

    def forward(self, x, mask):
        b, t, n = x.shape
        d = n // self.heads
        q, k, v = (p(x).view(b, t, self.heads, d).transpose(1, 2) for p in (self.query, self.key, self.value))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d) + mask
        a = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, n)
        x = self.attn_norm(x + self.attn_out(a))
        return self.out_norm(x + self.out(F.gelu(self.intermediate(x))))


class Bert(nn.Module):
    """BertModel without its pooler: embeddings, post-norm layers, an
    additive attention mask from `attention_mask`."""

    def __init__(self, c):
        super().__init__()
        n = c["hidden_size"]
        self.word = nn.Embedding(c["vocab_size"], n)
        self.position = nn.Embedding(c["max_position_embeddings"], n)
        self.token_type = nn.Embedding(c["type_vocab_size"], n)
        self.norm = nn.LayerNorm(n, eps=c["layer_norm_eps"])
        self.layers = nn.ModuleList(_BertLayer(c) for _ in range(c["num_hidden_layers"]))

    def forward(self, input_ids, attention_mask):
        t = input_ids.shape[1]
        positions = torch.arange(t, device=input_ids.device)
        x = self.word(input_ids) + self.position(positions) + self.token_type(torch.zeros_like(input_ids))
        x = self.norm(x)
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, mask)
        return x


def build(models, name, seed=0):
    """The model `name` (gpt2-tiny, llama-tiny, bert-tiny or mlp) with its
    shared config, randomly initialised from `seed`, in eval mode."""
    torch.manual_seed(seed)
    if name == "mlp":
        return MLP().eval()
    c = config(models, name)
    model = {"gpt2-tiny": GPT2, "llama-tiny": Llama, "bert-tiny": Bert}[name](c)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, c["initializer_range"])
    return model.eval()
