"""The step model against published measurements: per-case errors and the calibration of its constants.

`scaling plan validate` prints the validation table (case, layout, measured, predicted, error, role)
and the errors by generation, role and family; `--calibrate` refits efficiency.EFFICIENCY, one set per
GPU generation, each on that generation's calibration cases only (the held-out cases never enter the
fit), and prints the constants to paste into scaling/plan/efficiency.py.
Cases: scaling/plan/step_cases.json, each with its source.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from scaling.plan.efficiency import GENERATION, Efficiency, get_recipe
from scaling.plan.hardware import get_gpu
from scaling.plan.layerops import attention_flops_per_token
from scaling.plan.layout import parse_step_layout
from scaling.plan.memory import GIB
from scaling.plan.shapes import load_model
from scaling.plan.stepmodel import step

CASES_PATH = Path(__file__).parent / "step_cases.json"


def load_cases(path: Path = CASES_PATH) -> list[dict]:
    return json.loads(path.read_text())["cases"]


def attention_kernels(path: Path = CASES_PATH) -> dict[str, list[dict]]:
    """Measured flash-attention kernels per GPU generation (rows of batch, seq_len, heads, qk/v head dims
    and SimuMax's forward and backward factors: non-causal FLOPs over the BF16 peak)."""
    return {gen: k["rows"] for gen, k in json.loads(path.read_text()).get("attention_kernels", {}).items()}


# where the kernel fit starts (round numbers)
KERNEL_START = {"attention": 0.5, "mla_attention": 0.5, "attention_half_flops": 1e10}
KERNEL_BOUNDS = {"attention": (0.05, 1.0), "mla_attention": (0.05, 1.0), "attention_half_flops": (1e8, 1e13)}


def kernel_attention(rows: list[dict], rounds: int = 8) -> dict[str, float]:
    """attention, mla_attention and attention_half_flops (Efficiency) by least squares of log
    efficiency over measured kernels. A row's forward and backward factors count the FLOPs without the
    causal mask, twice what the step model counts, and the model prices forward (1 part) and backward
    (2.5 parts) at one efficiency, so a row's efficiency is 3.5 / (2 / fwd + 5 / bwd), at its causal
    forward FLOPs 2 b s (s/2) h (d_qk + d_v) (the model's `attn`)."""
    measured = [(r["batch"] * r["seq_len"] ** 2 * r["heads"] * (r["qk_head_dim"] + r["v_head_dim"]),
                 r["qk_head_dim"] != r["v_head_dim"], 3.5 / (2 / r["fwd"] + 5 / r["bwd"])) for r in rows]

    def loss(eff: Efficiency) -> float:
        return sum(math.log(eff.attention_at(f, mla) / e) ** 2 for f, mla, e in measured)

    start = replace(START, **KERNEL_START)
    best = _descend(loss, start, KERNEL_BOUNDS, rounds)
    return {key: getattr(best, key) for key in KERNEL_BOUNDS}


@dataclass(frozen=True)
class Check:
    case: dict
    measured_ms: float
    predicted_ms: float
    measured_gib: float | None
    predicted_gib: float

    @property
    def error(self) -> float:
        return self.predicted_ms / self.measured_ms - 1

    @property
    def memory_error(self) -> float | None:
        return None if self.measured_gib is None else self.predicted_gib / self.measured_gib - 1


def check(case: dict, eff: Efficiency | None = None) -> Check:
    # a case may cut the model as it was run: fewer layers, its dense-layer count, MTP modules on or off
    model = load_model(case["model"], layers=case.get("layers"), dense_layers=case.get("dense_layers"),
                                 mtp=case.get("mtp"))
    lay = dict(case["layout"])
    text = ",".join(f"{k}={v}" for k, v in lay.items())
    layout = parse_step_layout(text, micro_batch=case["micro_batch"], micro_batches=case["micro_batches"],
                                         recompute=case.get("recompute"))
    r = step(model, case["gpu"], layout, case["precision"], case["seq_len"], case["gpus"], eff)
    if "measured_step_ms" in case:
        measured = case["measured_step_ms"]
    elif "measured_tokens_per_s_per_gpu" in case:  # tokens of one step / (tokens/s/GPU x GPUs)
        measured = r.tokens / (case["measured_tokens_per_s_per_gpu"] * layout.gpus) * 1e3
    else:  # published model TFLOP/s per GPU -> step time, with the FLOPs of the real layer count
        real = replace(model, layers=case.get("flops_layers", model.layers))
        flops = (6 * real.matmul_params + attention_flops_per_token(real, case["seq_len"])) * r.tokens
        measured = flops / (case["measured_tflops_per_gpu"] * 1e12 * layout.gpus) * 1e3
    return Check(case, measured, r.step_seconds * 1e3, case.get("measured_memory_gib"), r.memory.total / GIB)


# Where the fit starts (round numbers, not measurements): a fixed start keeps the refit
# reproducible, since GEMM efficiency and its knee trade off along a shallow valley.
START = Efficiency(gemm=0.8, gemm_half_flops=2e10, attention=0.5, bandwidth=0.7)


def generation(case: dict) -> str:
    return GENERATION[case["gpu"]]


def calibrate_all(cases: list[dict]) -> dict[str, Efficiency]:
    """One set of constants per GPU generation that has calibration cases."""
    gens = sorted({generation(c) for c in cases if c["role"] == "calibration"})
    return {g: calibrate([c for c in cases if generation(c) == g]) for g in gens}


def calibrate(cases: list[dict], start: Efficiency = START, rounds: int = 6) -> Efficiency:
    """Least squares of log(predicted / measured) step time over the calibration cases, in stages:
    the four dense constants on the dense runs at the generation's main rate (MAIN_RATE, else the
    tensor-core rate most of its dense calibration runs use; three where the generation has kernel
    timings in attention_kernels: flash attention's constants come from kernel_attention, held);
    then, with those held, one GEMM efficiency per other rate on that rate's dense runs
    (`Efficiency.gemm_rates`); then moe_layer_seconds on the MoE
    runs with everything else held (MoE runs never move the dense constants). Held-out cases are
    dropped before anything is priced."""
    cases = [c for c in cases if c["role"] == "calibration"]
    dense = [c for c in cases if family_of(c) == "dense"]
    moe = [c for c in cases if family_of(c) == "MoE"]
    rates = [rate_of(c) for c in dense]
    gens = {generation(c) for c in cases}
    gen = gens.pop() if len(gens) == 1 else None
    main = MAIN_RATE[gen] if gen in MAIN_RATE else (max(sorted(set(rates)), key=rates.count) if rates else None)
    bounds = DENSE_BOUNDS
    kernels = attention_kernels().get(gen)
    if kernels:
        # attention from measured kernels, held: where attention is ~10% of every calibration step, the
        # step times leave its efficiency free (B200: 0.26 to 0.6 fit them equally well)
        start = replace(start, **kernel_attention(kernels))
        bounds = {k: v for k, v in DENSE_BOUNDS.items() if k != "attention"}
    best = _descend(_step_loss([c for c in dense if rate_of(c) == main]), start, bounds, rounds) if dense else start
    for rate in sorted(set(rates) - {main}):
        best = replace(best, gemm_rates=best.gemm_rates + ((rate, best.gemm),))
        best = _descend(_step_loss([c for c in dense if rate_of(c) == rate]), best,
                        {f"gemm_rates.{rate}": DENSE_BOUNDS["gemm"]}, rounds)
    if moe:
        best = _descend(_step_loss(moe), replace(best, moe_layer_seconds=MOE_START), MOE_BOUNDS, rounds)
    return best


DENSE_BOUNDS = {"gemm": (0.3, 1.0), "gemm_half_flops": (1e8, 1e12), "attention": (0.1, 1.0), "bandwidth": (0.3, 1.0)}
MOE_BOUNDS = {"moe_layer_seconds": (1e-6, 0.1)}
MOE_START = 1e-3  # seconds per MoE layer per micro-batch: where the MoE stage starts (a round number)
# The rate whose runs set a generation's four dense constants: the one its first calibration set used
# (H100: NeMo's FP8 runs; B200: SimuMax's BF16 runs), so runs added at another rate fit only their own.
MAIN_RATE = {"h100": "fp8", "b200": "bf16"}


def rate_of(case: dict) -> str:
    """The tensor-core rate a case's GEMMs run at ('bf16', 'fp8', ...)."""
    return get_recipe(case["precision"], get_gpu(case["gpu"])).rate


def _get(eff: Efficiency, key: str) -> float:
    """A constant by name; 'gemm_rates.RATE' reads one rate's GEMM efficiency."""
    return eff.gemm_at(key.split(".", 1)[1]) if key.startswith("gemm_rates.") else getattr(eff, key)


def _set(eff: Efficiency, key: str, value: float) -> Efficiency:
    if key.startswith("gemm_rates."):
        rate = key.split(".", 1)[1]
        return replace(eff, gemm_rates=tuple((r, value if r == rate else g) for r, g in eff.gemm_rates))
    return replace(eff, **{key: value})


def _step_loss(cases: list[dict]) -> Callable[[Efficiency], float]:
    """Sum of squared log(predicted / measured) step times over `cases`, as a function of the constants."""
    def loss(eff: Efficiency) -> float:
        return sum(math.log(x.predicted_ms / x.measured_ms) ** 2 for x in (check(c, eff) for c in cases))
    return loss


def _descend(loss: Callable[[Efficiency], float], start: Efficiency, bounds: dict[str, tuple[float, float]], rounds: int) -> Efficiency:
    """Coordinate descent of `loss` on the `bounds` constants with multiplicative steps, halved each round."""
    best, best_loss = start, loss(start)
    for r in range(rounds):
        log_step = 0.5 / 2**r  # multiplicative step in log space, halved each round
        for key, (lo, hi) in bounds.items():
            improved = True
            while improved:
                improved = False
                for factor in (math.exp(log_step), math.exp(-log_step)):
                    value = min(hi, max(lo, _get(best, key) * factor))
                    trial = _set(best, key, value)
                    trial_loss = loss(trial)
                    if trial_loss < best_loss - 1e-12:
                        best, best_loss, improved = trial, trial_loss, True
                        break
    return best


def family_of(case: dict) -> str:
    return "MoE" if load_model(case["model"]).moe else "dense"


def layout_text(case: dict) -> str:
    lay = case["layout"]
    parts = [f"{k}{v}" for k, v in lay.items()
             if k in ("tp", "cp", "pp", "dp", "vpp", "ep", "etp") and (v > 1 or k in ("tp", "pp", "dp"))]
    flags = [k for k in ("tpo", "ogr", "opg", "a2ao", "deepep", "dualpipe") if lay.get(k)]
    recompute = f" rc-{case['recompute']}" if case.get("recompute") else ""
    return f"{'/'.join(parts)} m{case['micro_batches']} s{case['seq_len']}{recompute}" + (f" +{'+'.join(flags)}" if flags else "")


def table(checks: list[Check]) -> str:
    lines = ["| case | GPUs | layout | measured ms | predicted ms | error | memory GiB meas./pred. (error) | role |",
             "|---|---:|---|---:|---:|---:|---|---|"]
    for c in checks:
        mem = "-" if c.measured_gib is None else f"{c.measured_gib:.1f} / {c.predicted_gib:.1f} ({c.memory_error:+.1%})"
        lines.append(f"| {c.case['name']} | {c.case['gpus']} {c.case['gpu']} | {layout_text(c.case)} | {c.measured_ms:,.0f} "
                     f"| {c.predicted_ms:,.0f} | {c.error:+.1%} | {mem} | {c.case['role']} |")
    return "\n".join(lines)


def summary(checks: list[Check]) -> list[str]:
    """One line per GPU generation, role and family: mean and worst |error|, and how many are within 10%
    (all of them, and those without a note explaining a miss)."""
    lines = []
    for gen in sorted({generation(c.case) for c in checks}):
        for role in ("calibration", "held-out"):
            for family in ("dense", "MoE"):
                group = [c for c in checks
                         if c.case["role"] == role and generation(c.case) == gen and family_of(c.case) == family]
                errs = [abs(c.error) for c in group]
                plain = [abs(c.error) for c in group if not c.case.get("note")]  # no explanation recorded
                if errs:
                    lines.append(f"{gen} {role} {family}: {len(errs)} cases, mean |error| {sum(errs) / len(errs):.1%}, "
                                 f"worst {max(errs):.1%}, within 10%: {sum(e <= 0.10 for e in errs)}; "
                                 f"without a note: {sum(e <= 0.10 for e in plain)} of {len(plain)} within 10%")
    return lines
