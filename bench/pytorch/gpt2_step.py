#!/usr/bin/env python3
"""PyTorch eager reference for `hpcrun bench step --device cuda`.

Times full training steps (forward, backward, global grad-norm clip, AdamW)
of GPT-2 124M (12 layers, 768 channels, 12 heads, vocabulary 50257, tied
LM head, learned positions for --seq tokens, no dropout) on random tokens,
the step hpcrun's train.BenchStep times, and prints tokens/s and peak
memory (torch.cuda.max_memory_allocated). --model llama times a
Llama-style decoder instead (RMSNorm, rotary embeddings, grouped-query
attention, SwiGLU, no biases, tied head), by default SmolLM-135M's shape,
hpcrun's smollm-135m preset.

Attention defaults to the explicit form hpcrun computes (scores, masked
softmax, weighted sum, the (B,NH,T,T) matrix kept for the backward);
--attn sdpa uses F.scaled_dot_product_attention (flash attention), what
eager GPT-2 code usually runs. --dtype bf16 runs under torch.autocast.

With --hpcrun-json FILE (the output of `hpcrun --json bench step --device
cuda`), it prints both side by side and the ratio hpcrun/PyTorch.

Example: python3 bench/pytorch/gpt2_step.py --bsz 8 --seq 1024
"""

import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, nh, attn):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c)
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)
        self.nh, self.attn = nh, attn

    def attention(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        hs = c // self.nh
        q, k, v = (z.view(b, t, self.nh, hs).transpose(1, 2) for z in (q, k, v))
        if self.attn == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class RMSNorm(nn.Module):
    def __init__(self, c, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rotate(x, cos, sin):
    """Rotary embeddings in Hugging Face's rotate_half layout."""
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


class LlamaBlock(nn.Module):
    def __init__(self, c, nh, nkv, ffn, attn):
        super().__init__()
        hs = c // nh
        self.input_layernorm = RMSNorm(c)
        self.q_proj = nn.Linear(c, nh * hs, bias=False)
        self.k_proj = nn.Linear(c, nkv * hs, bias=False)
        self.v_proj = nn.Linear(c, nkv * hs, bias=False)
        self.o_proj = nn.Linear(c, c, bias=False)
        self.post_attention_layernorm = RMSNorm(c)
        self.gate_proj = nn.Linear(c, ffn, bias=False)
        self.up_proj = nn.Linear(c, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, c, bias=False)
        self.nh, self.nkv, self.hs, self.attn = nh, nkv, hs, attn

    def attention(self, x, cos, sin):
        b, t, c = x.shape
        q = self.q_proj(x).view(b, t, self.nh, self.hs).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.nkv, self.hs).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.nkv, self.hs).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        g = self.nh // self.nkv
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        if self.attn == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hs))
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        return self.o_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    def forward(self, x, cos, sin):
        x = x + self.attention(self.input_layernorm(x), cos, sin)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, vocab, seq, layers, c, nh, nkv, ffn, attn, theta=10000.0):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, c)
        self.layers = nn.ModuleList(LlamaBlock(c, nh, nkv, ffn, attn) for _ in range(layers))
        self.norm = RMSNorm(c)
        hs = c // nh
        freqs = 1.0 / theta ** (torch.arange(0, hs, 2).float() / hs)
        ang = torch.outer(torch.arange(seq).float(), freqs)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02
                if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                    std /= math.sqrt(2 * layers)
                nn.init.normal_(p, std=std)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.embed_tokens(idx)
        cos, sin = self.cos[:t].to(x.dtype), self.sin[:t].to(x.dtype)
        for blk in self.layers:
            x = blk(x, cos, sin)
        logits = self.norm(x) @ self.embed_tokens.weight.t()  # tied head
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


class GPT(nn.Module):
    def __init__(self, vocab, seq, layers, c, nh, attn):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(seq, c)
        self.blocks = nn.ModuleList(Block(c, nh, attn) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.01 if name == "wpe.weight" else 0.02
                if name.endswith("c_proj.weight") or name.endswith("mlp_proj.weight"):
                    std /= math.sqrt(2 * layers)
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bsz", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--model", choices=["gpt2", "llama"], default="gpt2",
                    help="gpt2 (GPT-2 124M's shape) or llama (SmolLM-135M's: hpcrun's smollm-135m)")
    ap.add_argument("--layers", type=int, help="blocks (gpt2 12, llama 30)")
    ap.add_argument("--dim", type=int, help="width (gpt2 768, llama 576)")
    ap.add_argument("--heads", type=int, help="attention heads (gpt2 12, llama 9)")
    ap.add_argument("--kv-heads", type=int, default=3, help="llama's key/value heads")
    ap.add_argument("--ffn", type=int, default=1536, help="llama's SwiGLU width")
    ap.add_argument("--vocab", type=int, help="vocabulary (gpt2 50257, llama 49152)")
    ap.add_argument("--attn", choices=["naive", "sdpa"], default="naive")
    ap.add_argument("--dtype", choices=["fp32", "tf32", "bf16"], default="fp32",
                    help="fp32 (no TF32, like hpcrun's default), tf32 matmuls, or bf16 autocast")
    ap.add_argument("--hpcrun-json", help="hpcrun's `--json bench step --device cuda` output, to compare")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    shape = {"gpt2": (12, 768, 12, 50257), "llama": (30, 576, 9, 49152)}[a.model]
    a.layers, a.dim, a.heads, a.vocab = (v if v is not None else d for v, d in zip((a.layers, a.dim, a.heads, a.vocab), shape))
    if a.steps < 1 or a.warmup < 0:
        sys.exit("gpt2_step.py: --steps must be at least 1 and --warmup not negative")
    if not torch.cuda.is_available():
        sys.exit("gpt2_step.py: PyTorch sees no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = a.dtype == "tf32"
    torch.backends.cudnn.allow_tf32 = a.dtype == "tf32"
    dev = torch.device("cuda")
    torch.manual_seed(1)
    if a.model == "llama":
        model = Llama(a.vocab, a.seq, a.layers, a.dim, a.heads, a.kv_heads, a.ffn, a.attn).to(dev)
    else:
        model = GPT(a.vocab, a.seq, a.layers, a.dim, a.heads, a.attn).to(dev)
    params = sum(p.numel() for p in model.parameters())
    # hpcrun's model FLOPs a token (config.ModelFlopsPerToken): 6 a
    # parameter and attention's 12 x layers x seq x dim.
    model_flops = 6 * params + 12 * a.layers * a.seq * a.dim
    decay = [p for p in model.parameters() if p.dim() == 2]
    other = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": other, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    g = torch.Generator(device=dev).manual_seed(1)
    idx = torch.randint(a.vocab, (a.bsz, a.seq), device=dev, generator=g)
    tgt = torch.randint(a.vocab, (a.bsz, a.seq), device=dev, generator=g)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times, loss = [], float("nan")
    for s in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            l = model(idx, tgt)
        l.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        torch.cuda.synchronize()
        if s >= a.warmup:
            times.append(time.perf_counter() - t0)
        loss = l.item()
    step = statistics.median(times)
    tokens = a.bsz * a.seq
    res = {
        "framework": f"pytorch {torch.__version__} eager",
        "device": torch.cuda.get_device_name(),
        "model": a.model, "attn": a.attn, "dtype": a.dtype, "params": params, "bsz": a.bsz, "seq": a.seq,
        "step_s": step, "step_s_min": min(times), "step_s_max": max(times), "steps": len(times),
        "tokens_per_s": tokens / step, "model_tflops": model_flops * tokens / step / 1e12,
        "peak_bytes": torch.cuda.max_memory_allocated(), "reserved_bytes": torch.cuda.max_memory_reserved(),
        "loss": loss,
    }
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        print(f"pytorch step: {a.model} {params / 1e6:.1f}M params, bsz {a.bsz} x seq {a.seq}, {res['device']}, "
              f"{res['framework']}, attn {a.attn}, {a.dtype}")
        print(f"step time          {step:.4f} s median of {len(times)} (min {min(times):.4f}, max {max(times):.4f}); loss {loss:.3f}")
        print(f"throughput         {res['tokens_per_s']:.0f} tokens/s; model {res['model_tflops']:.1f} TFLOP/s")
        print(f"memory             peak {res['peak_bytes'] / 2**20:.0f} MiB allocated, {res['reserved_bytes'] / 2**20:.0f} MiB reserved")
    h = None
    if a.hpcrun_json:
        try:
            with open(a.hpcrun_json) as f:
                h = json.load(f)
            h["tokens_per_s"], h["peak_bytes"], h["loss"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            # A failed hpcrun step must not hide PyTorch's result.
            print(f"\nhpcrun's result {a.hpcrun_json} is unreadable ({e}): PyTorch alone")
            h = None
    if h is not None:
        print()
        print(f"{'':24}{'hpcrun':>14}{'pytorch':>14}{'hpcrun/pytorch':>16}")
        print(f"{'tokens/s':24}{h['tokens_per_s']:>14.0f}{res['tokens_per_s']:>14.0f}{h['tokens_per_s'] / res['tokens_per_s']:>16.2f}")
        print(f"{'peak MiB':24}{h['peak_bytes'] / 2**20:>14.0f}{res['peak_bytes'] / 2**20:>14.0f}{h['peak_bytes'] / res['peak_bytes']:>16.2f}")
        print(f"{'loss':24}{h['loss']:>14.3f}{res['loss']:>14.3f}")
        print(f"(hpcrun {h['device']} matmul {h['precision']}; pytorch {a.dtype}, attn {a.attn}; bsz {a.bsz} x seq {a.seq})")


if __name__ == "__main__":
    main()
