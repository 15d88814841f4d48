#!/usr/bin/env python3
"""A tiny random Llama-family decoder, and a reference forward of it.

    tiny_llama.py make DIR [options]   write a Hugging Face LlamaForCausalLM
                                       directory: config.json,
                                       model.safetensors, tokenizer.json,
                                       tokenizer_config.json
    tiny_llama.py forward DIR ID...    print the logits of the ids, one JSON
                                       row a position
    tiny_llama.py selftest             check the forward against a second,
                                       loop-by-loop implementation

The forward is written from the architecture's definition (Touvron et al.
2023; Hugging Face's LlamaForCausalLM layout), with NumPy only, and
shares nothing with hpcrun's engine: it is the independent reference the
engine's Llama is checked against. float64 throughout.

The architecture: token embedding; per layer x += o(attn(rmsnorm(x))) and
x += down(silu(gate(h)) * up(h)) with h = rmsnorm(x); a final rmsnorm and
the head (tied to the embedding when tie_word_embeddings). RMSNorm is
x / sqrt(mean(x^2) + eps) * w. Attention is causal, with
num_key_value_heads key/value heads shared by groups of query heads, and
rotary embeddings in Hugging Face's layout: each head's first and second
halves are the rotated pairs (rotate_half), frequencies
theta^(-2i/head_dim), adjusted as Llama 3's rope_scaling says when the
config has it. No biases.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def inv_freq(cfg):
    hd = cfg["hidden_size"] // cfg["num_attention_heads"]
    theta = cfg.get("rope_theta", 10000.0)
    f = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    rs = cfg.get("rope_scaling")
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / f
        smooth = (old / wavelen - lo) / (hi - lo)
        scaled = np.where(wavelen > old / lo, f / factor, f)
        mid = (wavelen <= old / lo) & (wavelen >= old / hi)
        f = np.where(mid, (1 - smooth) * f / factor + smooth * f, scaled)
    return f


def rope(x, pos, cfg):
    """x is (T, heads, head_dim); pos the positions (T)."""
    ang = np.outer(pos, inv_freq(cfg))  # (T, hd/2)
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rot * sin


def forward(cfg, w, ids):
    """The logits (T, vocab) of the ids, vectorised."""
    C, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd, eps, T = C // nh, cfg["rms_norm_eps"], len(ids)
    pos = np.arange(T)
    x = w["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        h = rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, nh, hd)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, hd)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, hd)
        q, k = rope(q, pos, cfg), rope(k, pos, cfg)
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
        s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd) + mask
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        y = np.einsum("hqk,khd->qhd", s, v).reshape(T, C)
        x = x + y @ w[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = h @ w[p + "mlp.gate_proj.weight"].T
        u = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return x @ head.T


def forward_loops(cfg, w, ids):
    """The same logits, one position, head and key at a time: a second
    reading of the definition for selftest."""
    C, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd, eps, T = C // nh, cfg["rms_norm_eps"], len(ids)
    f = inv_freq(cfg)

    def norm(v, g):
        return [v[j] / math.sqrt(sum(a * a for a in v) / len(v) + eps) * g[j] for j in range(len(v))]

    def matvec(m, v):
        return [sum(m[r][j] * v[j] for j in range(len(v))) for r in range(len(m))]

    def rot(v, t):  # one head's vector at position t
        out = list(v)
        for i in range(hd // 2):
            c, s = math.cos(t * f[i]), math.sin(t * f[i])
            a, b = v[i], v[i + hd // 2]
            out[i], out[i + hd // 2] = a * c - b * s, b * c + a * s
        return out

    xs = [list(w["model.embed_tokens.weight"][i]) for i in ids]
    for L in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % L
        W = {n: w[p + n].tolist() for n in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                             "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")}
        hs = [norm(x, w[p + "input_layernorm.weight"]) for x in xs]
        qs = [matvec(W["self_attn.q_proj.weight"], h) for h in hs]
        ks = [matvec(W["self_attn.k_proj.weight"], h) for h in hs]
        vs = [matvec(W["self_attn.v_proj.weight"], h) for h in hs]
        new = []
        for t in range(T):
            y = [0.0] * C
            for hh in range(nh):
                kv = hh // (nh // nkv)
                q = rot(qs[t][hh * hd:(hh + 1) * hd], t)
                sc = [sum(a * b for a, b in zip(q, rot(ks[j][kv * hd:(kv + 1) * hd], j))) / math.sqrt(hd) for j in range(t + 1)]
                m = max(sc)
                e = [math.exp(s - m) for s in sc]
                z = sum(e)
                for d in range(hd):
                    y[hh * hd + d] = sum(e[j] / z * vs[j][kv * hd + d] for j in range(t + 1))
            x = [a + b for a, b in zip(xs[t], matvec(W["self_attn.o_proj.weight"], y))]
            h = norm(x, w[p + "post_attention_layernorm.weight"])
            g, u = matvec(W["mlp.gate_proj.weight"], h), matvec(W["mlp.up_proj.weight"], h)
            act = [gi / (1 + math.exp(-gi)) * ui for gi, ui in zip(g, u)]
            new.append([a + b for a, b in zip(x, matvec(W["mlp.down_proj.weight"], act))])
        xs = new
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"]).tolist()
    return np.array([matvec(head, norm(x, w["model.norm.weight"])) for x in xs])


# --- files ------------------------------------------------------------------

DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


def to_bytes(a, dtype):
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "float32":
        return a.astype("<f4").tobytes()
    if dtype == "float16":
        return a.astype("<f2").tobytes()
    u = a.view(np.uint32).astype(np.uint64)  # bfloat16: round to nearest even
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype("<u2").tobytes()


def from_bytes(b, dtype, shape):
    if dtype == "F32":
        a = np.frombuffer(b, "<f4")
    elif dtype == "F16":
        a = np.frombuffer(b, "<f2")
    elif dtype == "BF16":
        a = (np.frombuffer(b, "<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        raise SystemExit("unsupported dtype %s" % dtype)
    return a.astype(np.float64).reshape(shape)


def write_safetensors(path, tensors, dtype):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        b = to_bytes(tensors[name], dtype)
        header[name] = {"dtype": DTYPES[dtype], "shape": list(tensors[name].shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {k: from_bytes(data[v["data_offsets"][0]:v["data_offsets"][1]], v["dtype"], v["shape"])
            for k, v in header.items() if k != "__metadata__"}


def byte_chars():
    """GPT-2's byte-level alphabet: the printable bytes as themselves, the
    others from U+0100 on."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


CORPUS = ("The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs on. "
          "Une phrase en français, avec des accents: été, où, naïve. 日本語も少し。 "
          "Numbers 12345 and 2024-05-20, then spaces    and\ttabs\nand new lines.\n") * 4


def bpe_merges(corpus, n):
    """n merges learned on corpus's space-led words, in byte-level form."""
    bc = byte_chars()
    words = {}
    for i, part in enumerate(corpus.split(" ")):
        word = (" " if i else "") + part
        key = tuple(bc[b] for b in word.encode())
        if key:
            words[key] = words.get(key, 0) + 1
    merges = []
    for _ in range(n):
        pairs = {}
        for word, c in words.items():
            for a, b in zip(word, word[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + c
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        new = {}
        for word, c in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            new[tuple(out)] = new.get(tuple(out), 0) + c
        words = new
    return merges


def write_tokenizer(d, vocab_size):
    bc = byte_chars()
    vocab = {bc[b]: b for b in range(256)}
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    merges = bpe_merges(CORPUS, vocab_size - 256 - len(specials) - 2)
    for a, b in merges:
        vocab[a + b] = len(vocab)
    added = [{"id": len(vocab) + i, "content": s, "special": True, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False}
             for i, s in enumerate(specials + ["<|reserved_0|>", "<|reserved_1|>"])]
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False, "vocab": vocab, "merges": [[a, b] for a, b in merges]},
    }
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": specials[0], "eos_token": specials[1], "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    return added[0]["id"], added[1]["id"]


def make(a):
    if a.dim % a.heads or a.heads % a.kv_heads or (a.dim // a.heads) % 2:
        raise SystemExit("dim must split into heads of an even size, and heads into kv-heads")
    if a.vocab < 300:
        raise SystemExit("vocab must be at least 300 (256 bytes, merges, 4 added tokens)")
    os.makedirs(a.dir, exist_ok=True)
    bos, eos = write_tokenizer(a.dir, a.vocab)
    r = np.random.default_rng(a.seed)
    C, F, hd = a.dim, a.ffn, a.dim // a.heads

    def rand(*shape):
        return r.normal(0, 0.08, shape)

    t = {"model.embed_tokens.weight": rand(a.vocab, C), "model.norm.weight": 1 + rand(C) / 4}
    for i in range(a.layers):
        p = "model.layers.%d." % i
        t[p + "input_layernorm.weight"] = 1 + rand(C) / 4
        t[p + "post_attention_layernorm.weight"] = 1 + rand(C) / 4
        t[p + "self_attn.q_proj.weight"] = rand(C, C)
        t[p + "self_attn.k_proj.weight"] = rand(a.kv_heads * hd, C)
        t[p + "self_attn.v_proj.weight"] = rand(a.kv_heads * hd, C)
        t[p + "self_attn.o_proj.weight"] = rand(C, C)
        t[p + "mlp.gate_proj.weight"] = rand(F, C)
        t[p + "mlp.up_proj.weight"] = rand(F, C)
        t[p + "mlp.down_proj.weight"] = rand(C, F)
    if not a.tie:
        t["lm_head.weight"] = rand(a.vocab, C)
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": C, "intermediate_size": F,
        "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads, "num_hidden_layers": a.layers,
        "head_dim": hd, "hidden_act": "silu", "rms_norm_eps": a.eps, "rope_theta": a.rope_theta,
        "max_position_embeddings": a.positions, "vocab_size": a.vocab, "tie_word_embeddings": a.tie,
        "attention_bias": False, "mlp_bias": False, "bos_token_id": bos, "eos_token_id": eos, "torch_dtype": a.dtype,
        "rope_scaling": None,
    }
    if a.llama3_rope:
        cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": max(8, a.positions // 4)}
    write_safetensors(os.path.join(a.dir, "model.safetensors"), t, a.dtype)
    with open(os.path.join(a.dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def load(d):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    return cfg, read_safetensors(os.path.join(d, "model.safetensors"))


def selftest():
    import tempfile
    for kv, tie, l3 in ((4, True, False), (2, False, True), (1, False, False)):
        with tempfile.TemporaryDirectory() as d:
            make(argparse.Namespace(dir=d, layers=2, dim=16, heads=4, kv_heads=kv, ffn=24, vocab=300, positions=64,
                                    seed=kv, dtype="float32", tie=tie, eps=1e-5, rope_theta=10000.0, llama3_rope=l3))
            cfg, w = load(d)
            ids = [5, 77, 260, 3, 299, 42, 42]
            a, b = forward(cfg, w, ids), forward_loops(cfg, w, ids)
            err = np.max(np.abs(a - b))
            if not err < 1e-9:
                raise SystemExit("kv_heads %d: the vectorised and the loop forward differ by %g" % (kv, err))
            c = forward(cfg, w, ids[:4] + [1, 2, 3])
            if not np.max(np.abs(a[:4] - c[:4])) < 1e-12:
                raise SystemExit("kv_heads %d: a later token changed an earlier position's logits" % kv)
    print("ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make", help="write a tiny random LlamaForCausalLM directory")
    m.add_argument("dir")
    m.add_argument("--layers", type=int, default=2)
    m.add_argument("--dim", type=int, default=64)
    m.add_argument("--heads", type=int, default=4)
    m.add_argument("--kv-heads", type=int, default=2)
    m.add_argument("--ffn", type=int, default=160)
    m.add_argument("--vocab", type=int, default=320)
    m.add_argument("--positions", type=int, default=128)
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    m.add_argument("--tie", action="store_true", help="tie the head to the embedding")
    m.add_argument("--eps", type=float, default=1e-5)
    m.add_argument("--rope-theta", type=float, default=10000.0)
    m.add_argument("--llama3-rope", action="store_true", help="add Llama 3's rope_scaling")
    f = sub.add_parser("forward", help="print the logits of ids")
    f.add_argument("dir")
    f.add_argument("ids", nargs="+", type=int)
    sub.add_parser("selftest", help="check the forward against the loop version")
    a = ap.parse_args()
    if a.cmd == "make":
        make(a)
    elif a.cmd == "forward":
        cfg, w = load(a.dir)
        json.dump(forward(cfg, w, a.ids).tolist(), sys.stdout)
        print()
    else:
        selftest()


if __name__ == "__main__":
    main()
