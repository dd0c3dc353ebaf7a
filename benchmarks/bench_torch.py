"""Tokens/s of our fp32 train step against a PyTorch CPU implementation of the same model and batch.

    pip install torch==2.13.0          # the CPU build; for this benchmark only, not a dependency
    python benchmarks/bench_torch.py [--size 8] [--batch 16] [--seq-len 256] [--steps 5] [--rounds 2]

The PyTorch model is what a user would otherwise write: eager mode, the same architecture
(pre-norm RMSNorm, RoPE, causal multi-head attention through F.scaled_dot_product_attention,
SwiGLU with fused up/gate and QKV projections, untied head), fp32, AdamW, same batch. Both train
steps run in this process, interleaved over --rounds; we print the median tokens/s and the ratio
(target >= 1.0, goal 1.5).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import jax
import numpy as np
import optax
import torch
import torch.nn.functional as F
from flax import nnx

from scaling import host
from scaling.train import ladder, model


class TorchLM(torch.nn.Module):
    def __init__(self, cfg: ladder.ModelConfig):
        super().__init__()
        d, f = cfg.d_model, cfg.d_ff
        self.cfg = cfg
        self.embed = torch.nn.Parameter(torch.randn(cfg.vocab, d))
        self.layers = torch.nn.ModuleList()
        for _ in range(cfg.n_layers):
            layer = torch.nn.Module()
            layer.attn_norm = torch.nn.Parameter(torch.ones(d))
            layer.qkv = torch.nn.Linear(d, 3 * d, bias=False)
            layer.out = torch.nn.Linear(d, d, bias=False)
            layer.mlp_norm = torch.nn.Parameter(torch.ones(d))
            layer.up_gate = torch.nn.Linear(d, 2 * f, bias=False)
            layer.down = torch.nn.Linear(f, d, bias=False)
            self.layers.append(layer)
        self.final_norm = torch.nn.Parameter(torch.ones(d))
        self.head = torch.nn.Linear(d, cfg.vocab, bias=False)
        for p in self.parameters():
            if p.dim() == 2 and p is not self.embed:
                torch.nn.init.normal_(p, std=cfg.init_std)
        k = cfg.head_dim
        inv_freq = cfg.rope_base ** (-torch.arange(0, k // 2, dtype=torch.float32) * 2.0 / k)
        angle = torch.arange(cfg.seq_len, dtype=torch.float32)[:, None] * inv_freq[None, :]
        self.register_buffer("cos", torch.cos(angle)[None, None], persistent=False)
        self.register_buffer("sin", torch.sin(angle)[None, None], persistent=False)

    def _norm(self, x, scale):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps) * scale

    def _rope(self, x):  # x: B, H, L, K
        k = x.shape[-1] // 2
        x1, x2 = x[..., :k], x[..., k:]
        cos, sin = self.cos[:, :, : x.shape[2]], self.sin[:, :, : x.shape[2]]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def forward(self, tokens):
        B, L = tokens.shape
        H, K = self.cfg.n_heads, self.cfg.head_dim
        x = self.embed[tokens]
        for layer in self.layers:
            q, k, v = layer.qkv(self._norm(x, layer.attn_norm)).split(self.cfg.d_model, dim=-1)
            q, k, v = (t.view(B, L, H, K).transpose(1, 2) for t in (q, k, v))
            o = F.scaled_dot_product_attention(self._rope(q), self._rope(k), v, is_causal=True)
            x = x + layer.out(o.transpose(1, 2).reshape(B, L, -1))
            up, gate = layer.up_gate(self._norm(x, layer.mlp_norm)).chunk(2, dim=-1)
            x = x + layer.down(up * F.silu(gate))
        return self.head(self._norm(x, self.final_norm))


def main() -> None:
    # the header names the machine and the allocator setting: timings hold for those only
    print(f"{host.describe()}; {host.process_env_status()}", flush=True)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    cfg = ladder.config_for_size(args.size, seq_len=args.seq_len)
    tokens_np = jax.random.randint(jax.random.key(0), (args.batch, args.seq_len + 1), 0, cfg.vocab)
    n_tok = args.batch * args.seq_len

    # ours: fp32 recipe, grad_step + AdamW, jitted
    m = model.Transformer(cfg, "fp32", rngs=nnx.Rngs(0))
    opt = nnx.Optimizer(m, optax.adamw(1e-3), wrt=nnx.Param)

    @nnx.jit
    def jax_step(m, opt, tokens, key):
        loss, grads, _ = model.grad_step(m, tokens, key, measure=False)
        opt.update(m, grads)
        return loss

    # PyTorch: same model and batch, eager, AdamW
    tm = TorchLM(cfg)
    topt = torch.optim.AdamW(tm.parameters(), lr=1e-3)
    tt = torch.tensor(np.array(tokens_np), dtype=torch.long)

    def torch_step():
        topt.zero_grad(set_to_none=True)
        logits = tm(tt[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), tt[:, 1:].reshape(-1))
        loss.backward()
        topt.step()
        return loss

    n_ours = sum(math.prod(p.shape) for p in jax.tree.leaves(nnx.state(m, nnx.Param)))
    n_torch = sum(p.numel() for p in tm.parameters())
    assert n_ours == n_torch, (n_ours, n_torch)
    jax.block_until_ready(jax_step(m, opt, tokens_np, jax.random.key(0)))
    torch_step()
    ours, theirs = [], []
    for _ in range(args.rounds):
        for i in range(args.steps):
            t = time.perf_counter()
            jax.block_until_ready(jax_step(m, opt, tokens_np, jax.random.key(i)))
            ours.append(n_tok / (time.perf_counter() - t))
        for _ in range(args.steps):
            t = time.perf_counter()
            torch_step()
            theirs.append(n_tok / (time.perf_counter() - t))
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"model size {args.size} (d_model {cfg.d_model}, {cfg.n_layers} layers, {n_ours:,} params), "
          f"batch {args.batch}x{args.seq_len}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"ours (JAX, fp32 recipe): {a:,.0f} tokens/s   PyTorch eager fp32: {b:,.0f} tokens/s   "
          f"ratio {a / b:.2f} (target >= 1.0, goal 1.5)")


if __name__ == "__main__":
    main()
