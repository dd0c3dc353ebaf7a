"""Figures and per-step curves on tiny fake results: a kumar law with known parameters, a few runs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from scaling import cli
from scaling.study.sweeps import curves
from scaling.study.report import figure_base, plots
from scaling.train import ladder
from scaling._io import append_jsonl, atomic_write_json
from scaling.errors import ConfigError

# A kumar law (Kumar et al. 2024 form, kappa = 3): L = E + A·N_eff^-alpha + B·D^-beta,
# N_eff = N·(1 - exp(-P/gamma))^3. Its compute-optimal precision is P* = 1.904·gamma for any C.
LAW = dict(A=60.0, B=60.0, E=1.5, alpha=0.3, beta=0.3)
X_KAPPA3 = 1.9038  # root of e^x - 1 = 3x


def kumar_loss(N, D, P, gamma, A=LAW["A"], B=LAW["B"], E=LAW["E"], alpha=LAW["alpha"], beta=LAW["beta"]):
    n_eff = np.asarray(N, float) * (1 - np.exp(-np.asarray(P, float) / gamma)) ** 3
    return E + A * n_eff ** -alpha + B * np.asarray(D, float) ** -beta


RECIPES = {32: ("fp32", "fp32"), 16: ("bf16", "bfloat16"), 8: ("fp8", "fp8_e4m3"), 6: ("fp6", "fp6_e2m3"),
           4: ("fp4", "fp4_e2m1")}


def fake_results(p_star: float = 5.0, noise: float = 0.01, seed: int = 0) -> pd.DataFrame:
    """60 (run, budget) rows: 4 sizes × 5 precisions × 3 token budgets, loss from the law × (1 + 1% noise)."""
    rng = np.random.default_rng(seed)
    gamma = p_star / X_KAPPA3
    rows = []
    for N in (2e5, 5e5, 1e6, 2e6):
        for P, (recipe, fmt) in RECIPES.items():
            run_id = f"{recipe}-{N:.0e}"
            for D in (2e6, 5e6, 1.25e7):
                loss = float(kumar_loss(N, D, P, gamma)) * (1 + noise * rng.normal())
                rows.append(dict(run_id=run_id, sweep="ladder", N=N, N_total=N * 1.2, D=D, P=P, recipe=recipe,
                                 format=fmt, granularity="tensor" if P < 16 else "none",
                                 scaling="current" if P < 16 else "none", smooth_swiglu=False, seed=0,
                                 train_loss=loss, val_loss=loss, status="ok", wall_s=1.0, tokens_per_s=1e4))
    # one diverged run: counted in the report, kept out of fits and figures
    rows.append({**rows[-1], "run_id": "fp4-diverged", "val_loss": float("nan"), "status": "diverged"})
    return pd.DataFrame(rows)


# Curves: runs written in scaling.train.loop's metrics.jsonl format (trunk records, eval records,
# WSD cooldown records that must be left out) with known telemetry.
CURVE_RUNS = [  # (recipe, P, format, granularity, scaling, smooth_swiglu, N)
    ("bf16", 16, "bfloat16", "none", "none", False, 1e5),
    ("fp8", 8, "fp8_e4m3", "tensor", "current", False, 1e5),
    ("fp8", 8, "fp8_e4m3", "tensor", "current", True, 1e5),
    ("mxfp4", 4, "fp4_e2m1", "mx", "current", False, 1e5),
    ("fp8", 8, "fp8_e4m3", "tensor", "current", False, 4e5),
]
STEPS = 60


def train_loss(step: int, P: int) -> float:
    return 2.0 + 8.0 / math.sqrt(step) + (0.2 if P == 4 else 0.0)


def swiglu_peak(step: int, smooth: bool) -> float:
    return 10.0 + step * (0.5 if smooth else 20.0)


def block_min(step: int) -> float:
    return 0.0 if step % 4 == 0 else 0.02  # every 4th logged step has an all-zero block


def write_curve_runs(root: Path) -> Path:
    sweep = root / "sw"
    for recipe, P, fmt, gran, timing, smooth, N in CURVE_RUNS:
        run = sweep / f"{recipe}-{int(smooth)}-{N:.0e}"
        run.mkdir(parents=True)
        for step in range(1, STEPS + 1):
            telemetry = {role: {"amax": 300.0 + step if role == "activation" else 2.0, "frac_saturated": 0.0,
                                "frac_underflow": 0.0, "snr_db": 30.0,
                                "block_amax": {"min": block_min(step), "p50": 1.0, "max": 300.0 + step}}
                         for role in ("weight", "activation")}
            telemetry["act_max"] = [3.0, 4.0]
            telemetry["swiglu_max"] = [1.0, swiglu_peak(step, smooth)]
            record = {"step": step, "tokens": step * 1000, "phase": "trunk", "loss": train_loss(step, P),
                      "lr": 1e-3, "grad_norm": 1.0, "tokens_per_s": 1e4, "telemetry": telemetry}
            append_jsonl(run / "metrics.jsonl", record)
            if step % 20 == 0:
                append_jsonl(run / "metrics.jsonl", {"event": "eval", "tokens": step * 1000, "D": step * 1000,
                                                     "step": step, "val_loss": train_loss(step, P) + 0.1,
                                                     "train_loss": train_loss(step, P)})
            if step > 45:  # a WSD cooldown branch re-runs steps 46.. with another schedule
                append_jsonl(run / "metrics.jsonl", {**record, "phase": "cooldown", "loss": -1.0, "budget": 50000})
        append_jsonl(run / "metrics.jsonl", {"event": "eval", "tokens": 50000, "D": 50000, "step": 50,
                                             "val_loss": -1.0, "train_loss": -1.0, "fraction": 0.8})
        final = train_loss(STEPS, P)
        atomic_write_json(run / "summary.json", {
            "run_id": run.name, "status": "ok", "N": N, "N_total": 2 * N, "P": P, "recipe": recipe, "format": fmt,
            "granularity": gran, "scaling": timing, "smooth_swiglu": smooth, "seed": 0, "size": 1 if N < 2e5 else 2,
            "D": STEPS * 1000, "val_loss": final + 0.1, "train_loss": final, "wall_s": 1.0, "tokens_per_s": 1e4,
            "evals": [{"D": 50000, "step": 50, "val_loss": final + 0.2, "train_loss": final},
                      {"D": STEPS * 1000, "step": STEPS, "val_loss": final + 0.1, "train_loss": final}]})
    return sweep


def valid_image(path: Path) -> None:
    image = plt.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert image[..., :3].std() > 0.01  # something is drawn, not a blank canvas


def valid_pdf(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(b"%PDF") and len(data) > 1000


# --------------------------------------------------------------------------------------------
# Curves
# --------------------------------------------------------------------------------------------


def test_flatten_record_names_telemetry_by_role_and_reduces_layer_lists():
    record = {"step": 3, "loss": 2.5, "telemetry": {"grad": {"amax": 4.0, "block_amax": {"p50": 0.5}},
                                                    "act_max": [1.0, 7.5, 3.0]}, "notes": ["a", "b"]}
    assert curves.flatten_record(record) == {"step": 3, "loss": 2.5, "grad_amax": 4.0, "grad_block_amax_p50": 0.5,
                                             "act_max": 7.5}


def test_load_curves_keeps_the_trunk_and_merges_its_evals(tmp_path):
    df = curves.load_curves(write_curve_runs(tmp_path))
    assert df["run_id"].nunique() == len(CURVE_RUNS)
    assert len(df) == len(CURVE_RUNS) * STEPS  # one row per (run, step): cooldown records left out
    assert (df["loss"] > 0).all() and not (df.get("val_loss") == -1.0).any()
    run = df[df["run_id"] == "fp8-1-1e+05"].set_index("step")
    assert run.loc[20, "val_loss"] == pytest.approx(train_loss(20, 8) + 0.1)
    assert math.isnan(run.loc[21, "val_loss"])
    assert run.loc[37, "loss"] == pytest.approx(train_loss(37, 8))
    assert run.loc[37, "swiglu_max"] == swiglu_peak(37, True) and run.loc[37, "act_max"] == 4.0  # max over layers
    assert run.loc[8, "activation_block_amax_min"] == 0.0 and run.loc[9, "activation_block_amax_min"] == 0.02
    assert run.loc[9, "tokens"] == 9000
    assert bool(run["smooth_swiglu"].iloc[0]) and run["P"].iloc[0] == 8 and run["N"].iloc[0] == 1e5
    assert list(df.columns[:5]) == ["run_id", "sweep", "step", "tokens", "loss"]


def test_export_curves_is_small_and_keeps_ends_and_evals(tmp_path):
    rows = [{"run_id": f"r{r}", "sweep": "s", "step": s, "tokens": 512 * s, "loss": 3.0 - 1e-5 * s, "lr": 1e-3,
             "val_loss": 3.1 if s % 1000 == 0 else np.nan, "activation_amax": float(s % 17)}
            for r in range(20) for s in range(1, 5001)]
    df = pd.DataFrame(rows)
    path = curves.export_curves(df, tmp_path / "c.parquet", max_points=100)
    back = curves.load_curves(path)
    assert path.stat().st_size < 1_000_000
    per_run = back.groupby("run_id")["step"]
    assert per_run.min().eq(1).all() and per_run.max().eq(5000).all()
    assert per_run.size().max() <= 100 + 5
    assert back["val_loss"].notna().groupby(back["run_id"]).sum().eq(5).all()  # every eval step kept
    early = back[(back.run_id == "r0") & (back.step <= 50)]
    assert len(early) >= 20  # log spacing: the fast early part of training is resolved


def test_amax_long_separates_tensor_and_block_statistics():
    wide = pd.DataFrame({"run_id": ["a", "a"], "step": [1, 2], "tokens": [10, 20], "weight_amax": [2.0, 3.0],
                         "weight_block_amax_min": [0.0, 0.1], "weight_block_amax_p50": [1.0, 1.5],
                         "weight_frac_saturated": [0.0, 0.0], "act_max": [5.0, 6.0]})
    long = curves.amax_long(wide)
    assert len(long) == 6
    tensor = long[long["granularity"] == "tensor"]
    assert tensor["amax"].tolist() == [2.0, 3.0] and set(tensor["role"]) == {"weight"}
    block = long[long["granularity"] == "block"].set_index(["stat", "step"])["amax"]
    assert block[("min", 1)] == 0.0 and block[("p50", 2)] == 1.5


def test_malformed_curves_are_an_error(tmp_path):
    with pytest.raises(ConfigError, match="loss"):
        curves.validate_curves(pd.DataFrame({"run_id": ["a"], "step": [1]}))
    with pytest.raises(ConfigError, match="numbers"):
        curves.validate_curves(pd.DataFrame({"run_id": ["a"], "step": [1], "loss": ["low"]}))


# --------------------------------------------------------------------------------------------
# Labels and inputs
# --------------------------------------------------------------------------------------------


def test_precision_labels_and_order():
    assert plots.precision_label(16, "fp16") == "FP16" and plots.precision_label(16, "bfloat16") == "BF16"
    assert plots.precision_label(8, "fp8_e4m3", "mxfp8") == "FP8" and plots.precision_label(4, "int4") == "INT4"
    assert plots.precision_label(12, "e5m6") == "12-bit"
    assert plots.precision_order(["FP4", "12-bit", "FP32", "INT4", "BF16"]) == ["FP32", "BF16", "FP4", "12-bit", "INT4"]


def fake_isoflop_results(p_star: float = 5.0, noise: float = 0.005, seed: int = 0) -> pd.DataFrame:
    """An IsoFLOP study as runs record it (FLOPs by part): sizes 1-5 x fp32 / fp8 / mxfp4, each
    evaluated exactly at two budgets (bits cost model), loss from the kumar law."""
    from scaling.train import compute

    rng = np.random.default_rng(seed)
    rows = []
    for size in range(1, 6):
        cfg = ladder.config_for_size(size, seq_len=64)
        N = ladder.param_counts(cfg)["non_embedding"]
        for recipe, P in (("fp32", 32), ("fp8", 8), ("mxfp4", 4)):
            cols = compute.columns(cfg, recipe, 1024)
            per_token = compute.get("bits").per_token(pd.DataFrame([cols]))[0]
            for budget in (3e11, 1e12):
                D = budget / per_token
                loss = float(kumar_loss(N, D, P, p_star / X_KAPPA3)) + noise * rng.normal()
                rows.append({**cols, "run_id": f"{recipe}-{size}", "sweep": "iso", "N": N, "D": D, "P": P,
                             "recipe": recipe, "seed": 0, "val_loss": loss, "train_loss": loss, "status": "ok",
                             "budget": budget, "budget_cost": "bits"})
    return pd.DataFrame(rows)


def test_malformed_results_are_an_error():
    with pytest.raises(ConfigError, match="val_loss"):
        plots.validate_results(fake_results().drop(columns=["val_loss"]))
    with pytest.raises(ConfigError, match="numbers"):
        plots.validate_results(fake_results().assign(N="big"))


# --------------------------------------------------------------------------------------------
# Figures from a fitted law
# --------------------------------------------------------------------------------------------


HELDOUT = {"by": "N", "threshold": 2e6, "n_train": 45, "n_test": 15, "mare": 0.012,
           "params": {**LAW, "gamma": 2.0, "kappa": 3.0}}  # as fit.holdout_error returns it


def fake_fit(p_star: float, n_samples: int = 12, seed: int = 0, heldout: dict | None = None):
    """A kumar fit as `scaling fit` writes it (JSON dict -> FitResult): the true law whose sweet spot is
    `p_star`, with bootstrap samples spread 3% around it. Fitting for real costs ~40 s on 2 shared
    cores; the fitting itself is tested in test_fit.py."""
    from scaling.study.analysis import fit

    rng = np.random.default_rng(seed)
    params = {**LAW, "gamma": p_star / X_KAPPA3, "kappa": 3.0}
    free = [k for k in params if k != "kappa"]
    samples = {k: (params[k] * np.exp(0.03 * rng.normal(size=n_samples))).tolist() for k in free}
    return fit.FitResult.from_dict({
        "law": "kumar", "params": params, "fixed": {"kappa": 3.0}, "objective": 1e-3, "residuals": [],
        "ci": {k: [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))] for k, v in samples.items()}
        if n_samples else {},
        "bootstrap": {"n": n_samples, "seed": seed, "level": 0.95, "unit": "run_id", "samples": samples}
        if n_samples else None, "heldout": heldout})


@pytest.mark.slow
def test_every_figure_is_written_as_png_and_pdf(tmp_path):
    from scaling.study.analysis.pstar import optimal

    results = fake_results(p_star=5.0)
    law = fake_fit(5.0, heldout=HELDOUT)
    curve_df = curves.load_curves(write_curve_runs(tmp_path / "runs"))
    # granularity × format needs runs at several granularities: relabel a few FP8/FP4 ladder runs
    results.loc[results["run_id"].str.startswith("fp8-2e+05"), ["granularity"]] = "block"
    results.loc[results["run_id"].str.startswith("fp8-5e+05"), ["granularity", "scaling"]] = ["tensor", "delayed"]
    results.loc[results["run_id"].str.startswith("fp4-2e+05"), ["granularity"]] = "mx"
    results["sweep"] = "granularity"  # figure 5's sweep; the main study is the IsoFLOP design
    results = pd.concat([fake_isoflop_results(), results], ignore_index=True)
    from scaling.study.analysis import findings as findings_lib

    facts = {**findings_lib.findings(plots.study_part(plots.validate_results(results), "main"), law),
             "cost_models": chip_facts()}
    made = plots.make_figures(results, law, tmp_path / "out", curves=curve_df, facts=facts)
    assert [f.number for f in made] == [1, 2, 3, 4, 5, 6, 7, 9, 10]  # no figure 8: REPORT's cluster table
    assert all(isinstance(f, plots.Figure) for f in made), [f for f in made if isinstance(f, plots.Skipped)]
    for f in made:
        valid_image(f.png)
        valid_pdf(f.pdf)
        assert f.png.parent == tmp_path / "out"
    assert made[0].caption.startswith("at C = 3e11: ") and "at C = 1e12: " in made[0].caption
    best = optimal.optimal_precision(law, compute=1e12, cost=optimal.Cost(share=optimal.share_of(law)))
    assert f"P* = {best['P']:.3g} bits" in made[1].caption
    # residuals: the law is the truth up to noise 0.005, so no recipe's mean residual is far off
    assert made[7].caption.startswith("mean residual (observed - fitted, nats/byte): fp32 ")
    # amax figure: every 4th logged step of every run has an all-zero block (min = 0 of 3 block stats)
    assert made[5].caption.startswith(
        "weight: per-tensor amax 2, per-block amax 0–360 (25% of logged smallest-block amax exactly 0); "
        "activation: per-tensor amax 301–360, per-block amax 0–360")  # 15 of 60 steps, per role
    # outliers: the peak |SwiGLU output| is at the last step, with and without Smooth-SwiGLU
    assert made[6].caption.startswith("peak largest |SwiGLU output|")
    assert f"{plots._fmt(swiglu_peak(STEPS, False))} with Smooth-SwiGLU off" in made[6].caption
    assert f"{plots._fmt(swiglu_peak(STEPS, True))} with Smooth-SwiGLU on" in made[6].caption


def test_heldout_points_are_predicted_by_the_heldout_fit():
    ok = plots.validate_results(fake_results())
    law = fake_fit(5.0, n_samples=0, heldout=HELDOUT)
    mask = plots.heldout_mask(law, ok)
    assert mask.sum() == 15 and (ok.loc[mask, "N"] == 2e6).all()
    predicted = plots.heldout_predictions(law, ok, mask)
    expected = kumar_loss(ok["N"], ok["D"], ok["P"], np.where(mask, 2.0, 5.0 / X_KAPPA3))
    np.testing.assert_allclose(predicted, expected, rtol=1e-12)
    by_compute = fake_fit(5.0, n_samples=0, heldout={**HELDOUT, "by": "compute", "threshold": 6 * 1e6 * 1.25e7})
    # 6·N·D >= 7.5e13 only for (N, D) = (1e6, 1.25e7) and (2e6, 1.25e7), 5 precisions each
    assert plots.heldout_mask(by_compute, ok).sum() == 10
    assert plots.heldout_mask(fake_fit(5.0, n_samples=0), ok) is None


@pytest.mark.slow
def test_absent_inputs_are_skipped_not_errors(tmp_path):
    made = plots.make_figures(fake_results(), None, tmp_path, curves=None)
    skipped = {f.number: f.reason for f in made if isinstance(f, plots.Skipped)}
    assert set(skipped) == {1, 2, 3, 4, 5, 6, 7, 9, 10} and len(made) == 9  # no figure 8
    assert "no budget with IsoFLOP profiles" in skipped[1] and "no fitted law" in skipped[2]
    assert "no per-step curves" in skipped[4]
    assert "no granularity sweep" in skipped[5]  # fake_results is a named sweep of its own
    assert "no per-chip verdicts" in skipped[10]
    # a study of named sweeps without a granularity sweep: recipes that differ in format, size and tokens at
    # once are not a scale-scheme comparison, even where one size ran two schemes
    mixed = fake_results()
    mixed.loc[mixed["run_id"].str.startswith("fp8-2e+05"), "granularity"] = "block"
    assert plots._need_granularity(mixed) is None
    assert "no model size trained with two or more scaling schemes" in plots._need_granularity(fake_results())
    made = plots.make_figures(mixed.assign(sweep="isoflop"), None, tmp_path / "iso", curves=None)
    assert "no granularity sweep" in next(f.reason for f in made if f.number == 5)


def test_figures_cli_errors_on_malformed_inputs(tmp_path, capsys):
    good = tmp_path / "results.csv"
    fake_results().to_csv(good, index=False)
    bad_fit = tmp_path / "fit.json"
    bad_fit.write_text('{"law": "kumar", "params": ')
    assert cli.main(["figures", "--results", str(good), "--fit", str(bad_fit), "--out", str(tmp_path / "o")]) == 2
    assert "fit" in capsys.readouterr().err
    no_loss = tmp_path / "no_loss.csv"
    fake_results().drop(columns=["val_loss"]).to_csv(no_loss, index=False)
    assert cli.main(["figures", "--results", str(no_loss), "--out", str(tmp_path / "o")]) == 2
    assert "val_loss" in capsys.readouterr().err
    assert cli.main(["figures", "--results", str(tmp_path / "absent.csv")]) == 2
    assert cli.main(["figures", "--results", str(good), "--compute", "-1"]) == 2
    assert not (tmp_path / "o" / "REPORT.md").exists()


def test_heldout_caption_reports_the_extrapolation(tmp_path):
    ok = plots.validate_results(fake_results())
    law = fake_fit(5.0, n_samples=0, heldout=HELDOUT)
    mask = plots.heldout_mask(law, ok)
    figure = plots.fitted_vs_observed(law, ok, tmp_path / "f3", mask)
    rel = np.abs(plots.heldout_predictions(law, ok, mask) / ok["val_loss"] - 1)
    full = np.abs(law.predict(ok) / ok["val_loss"] - 1)  # in-sample: the full fit on every point, as REPORT states it
    assert (f"mean |rel. error| of the fit on its {len(ok)} points: {full.mean():.2%}; fitted without the {mask.sum()} "
            f"held-out points, the law predicts them within {rel[mask].mean():.2%}") in figure.caption
    assert rel[mask].mean() != pytest.approx(full.mean())
    valid_image(figure.png)


def test_each_figure_reads_its_own_sweep():
    df = pd.DataFrame({"run_id": list("abcdef"),
                       "sweep": ["ladder", "ladder", "granularity", "isocompute", "outliers", "isocompute_law"],
                       "lr": [1e-2, 1e-2, 1e-2, 1e-2, 3e-2, 1e-2]})
    assert list(plots.study_part(df, "main")["run_id"]) == ["a", "b"]
    # both halves of the direct test (cost-model sizes, the law's own N, D) are iso-compute runs
    assert list(plots.study_part(df, "law")["run_id"]) == ["a", "b", "d", "f"]
    assert list(plots.study_part(df, "isocompute")["run_id"]) == ["d", "f"]
    assert list(plots.study_part(df, "granularity")["run_id"]) == ["c"]
    # a single sweep is its own main study; a part with no rows falls back to the whole table
    only = df[df["sweep"] == "granularity"]
    assert plots.study_part(only, "main").equals(only) and plots.study_part(df.drop(columns="sweep"), "outliers") is not None
    assert len(plots.study_part(df[df["sweep"] == "ladder"], "outliers")) == 2
    with pytest.raises(ValueError, match="study part"):
        plots.study_part(df, "everything")
    curves_df = pd.DataFrame({"run_id": ["e", "e", "a"], "lr": [0.0, 3e-2, 1e-2]})
    assert list(plots.with_base_lr(curves_df, df)["base_lr"]) == [3e-2, 3e-2, 1e-2]


def test_granularity_figure_draws_every_run_at_a_single_size(tmp_path, monkeypatch):
    # one size only (a real granularity sweep): every axis must show the points, not an empty frame
    results = fake_results(p_star=5.0)
    results = results[(results["N"] == results["N"].min()) & results["P"].isin([8, 4])].copy()
    results.loc[results["P"] == 8, ["granularity", "scaling"]] = ["block", "delayed"]
    drawn = {}

    def keep(fig, stem):
        drawn["axes"] = [ax for ax in fig.axes if ax.get_title()]
        return stem.with_suffix(".png"), stem.with_suffix(".pdf")

    monkeypatch.setattr(figure_base, "_save", keep)
    plots.granularity_format(results, tmp_path / "fig5")
    final = plots.final_rows(results)
    for ax in drawn["axes"]:
        lo, hi = ax.get_ylim()
        shown = [y for line in ax.lines for y in line.get_ydata() if np.isfinite(y)]
        assert shown and lo <= min(shown) and max(shown) <= hi
    assert len(drawn["axes"]) == 2 and lo <= final["val_loss"].min() and final["val_loss"].max() <= hi


@pytest.mark.slow
def test_iso_loss_marks_the_fitted_sizes(tmp_path):
    from scaling.study.analysis import fit

    law = fake_fit(5.0, n_samples=0).to_dict()
    with_sizes = fit.FitResult.from_dict({**law, "data": {"columns": {"N": {"min": 3e5, "max": 2e6}}}})
    assert plots.fitted_sizes(with_sizes) == (3e5, 2e6) and plots.fitted_sizes(law) is None
    made = plots.iso_loss(with_sizes, 1.5e13, tmp_path / "fig2")
    assert made.caption.endswith("hatched: the model sizes the law was fitted on (3e05–2e06).")
    valid_image(made.png)
    # N*(P) wholly outside the fitted sizes is drawn dashed and called an extrapolation
    small = fit.FitResult.from_dict({**law, "data": {"columns": {"N": {"min": 1e2, "max": 1e3}}}})
    made = plots.iso_loss(small, 1.5e13, tmp_path / "fig2s")
    assert "dashed where it lies outside the fitted sizes (an extrapolation: all of it)" in made.caption
    assert "dashed" not in plots.iso_loss(fit.FitResult.from_dict(law), 1.5e13, tmp_path / "fig2n").caption


def test_figures_cli_finds_a_sweeps_curves_beside_its_summary(tmp_path, capsys, monkeypatch):
    """`scaling figures --results X.csv` reads the X_curves.parquet the sweep writes beside it (figures 4, 6
    and 7 were skipped for the README tour's own command); --curves still wins."""
    import shutil

    from scaling.study.report import writer as report

    root = Path(__file__).resolve().parents[2] / "results"
    for name in ("quick.csv", "quick_curves.parquet"):
        shutil.copy(root / name, tmp_path / name)
    seen = {}

    def write_report(results, fit, out, *, curves=None, **kwargs):
        seen["curves"] = curves
        return Path(out) / "REPORT.md"

    monkeypatch.setattr(report, "write_report", write_report)
    assert cli.main(["figures", "--results", str(tmp_path / "quick.csv"), "--out", str(tmp_path / "o")]) == 0
    assert seen["curves"] is not None and seen["curves"]["run_id"].nunique() == 12
    assert f"curves: {tmp_path / 'quick_curves.parquet'} (beside --results)" in capsys.readouterr().out
    (tmp_path / "quick_curves.parquet").rename(tmp_path / "other.parquet")
    assert cli.main(["figures", "--results", str(tmp_path / "quick.csv"), "--out", str(tmp_path / "o")]) == 0
    assert seen["curves"] is None


def test_the_amax_figure_says_why_a_gradient_block_is_zero(tmp_path):
    rows = [{"run_id": r, "tokens": t, "role": "grad", "granularity": g, "stat": st, "amax": a}
            for r in ("a", "b") for t in (1e3, 1e4) for g, st, a in (("tensor", "amax", 1e-3), ("block", "min", 0.0),
                                                                   ("block", "p50", 1e-4), ("block", "max", 1e-3))]
    made = plots.amax_distributions(pd.DataFrame(rows), tmp_path / "fig6")
    assert ("100% of logged smallest-block amax exactly 0: the qkv projection's output gradient, whose query part is "
            "zero at each sequence's first position") in made.caption


# --------------------------------------------------------------------------------------------
# One style per recipe, labels that say what is quantised, the per-chip figure, no figure 8
# --------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def committed_results() -> pd.DataFrame:
    return pd.read_csv(ROOT / "results" / "isoflop.csv")


def test_every_recipe_of_the_committed_study_has_its_own_style_in_its_familys_hue():
    """Figure 1 drew 13 recipes in a palette of 10 (fp8 and quartet both orange, bf16 and nvfp4-nvidia both
    dark blue): every recipe now has one (colour, marker), from its name and the study's recipe list alone."""
    df = committed_results()
    for recipes in (sorted(df.loc[df["sweep"] == "isoflop", "recipe"].unique()), sorted(df["recipe"].unique())):
        styles = figure_base.recipe_styles(recipes)
        assert len({(c, m) for c, m, _ in styles.values()}) == len(recipes) == len(styles)
        # deterministic: the order the list comes in changes nothing
        assert {r: figure_base.recipe_style(r, recipes[::-1]) for r in recipes} == styles
    family = figure_base.recipe_family
    assert [family(r) for r in ("bf16", "fp32", "fp8", "fp8-delayed", "mxfp6", "fp6-block", "mxfp4-activations",
                                "nvfp4-nvidia", "quartet", "quartet-full", "int4-fwd", "int8-fwd", "custom")] == \
        ["FP32/BF16", "FP32/BF16", "FP8", "FP8", "FP6", "FP6", "FP4", "FP4", "FP4", "FP4", "INT", "INT", "other"]
    iso = sorted(df.loc[df["sweep"] == "isoflop", "recipe"].unique())
    colour = {r: figure_base.recipe_style(r, iso)[0] for r in iso}
    assert colour["bf16"] in figure_base.FAMILY_COLOURS["FP32/BF16"] and colour["fp8"] in figure_base.FAMILY_COLOURS["FP8"]
    assert colour["quartet"] in figure_base.FAMILY_COLOURS["FP4"] and colour["int4-fwd"] in figure_base.FAMILY_COLOURS["INT"]
    # no colour is shared across families: a hue names a family
    families = list(figure_base.FAMILY_COLOURS.values())
    assert len({c for f in families for c in f}) == sum(len(f) for f in families)


def test_a_recipes_label_says_what_it_quantises_not_its_widest_role():
    """P is the widest of a recipe's roles: mxfp4-activations has P = 16, and Figure 1 called it '16 bits'."""
    bits = figure_base.role_bits(committed_results())
    label = figure_base.recipe_label
    assert label("mxfp4-activations", bits["mxfp4-activations"]) == "mxfp4-activations (4-bit activations)"
    assert label("mxfp4-weights", bits["mxfp4-weights"]) == "mxfp4-weights (4-bit weights)"
    assert label("int4-fwd", bits["int4-fwd"]) == "int4-fwd (4-bit weights, activations)"  # gradients in FP32
    assert label("fp8", bits["fp8"]) == "fp8 (8-bit)" and label("bf16", bits["bf16"]) == "bf16 (16-bit)"
    assert label("fp8", 8.0) == "fp8 (8-bit)" and label("fp8") == "fp8"
    assert figure_base.role_bits(fake_results()) == {}  # no role columns: no role bits


def isoflop_entry(recipes: Sequence[str], budget: float = 1e12) -> tuple[dict, pd.DataFrame]:
    """A figure-1 budget (as analysis.isoflop writes it) with each recipe's parabola through three sizes."""
    entries, rows = [], []
    for i, recipe in enumerate(recipes):
        c2, n_opt = 0.05, 1e5 * (1 + 0.1 * i)
        c1 = -2 * c2 * math.log(n_opt)
        c0 = 2.0 + 0.01 * i + c2 * math.log(n_opt) ** 2
        for n in (5e4, 1e5, 2e5):
            rows.append({"run_id": f"{recipe}-{n:g}", "recipe": recipe, "N": n, "loss": c0 + c1 * math.log(n) + c2 * math.log(n) ** 2})
        loss = 2.0 + 0.01 * i
        entries.append({"recipe": recipe, "P": 16.0 if recipe == "mxfp4-activations" else 4.0, "runs": 3,
                        "parabola": [c0, c1, c2], "ci": [loss - 0.01, loss + 0.01], "loss": loss, "N_opt": n_opt})
    entry = {"budget": budget, "cost_model": "bits", "winner": None, "reason": "cannot tell", "recipes": entries}
    return entry, pd.DataFrame(rows)


def captured(monkeypatch) -> dict:
    drawn = {}

    def keep(fig, stem):
        drawn["fig"] = fig
        return Path(stem).with_suffix(".png"), Path(stem).with_suffix(".pdf")

    monkeypatch.setattr(figure_base, "_save", keep)
    return drawn


def test_figure_1_draws_the_committed_recipes_each_in_its_own_style_and_labelled_by_what_it_quantises(tmp_path, monkeypatch):
    df = committed_results()
    recipes = sorted(df.loc[df["sweep"] == "isoflop", "recipe"].unique())
    drawn = captured(monkeypatch)
    plots.isoflop_profiles([isoflop_entry(recipes)], tmp_path / "fig1", recipes=recipes, bits=figure_base.role_bits(df))
    handles = drawn["fig"].legends[0].legend_handles
    assert len(handles) == len(recipes)
    styles = {(matplotlib.colors.to_hex(h.get_color()), h.get_marker()) for h in handles}
    assert len(styles) == len(recipes)
    labels = [h.get_label() for h in handles]
    assert "mxfp4-activations (4-bit activations)" in labels and not any("16" in lab for lab in labels if "mxfp4" in lab)
    # the points carry the same markers as the legend: a recipe's style is one thing
    points = [c for c in drawn["fig"].axes[0].collections if c.get_label().startswith("quartet-full")]
    assert points and matplotlib.colors.to_hex(points[0].get_facecolor()[0]) == figure_base.recipe_style("quartet-full", recipes)[0]
    plt.close("all")


def chip_facts() -> dict:
    """findings' cost_models as scaling.study.analysis.chips.chip_verdicts writes it: two chips, two budgets."""
    def budget(ref, rows, tied, winner):
        return {"budget_reference": ref, "budget": ref, "tied": tied, "winner": winner, "compared": len(rows),
                "recipes": [{"recipe": r, "loss": l, "loss_se": se, "diff": d, "diff_ci": ci, "notes": []}
                            for r, l, se, d, ci in rows]}
    rows = [("fp8", 1.50, 0.01, 0.0, None), ("bf16", 1.55, 0.01, 0.05, [0.02, 0.08]),
            ("nvfp4", 1.52, 0.5, 0.02, [-1.5, 1.5]), ("mxfp4", 1.60, 0.01, 0.10, [0.07, 0.13])]
    late = [(r, l - 0.2, se if r != "nvfp4" else 0.012, d, ci) for r, l, se, d, ci in rows]
    return {"level": 0.95, "familywise": {"z": 2.5, "m": 6},
            "chips": {"h100": {"budgets": [budget(1e12, rows, ["fp8", "nvfp4"], None), budget(1e13, late, ["fp8"], "fp8")]},
                      "bits": {"budgets": [budget(1e12, rows, ["fp8", "nvfp4"], None), budget(1e13, late, ["fp8"], "fp8")]}}}


def test_the_per_chip_answer_is_a_figure_with_each_recipes_interval(tmp_path, monkeypatch):
    drawn = captured(monkeypatch)
    made = plots.chip_verdicts(chip_facts(), tmp_path / "fig10", "nats/byte", recipes=["bf16", "fp8", "mxfp4", "nvfp4", "fp32"])
    fig = drawn["fig"]
    assert made.number == 10 and made.title == plots.TITLES[10]
    assert len([ax for ax in fig.axes if ax.get_title().startswith("C = ")]) == 2  # one panel per budget
    top = fig.axes[0]
    # the bits model first, then the chips; each tick names the verdict
    assert [t.get_text() for t in top.get_xticklabels()] == ["bits (idealised)\n2 tied", "H100\n2 tied"]
    assert [t.get_text() for t in fig.axes[1].get_xticklabels()] == ["bits (idealised)\nfp8", "H100\nfp8"]
    # bf16's interval is loss ± z·se with the family-wise z
    bars = [line for line in top.lines if len(line.get_xdata()) == 2 and line.get_ydata()[0] != line.get_ydata()[1]]
    assert any(np.allclose(line.get_ydata(), [1.55 - 2.5 * 0.01, 1.55 + 2.5 * 0.01]) for line in bars)
    assert "loss ± 2.50·se, the family-wise z the verdicts use" in made.caption
    # nvfp4's interval (± 1.25) would flatten the panel: it is cut at the edge and the caption says so
    assert top.get_ylim()[1] < 1.7 and "nvfp4 at C = 1e12 (± 1.2, on every chip)" in made.caption
    assert "at C = 1e13: fp8 on bits (idealised), fp8 on H100" in made.caption
    # the recipes keep figure 1's styles
    handles = {h.get_label(): h for h in fig.legends[0].legend_handles}
    study = ["bf16", "fp8", "mxfp4", "nvfp4", "fp32"]
    assert {lab: (h.get_color(), h.get_marker()) for lab, h in handles.items()} == \
        {r: figure_base.recipe_style(r, study)[:2] for r in ("bf16", "fp8", "mxfp4", "nvfp4")}
    plt.close("all")


def test_figure_8_is_gone_and_figure_10_needs_per_chip_verdicts(tmp_path, monkeypatch):
    """Figure 8 was a table drawn as an image (REPORT has it as a table); no other figure is renumbered."""
    monkeypatch.setattr(figure_base, "_save", lambda fig, stem: (Path(stem).with_suffix(".png"), Path(stem).with_suffix(".pdf")))
    assert 8 not in plots.TITLES and 8 not in plots.STEMS and plots.STEMS[9] == "fig9_residuals"
    assert not hasattr(plots, "cluster_table")
    made = plots.make_figures(fake_results(), None, tmp_path, curves=None)
    assert [f.number for f in made] == [1, 2, 3, 4, 5, 6, 7, 9, 10]
    assert "no per-chip verdicts" in made[-1].reason
    facts = {"budgets": [], "cost_models": chip_facts()}
    made = plots.make_figures(fake_results(), None, tmp_path, curves=None, facts=facts)
    assert isinstance(made[-1], plots.Figure) and made[-1].number == 10
    plt.close("all")


def test_the_cluster_table_drops_the_columns_no_row_fills():
    """Without a law optimum planned, P, N and D are empty in every row: REPORT's table had three '–' columns."""
    table = plots.cluster_time_table(None)
    text = plots.table_markdown(table)
    header = text.splitlines()[0]
    assert "P (bits)" not in header and "| N |" not in header and "| D |" not in header
    assert header.startswith("| run | hardware | FLOPs | days @ 1,024 GPUs")
    assert all(row.count("|") == header.count("|") for row in text.splitlines())
    filled = table.assign(N=[1e9] + [None] * (len(table) - 1))
    assert "| N |" in plots.table_markdown(filled).splitlines()[0]  # a column one row fills is kept
