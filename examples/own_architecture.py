"""A new architecture for the trainer: one module plus its registration. The ladder's transformer
with a GELU MLP (two matrices of width 4·d_model, as GPT-2's) instead of SwiGLU (three of 8/3·d_model),
registered as `gelu` and trained by `scaling.train.run` like the built-in one: checkpoints, health
checks, telemetry, results rows (with an `architecture` column) and a run id of its own.

    python examples/own_architecture.py                 # both architectures, size 1, synthetic data
    python examples/own_architecture.py --size 2 --tokens 200000 --precision mxfp4

What a registration gives the harness (scaling.train.architectures): the model (`build`), and one
layer's quantised projections (`projections`), from which parameter counts, FLOPs per token and the
cost models' FLOPs by part follow. A `scaling` command knows the built-in `transformer` only: an
architecture of your own trains in a process that imported the module registering it.
"""

from __future__ import annotations

import argparse
import math
import tempfile

import jax
import jax.numpy as jnp
from flax import nnx

from scaling.numerics import QDense
from scaling.train import architectures, model, run

NAME = "gelu"


class GeluMLP(nnx.Module):
    """down(gelu(up(x))) with a hidden width of 4·d_model; returns (y, max |hidden|) as model.MLP does."""

    def __init__(self, cfg: architectures.ModelConfig, structure, *, rngs: nnx.Rngs):
        d, f = cfg.d_model, 4 * cfg.d_model
        init = nnx.initializers.normal
        # no formats of its own: the model keeps them once and each call passes them (Context.dense)
        self.up = QDense(d, f, structure, kernel_init=init(cfg.init_std), rngs=rngs)
        self.down = QDense(f, d, structure, kernel_init=init(cfg.init_std / math.sqrt(2 * cfg.n_layers)), rngs=rngs)

    def __call__(self, x_BxLxD: jax.Array, ctx: model.Context) -> tuple[jax.Array, jax.Array]:
        h_BxLxF = jax.nn.gelu(ctx.dense(self.up, x_BxLxD))
        return ctx.dense(self.down, h_BxLxF), jnp.max(jnp.abs(h_BxLxF))


class GeluBlock(model.Block):
    mlp_type = GeluMLP


class GeluTransformer(model.Transformer):
    block_type = GeluBlock


def gelu_projections(cfg: architectures.ModelConfig) -> list[tuple[int, int]]:
    """One layer's quantised projections: fused QKV, attention out, up, down."""
    d = cfg.d_model
    return [(d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)]


if NAME not in architectures.names():  # importing the module twice registers once
    architectures.register(NAME, build=GeluTransformer, projections=gelu_projections,
                           doc="The ladder's transformer with a GELU MLP of width 4·d_model.")


def config(architecture: str, size: int = 1, tokens: int = 65_536, precision: str = "fp32") -> dict:
    return {"name": f"{architecture}-{size}", "precision": precision, "seed": 0,
            "model": {"size": size, "seq_len": 64, "architecture": architecture},
            "data": {"source": "synthetic", "eval_tokens": 4096},
            "train": {"tokens": tokens, "batch_size": 16, "lr": "auto", "log_every": 1000, "checkpoint_every": 0}}


def main(argv: list[str] | None = None) -> dict[str, dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=65_536)
    parser.add_argument("--precision", default="fp32")
    args = parser.parse_args(argv)
    summaries = {}
    with tempfile.TemporaryDirectory() as tmp:
        for architecture in (architectures.DEFAULT, NAME):
            cfg = config(architecture, args.size, args.tokens, args.precision)
            summaries[architecture] = run(cfg, f"{tmp}/{architecture}", echo=lambda line: None)
    print(f"{'architecture':14s} {'N':>8s} {'FLOPs/token':>12s} {'val loss':>9s} {'run id':>13s}")
    for architecture, s in summaries.items():
        print(f"{architecture:14s} {s['N']:8d} {s['flops_per_token']:12.4g} {s['val_loss']:9.4f} {s['run_id']:>13s}")
    return summaries


if __name__ == "__main__":
    main()
