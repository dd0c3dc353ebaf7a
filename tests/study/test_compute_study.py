"""FLOPs by part against the dots in the compiled step, effective bits, cost models, IsoFLOP statistics."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from flax import nnx

from scaling.study.analysis import isoflop as analysis
from scaling.study.analysis import findings as findings_lib
from scaling.study.sweeps import design
from scaling.train import compute
from scaling.train import config, ladder, model
from scaling.numerics import precision


def _dot_flops(jaxpr) -> float:
    """2·(output elements)·(contracted length) summed over every dot_general, sub-jaxprs included."""
    total = 0.0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (contract_lhs, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            k = math.prod(lhs[i] for i in contract_lhs)
            total += 2.0 * math.prod(eqn.outvars[0].aval.shape) * k
        repeats = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1  # the layer stack
        for sub in jax.core.subjaxprs(eqn) if hasattr(jax.core, "subjaxprs") else _subjaxprs(eqn):
            total += repeats * _dot_flops(sub)
    return total


def _subjaxprs(eqn):
    for v in eqn.params.values():
        for item in (v if isinstance(v, (list, tuple)) else [v]):
            if hasattr(item, "jaxpr") and hasattr(item, "consts"):
                yield item.jaxpr
            elif hasattr(item, "eqns"):
                yield item


@pytest.mark.slow
@pytest.mark.parametrize("size,seq_len", [(1, 16), (2, 32), (3, 24)])
def test_flops_by_part_equal_the_dots_of_a_training_step(size, seq_len, monkeypatch):
    cfg = ladder.config_for_size(size, seq_len=seq_len)
    batch = 2
    tokens = jnp.zeros((batch, seq_len + 1), jnp.int32)

    def step_dots():
        m = model.Transformer(cfg, "fp32", rngs=nnx.Rngs(0))
        graphdef, state = nnx.split(m)

        def loss(state):
            return model.loss_fn(nnx.merge(graphdef, state), tokens)[0]

        return _dot_flops(jax.make_jaxpr(jax.grad(loss))(state).jaxpr)

    executed = step_dots()  # on CPU: the flash-style attention, whose backward recomputes Q·Kᵀ
    # compute.parts counts model FLOPs (the function, as MFU does), so count the dense form
    monkeypatch.setattr(model, "_causal_attention", lambda q, k, v, *precision: jax.nn.dot_product_attention(
        q, k, v, is_causal=True, implementation="xla"))
    counted = step_dots()
    parts = compute.parts(cfg, "fp32", batch * seq_len)
    assert sum(p.flops for p in parts) * batch * seq_len == pytest.approx(counted, rel=1e-9)
    if jax.default_backend() == "cpu":  # one block (seq_len <= ATTENTION_CHUNK): + one Q·Kᵀ per layer
        recompute = 2.0 * cfg.n_layers * seq_len * cfg.d_model * batch * seq_len
        assert executed == pytest.approx(counted + recompute, rel=1e-9)
    # and the Chinchilla-convention total the runs always recorded
    assert sum(p.flops for p in parts) == pytest.approx(ladder.flops_per_token(cfg), rel=1e-12)


@pytest.mark.slow
def test_effective_bits_per_recipe():
    cfg = ladder.config_for_size(4, seq_len=64)  # d_model 128: every reduction axis >= 128
    bits = {name: compute.columns(cfg, name, 1024)["bits_eff"] for name in
            ("fp32", "bf16", "fp8", "mxfp8", "mxfp6", "mxfp4", "nvfp4")}
    assert bits == pytest.approx({"fp32": 32, "bf16": 16, "fp8": 8, "mxfp8": 8.25, "mxfp6": 6.25,
                                  "mxfp4": 4.25, "nvfp4": 4.5})
    blockwise = compute.columns(cfg, "fp8-blockwise", 1024)
    # activations/grads 1x128 (+32/128), weights 128x128 (+32/128²)
    assert blockwise["bits_fprop_0"] == pytest.approx(8.25)
    assert blockwise["bits_fprop_1"] == pytest.approx(8 + 32 / 128 ** 2)
    fwd_only = compute.columns(cfg, "experiments/recipes/fp8-forward-only.toml", 1024)
    assert fwd_only["bits_dgrad_0"] == fwd_only["bits_wgrad_1"] == 32 and fwd_only["P_g"] == 32
    # as costed, the unquantised backward of a quantised run counts at 16 bits (fprop 8, dgrad and wgrad 16),
    # not the raw 32 (bits_eff (8 + 32 + 32) / 3 = 24): what the IsoFLOP tables must show
    rows = pd.DataFrame([compute.columns(cfg, r, 1024) for r in
                         ("experiments/recipes/fp8-forward-only.toml", "fp32", "bf16", "fp8")])
    assert fwd_only["bits_eff"] == pytest.approx(24)
    assert compute.get("bits").effective_bits(rows) == pytest.approx([40 / 3, 32, 16, 8])
    assert analysis.with_cost(rows.assign(N=1e6, D=1e6), compute.get("bits"))["bits_eff"].tolist() == \
        pytest.approx([40 / 3, 32, 16, 8])
    assert compute.columns(cfg, "fp8", 1024)["bits_attn_fwd_0"] == 32  # attention stays unquantised


def test_role_columns_encode_coarse_scaling_as_long_blocks():
    cfg = ladder.config_for_size(2, seq_len=64)
    block = {name: compute.role_columns(cfg, name)["block"] for name in ("fp8", "mxfp4", "nvfp4")}
    assert block["nvfp4"] == pytest.approx(16) and block["mxfp4"] == pytest.approx(32) and block["fp8"] > 1000
    err = {name: compute.role_columns(cfg, name)["qerr_w"] for name in ("bf16", "fp8", "mxfp6", "mxfp4")}
    # E2M3 and E4M3 share 3 mantissa bits: MXFP6 and FP8 err alike; 1 mantissa bit (FP4) errs ~15x more
    assert 0 < err["bf16"] < min(err["mxfp6"], err["fp8"]) < 10 * max(err["mxfp6"], err["fp8"]) < err["mxfp4"] < 0.05


def _table(recipes, cfg_sizes=(1, 2, 3)):
    rows = []
    for size in cfg_sizes:
        cfg = ladder.config_for_size(size, seq_len=64)
        for r in recipes:
            rows.append({"N": ladder.param_counts(cfg)["non_embedding"], "D": 1e6, "P": precision.get(r).bits,
                         **compute.columns(cfg, r, 1024)})
    return pd.DataFrame(rows)


def test_cost_models():
    df = _table(["fp32", "bf16", "fp8", "mxfp4"])
    bits, h100, b200, nominal = (compute.get(k).compute(df) for k in ("bits", "h100", "b200", "nominal"))
    flops = df[[f"flops_{p}" for p in compute.PARTS]].sum(axis=1).to_numpy() * 1e6
    r = df.index.to_numpy()
    fp32, bf16 = r[df.index % 4 == 0], r[df.index % 4 == 1]
    assert bits[fp32] == pytest.approx(2 * flops[fp32]) and bits[bf16] == pytest.approx(flops[bf16])
    assert h100[fp32] == pytest.approx(flops[fp32] * 989 / 495)
    dense = 3 * df["flops_fprop"].to_numpy() * 1e6
    mx4 = r[df.index % 4 == 3]
    # H100 runs FP4 at the FP8 rate (2x BF16), B200 at 4x; the unquantised rest at BF16
    assert h100[mx4] == pytest.approx(dense[mx4] * 989 / 1979 + (flops - dense)[mx4])
    assert b200[mx4] == pytest.approx(dense[mx4] / 4 + (flops - dense)[mx4])
    assert bits[mx4] == pytest.approx(dense[mx4] * 4.25 / 16 + (flops - dense)[mx4])
    assert nominal[mx4] == pytest.approx(6 * df["N"].to_numpy()[mx4] * 1e6 * 4 / 16)
    with pytest.raises(Exception, match="cost_model"):
        compute.get("tpu9")


def test_backfill_reproduces_recorded_columns():
    cfg = ladder.config_for_size(2, seq_len=64)
    fresh = compute.columns(cfg, "mxfp6", 16 * 64)
    old = pd.DataFrame([{"size": 2, "recipe": "mxfp6", "flops_per_token": ladder.flops_per_token(cfg)}])
    filled = compute.backfill(old).iloc[0]
    for k, v in fresh.items():
        assert filled[k] == pytest.approx(v), k


# ----------------------------------------------------------------------------- IsoFLOP statistics

def _isoflop_runs(offsets: dict, noise: float, seeds=(0, 1), budget=1e12, rng=0):
    """Synthetic runs: 7 sizes per recipe at one budget, loss = 2 + 0.5·(log N - log N*)² + offset + noise."""
    rng = np.random.default_rng(rng)
    rows = []
    cfg = ladder.config_for_size(2, seq_len=64)
    cols = compute.columns(cfg, "bf16", 1024)
    for recipe, offset in offsets.items():
        for i, N in enumerate(np.geomspace(1e5, 1e7, 7)):
            for s in seeds:
                row = {**cols, "run_id": f"{recipe}-{i}-{s}", "recipe": recipe, "seed": s, "N": N, "P": 16,
                       "status": "ok"}
                per_token = compute.get("bits").per_token(pd.DataFrame([row]))[0]
                D = budget / per_token
                loss = 2 + 0.5 * (math.log(N) - math.log(1e6)) ** 2 / 4 + offset + noise * rng.standard_normal()
                rows.append({**row, "D": D, "val_loss": loss})
    return pd.DataFrame(rows)


def test_isoflop_recovers_a_known_minimum():
    runs = _isoflop_runs({"a": 0.0, "b": 0.2}, noise=0.002)
    res = analysis.isoflop(runs, 1e12, "bits")
    a = next(e for e in res["recipes"] if e["recipe"] == "a")
    assert a["N_opt"] == pytest.approx(1e6, rel=0.1) and a["loss"] == pytest.approx(2.0, abs=0.005)
    assert a["inside"] and a["ci"][0] < 2.0 < a["ci"][1] + 0.01
    assert res["winner"] == "a" and a["p_best"] > 0.99 and res["diff_ci"][0] > 0.15


@pytest.mark.parametrize("level", [0.95, 0.80])
def test_isoflop_names_no_winner_on_noise_only(level):
    runs = _isoflop_runs({"a": 0.0, "b": 0.0, "c": 0.0}, noise=0.02, rng=3)
    res = analysis.isoflop(runs, 1e12, "bits", level=level)
    assert res["winner"] is None and "cannot tell" in res["reason"]
    assert res["sigma"] == pytest.approx(0.02, rel=0.35)


def test_isoflop_names_seed_noise_apart_from_the_parabolas_lack_of_fit():
    """sigma is the scatter about the joint fit, seed replicates included; a profile that is not a parabola
    (one recipe's sizes off its curve, which no shape effect shared by every recipe explains) inflates it. The report names both, so a reader sees which noise the CIs carry."""
    from scaling.study.report import prose

    smooth_facts = findings_lib.findings(_isoflop_runs({"a": 0.0, "b": 0.0}, noise=0.02, rng=4), None, budgets=[1e12])
    smooth = smooth_facts["budgets"][0]
    assert smooth["seed_sigma"] == pytest.approx(0.02, rel=0.35) and smooth["seed_dof"] == 14
    assert smooth["sigma"] == pytest.approx(smooth["seed_sigma"], rel=0.3)
    bumpy = _isoflop_runs({"a": 0.0, "b": 0.0}, noise=0.02, rng=4)
    bumpy["val_loss"] += np.where(bumpy["run_id"].str.contains(r"^a-[14]-"), 0.3, 0.0)  # two of a's sizes off its curve
    facts = findings_lib.findings(bumpy, None, budgets=[1e12])
    b = facts["budgets"][0]
    assert b["seed_sigma"] == pytest.approx(smooth["seed_sigma"]) and b["sigma"] > 2 * b["seed_sigma"]
    text = prose.findings_section(facts)
    assert f"seed replicates alone: {b['seed_sigma']:.3f} on 14 dof, the excess is the parabolas' lack of fit" in text
    assert "lack of fit" not in prose.findings_section(smooth_facts)
    # and the limitations paragraph says what it means
    assert "scatter about their parabolas" in prose.limitations(bumpy, None, [], None, facts["budgets"])
    assert "parabolas" not in prose.limitations(bumpy, None, [], None, smooth_facts["budgets"])


@pytest.mark.parametrize("level", [0.95, 0.80])
def test_isoflop_no_winner_when_a_minimum_is_at_the_edge(level):
    runs = _isoflop_runs({"a": 0.0, "b": 0.3}, noise=0.002)
    runs = runs[~((runs["recipe"] == "b") & (runs["N"] > 5e5))]  # b's sizes stop before its optimum
    res = analysis.isoflop(runs, 1e12, "bits", level=level)
    assert res["winner"] is None and "edge" in res["reason"]


def test_points_interpolate_between_cooldowns_but_never_extrapolate():
    cfg = ladder.config_for_size(1, seq_len=64)
    cols = compute.columns(cfg, "fp32", 1024)
    per_token = compute.get("bits").per_token(pd.DataFrame([cols]))[0]
    run = pd.DataFrame([{**cols, "run_id": "r", "recipe": "fp32", "seed": 0, "N": 1e5, "P": 32, "status": "ok",
                         "D": d, "val_loss": l} for d, l in ((1e5, 2.0), (4e5, 1.5))])
    mid = analysis.points_at(run, per_token * 2e5, "bits" and compute.get("bits"))
    assert mid["interpolated"].all() and mid["loss"].iloc[0] == pytest.approx(math.exp(0.5 * math.log(2.0) + 0.5 * math.log(1.5)))
    assert analysis.points_at(run, per_token * 8e5, compute.get("bits")).empty
    exact = analysis.points_at(run, per_token * 4e5, compute.get("bits"))
    assert not exact["interpolated"].any() and exact["loss"].iloc[0] == 1.5


@pytest.mark.parametrize("level", [0.95, 0.80])
def test_findings_and_report_claim_no_winner_on_noise_only(level):
    from scaling.study.report import prose

    runs = _isoflop_runs({"fp8": 0.0, "mxfp4": 0.0}, noise=0.02, rng=5)
    facts = findings_lib.findings(runs, None, budgets=[1e12], level=level)
    assert [b["winner"] for b in facts["budgets"]] == [None] and facts["loss_unit"] == "nats/byte"
    text = prose.findings_section(facts)
    assert "No winner" in text and "has the lowest" not in text
    clear = findings_lib.findings(_isoflop_runs({"fp8": 0.0, "mxfp4": 0.3}, noise=0.005), None, budgets=[1e12])
    assert clear["budgets"][0]["winner"] == "fp8" and "fp8 has the lowest" in prose.findings_section(clear)


def test_the_forward_only_integer_arm_is_analysed_on_its_own():
    import reference_study

    runs = _isoflop_runs({"bf16": 0.0, "int8-fwd": 0.0, "int4-fwd": 0.3, "mxfp4": -0.2}, noise=0.01)
    kind = {"bf16": ("bf16", 16, 16), "int8-fwd": ("int8", 8, 32), "int4-fwd": ("int4", 4, 32), "mxfp4": ("fp4_e2m1", 4, 4)}
    runs = runs.assign(format=runs["recipe"].map(lambda r: kind[r][0]), P=runs["recipe"].map(lambda r: kind[r][1]),
                       P_bwd=runs["recipe"].map(lambda r: kind[r][2]))
    arm = reference_study.integer_arm(runs)
    assert set(arm["recipe"]) == {"bf16", "int8-fwd", "int4-fwd"}  # not mxfp4: floating point, quantised backward
    facts = reference_study.findings(runs, None, budgets=[1e12])
    assert facts["budgets"][0]["winner"] == "mxfp4"  # across every recipe
    (at,) = facts["integer_arm"]
    assert {e["recipe"] for e in at["recipes"]} == {"bf16", "int8-fwd", "int4-fwd"}
    assert at["winner"] is None and "cannot tell" in at["reason"]  # bf16 and int8 tied under noise 0.01
    # Kumar et al.'s P is the forward precision: the recipes not ruled out, on their forward bits
    assert {m["recipe"] for m in at["measured"]} <= {"bf16", "int8-fwd"} and "int8-fwd" in {m["recipe"] for m in at["measured"]}
    assert at["P_interval"] == [min(m["P"] for m in at["measured"]), max(m["P"] for m in at["measured"])]
    assert at["P_interval"][0] == 8 and at["published"]["Kumar et al. 2024"] == findings_lib.against_range(at["P_interval"], 7, 8)
    text = reference_study.integer_arm_section(facts)
    assert "Kumar et al. 2024" in text and "No winner" in text and "int4-fwd" in text and "8 forward bits" in text
    # one integer recipe is no arm
    assert reference_study.integer_arm(runs[runs["recipe"] != "int4-fwd"]).empty
    assert reference_study.findings(runs[runs["recipe"] != "int4-fwd"], None, budgets=[1e12])["integer_arm"] == []
    # a budget the arm did not train at (only the reference and mxfp4 did) gets no integer-arm verdict
    larger = _isoflop_runs({"bf16": 0.0, "mxfp4": -0.2}, noise=0.01, budget=1e13)
    larger = larger.assign(run_id="big-" + larger["run_id"], format=larger["recipe"].map(lambda r: kind[r][0]),
                           P=larger["recipe"].map(lambda r: kind[r][1]), P_bwd=larger["recipe"].map(lambda r: kind[r][2]))
    both = reference_study.findings(pd.concat([runs, larger], ignore_index=True), None, budgets=[1e12, 1e13])
    assert [b["budget"] for b in both["budgets"]] == [1e12, 1e13]
    assert [b["budget"] for b in both["integer_arm"]] == [1e12]


def test_published_range_verdicts_use_the_whole_interval():
    assert findings_lib.against_range([7.2, 7.9], 7, 8) == "inside"
    assert findings_lib.against_range([3.7, 5.4], 7, 8) == "outside"
    assert findings_lib.against_range([3.8, 8.0], 7, 8) == "cannot tell" and findings_lib.against_range([3.8, 8.0], 4, 8) == "cannot tell"


# ----------------------------------------------------------------------------- the IsoFLOP design

DESIGN_POINT = {"name": "iso", "model": {"seq_len": 32}, "train": {"batch_size": 8, "warmup": 10, "lr": "auto"}}


def _per_token(cfg) -> float:
    return compute.get("bits").per_token(pd.DataFrame([compute.run_row(cfg)]))[0]


@pytest.mark.parametrize("recipe", ["fp32", "mxfp4"])
def test_design_lands_each_size_on_every_budget_it_serves(recipe):
    # ladder sizes plus deeper shapes at sizes 1-2's widths, which fill the ladder's 6x gap in N
    plan = design.Design.from_table({"budgets": [2e11, 6e11], "sizes": [1, {"size": 1, "n_layers": 4},
                                                                     {"size": 2, "n_layers": 2}, 2, 3, 4, 5, 6, 7, 8],
                                    "sizes_per_budget": 5, "tokens_per_param": 20, "min_steps": 20})
    (cfgs,) = design.design_runs([{**DESIGN_POINT, "precision": recipe}], plan)
    per_budget = {b: [] for b in plan.budgets}
    tokens_per_step = 8 * 32
    for cfg in cfgs:
        per_token = _per_token(cfg)
        steps = cfg.train.tokens // tokens_per_step
        assert cfg.train.lr == ladder.ladder_lr(cfg.model.size)  # "auto" resolved at each size
        assert cfg.study.cost == "bits" and len(cfg.study.flop_budgets) == len(cfg.train.eval_at)
        for fraction, budget in zip(cfg.train.eval_at, cfg.study.flop_budgets):
            landed = round(fraction * steps) * tokens_per_step * per_token
            # the nearest whole step: within half a step's compute of the budget
            assert abs(landed - budget) <= 0.5 * tokens_per_step * per_token
            per_budget[budget].append((compute.run_row(cfg)["N"], round(fraction * steps)))
    for budget, runs in per_budget.items():
        assert len(runs) == 5 and all(steps >= 20 for _, steps in runs)
        # the 5 sizes hold the eligible ladder size whose tokens per parameter are closest to 20
        eligible = []
        for size, n_layers in plan.sizes:
            cfg = config.validate({**DESIGN_POINT, "precision": recipe,
                                   "model": {"seq_len": 32, "size": size, "n_layers": n_layers}})
            steps = round(budget / _per_token(cfg) / tokens_per_step)
            if steps >= 20:
                eligible.append((abs(math.log(steps * tokens_per_step / compute.run_row(cfg)["N"] / 20)), compute.run_row(cfg)["N"]))
        assert min(eligible)[1] in {n for n, _ in runs}
        chosen = sorted(n for n, _ in runs)
        all_n = sorted(n for _, n in eligible)
        assert chosen == all_n[all_n.index(chosen[0]):all_n.index(chosen[0]) + 5]  # consecutive sizes
    assert {(c.model.size, c.model.n_layers) for c in cfgs} & {(1, 4), (2, 2)}  # the deeper shapes are used


def test_design_errors_are_one_line_and_name_the_key():
    from scaling.errors import ConfigError

    plan = design.Design.from_table({"budgets": [2e11]})
    with pytest.raises(ConfigError, match=r"^train\.warmup: got 0\.05; allowed: a whole number of steps"):
        design.design_runs([{**DESIGN_POINT, "train": {"batch_size": 8, "warmup": 0.05}}], plan)
    with pytest.raises(ConfigError, match=r"^isoflop\.budgets: got 1000000\.0; allowed: at least 2\.08e\+11 \(5 sizes"):
        design.design_runs([DESIGN_POINT], design.Design.from_table({"budgets": [1e6]}))
    with pytest.raises(ConfigError, match=r"^isoflop\.reference: got 'bf16'; allowed: a recipe of the grid \(fp32\)"):
        design.design_runs([DESIGN_POINT], design.Design.from_table({"budgets": [2e11], "reference": "bf16"}))
    with pytest.raises(ConfigError, match=r"^isoflop\.size: got 3"):
        design.Design.from_table({"budgets": [1e12], "size": 3})
    # the ladder's own depth written out is the same shape, not a second one
    assert design.Design.from_table({"budgets": [1e12], "sizes": [1, {"size": 1, "n_layers": 2}, 2, 3],
                                    "sizes_per_budget": 3}).sizes == ((1, None), (2, None), (3, None))
    with pytest.raises(ConfigError, match=r"^isoflop\.sizes\.n_layers: got 0; allowed: an integer >= 1"):
        design.Design.from_table({"budgets": [1e12], "sizes": [1, {"size": 2, "n_layers": 0}]})
    with pytest.raises(ConfigError, match=r"^isoflop\.sizes: got \{'layers': 2\}; allowed: a ladder size or"):
        design.Design.from_table({"budgets": [1e12], "sizes": [{"layers": 2}]})
    with pytest.raises(ConfigError, match=r"^isoflop\.sizes_per_budget: got 2; allowed: an integer >= 3"):
        design.Design.from_table({"budgets": [1e12], "sizes_per_budget": 2})
    with pytest.raises(ConfigError, match=r"^isoflop\.extend_edges: got 'yes'; allowed: true or false"):
        design.Design.from_table({"budgets": [1e12], "extend_edges": "yes"})


def test_warmup_in_steps_gives_a_budget_the_same_schedule_in_any_run_length():
    from scaling.train import loop as train

    short = config.validate({**DESIGN_POINT, "train": {**DESIGN_POINT["train"], "tokens": 100 * 256, "eval_at": [0.6, 1.0]}})
    long = config.validate({**DESIGN_POINT, "train": {**DESIGN_POINT["train"], "tokens": 300 * 256, "eval_at": [0.2, 1.0]}})
    a, b = train.schedule_for(short), train.schedule_for(long)
    assert a.budgets[0].end == b.budgets[0].end == 60
    lrs = [[train.learning_rate(p, t, p.budgets[0]) for t in range(60)] for p in (a, b)]
    assert lrs[0] == lrs[1]
    # with warmup as a fraction the same 60-step budget would see a different schedule
    frac = [c.replace(**{"train.warmup": 0.1}) for c in (short, long)]
    assert train.schedule_for(frac[0]).warmup_steps != train.schedule_for(frac[1]).warmup_steps


@pytest.mark.slow
def test_sweep_expands_an_isoflop_design_and_its_runs_carry_their_budgets(tmp_path):
    from scaling.study.sweeps import results, sweep
    from scaling.train import loop as train

    experiment = tmp_path / "iso.toml"
    experiment.write_text("""
name = "iso"
[model]
seq_len = 32
[data]
source = "synthetic"
eval_tokens = 256
[train]
batch_size = 8
warmup = 2
lr = 3e-3
checkpoint_every = 0
[grid]
precision = ["fp32", "fp8"]
[isoflop]
budgets = [2e10, 4e10]
sizes = [1, 2, 3]
sizes_per_budget = 3
min_steps = 4
reference = "fp32"
""")
    specs = sweep.expand(experiment)
    assert {s.config.precision for s in specs} == {"fp32", "fp8"}
    assert all(s.config.model.size in (1, 2, 3) for s in specs)
    by = {(s.config.precision, s.config.model.size): s.config for s in specs}
    for size in (1, 2, 3):  # the reference also lands on every step FP8 lands on, unlabelled
        fp8, ref = by["fp8", size], by["fp32", size]
        steps = lambda c: {round(f * c.train.tokens / 256): b for f, b in zip(c.train.eval_at, c.study.flop_budgets)}
        assert set(steps(fp8)) < set(steps(ref)) and all(steps(ref)[s] == 0 for s in steps(fp8))
        assert sorted(b for b in steps(ref).values() if b) == [2e10, 4e10]
    smallest = min((s for s in specs if s.config.precision == "fp8"), key=lambda s: s.config.train.tokens)
    train.run(smallest.config, smallest.out_dir(tmp_path / "runs"))
    df = results.load(tmp_path / "runs")
    assert sorted(df["budget"]) == sorted(smallest.config.study.flop_budgets) and (df["budget_cost"] == "bits").all()
    points = analysis.points_at(df, 4e10, compute.get("bits"))
    assert len(points) == 1 and not points["interpolated"].any()
    assert analysis.default_budgets(df, compute.get("bits")) == [2e10, 4e10]


def test_lr_optima_find_each_recipes_best_rate_and_its_shift_from_fp32():
    rows = []
    grid = 7e-3 * 2.0 ** np.arange(-1.0, 1.5, 0.5)  # 5 rates a factor sqrt(2) apart
    truth = {"fp32": 7e-3, "fp8": 7e-3 * 2 ** 0.1, "mxfp4": 7e-3 / 2 ** 0.7}
    for recipe, best in truth.items():
        for lr in grid:
            loss = 2.0 + 0.05 * (math.log2(lr) - math.log2(best)) ** 2
            rows.append({"run_id": f"{recipe}-{lr:.3g}", "recipe": recipe, "N": 1.6e5, "lr": lr, "D": 6.5e5,
                         "P": {"fp32": 32, "fp8": 8, "mxfp4": 4}[recipe], "val_loss": loss, "status": "ok"})
            rows.append({**rows[-1], "D": 3.2e5, "val_loss": loss + 1})  # an earlier evaluation: not used
    table = findings_lib.lr_optima(pd.DataFrame(rows)).set_index("recipe")
    for recipe, best in truth.items():  # a parabola through three exact points recovers the vertex
        assert table.loc[recipe, "lr"] == pytest.approx(best, rel=1e-9)
    assert table.loc["fp8", "shift"] == pytest.approx(0.1) and not table.loc["fp8", "differs"]
    assert table.loc["mxfp4", "shift"] == pytest.approx(-0.7) and table.loc["mxfp4", "differs"]
    assert (table["resolution"] == 0.5).all() and not table["edge"].any()


def test_specification_range_spans_only_laws_whose_precision_axis_is_bits():
    from scaling.study.analysis import fit

    kumar = {"E": 1.7, "A": 400.0, "B": 2000.0, "alpha": 0.34, "beta": 0.36, "gamma": 2.5, "kappa": 3.0}
    chosen = fit.FitResult(law="quartet", params={}, objective=0.0, residuals=np.zeros(0))
    chosen.selection = {"chosen": "quartet", "candidates": [
        {"name": "quartet", "law": "quartet", "within_noise": True, "params": {"x": 1.0}},
        {"name": "chinchilla", "law": "chinchilla", "within_noise": True, "params": {"E": 1.7}},
        {"name": "capacity", "law": "capacity", "within_noise": True, "params": {"E": 1.7}},
        {"name": "kumar[kappa free]", "law": "kumar", "within_noise": True, "params": kumar, "fixed": {}},
        {"name": "kumar", "law": "kumar", "within_noise": False, "params": kumar},
    ]}
    rows = pd.DataFrame({"val_loss": [2.0], "status": ["ok"]})
    labels = [label for label, _ in findings_lib.specification_fits(rows, chosen)]
    # no precision term (chinchilla) or no bits axis (capacity): left out; variants named as selected
    assert labels == ["quartet (chosen)", "kumar[kappa free] (within noise)"]


def test_edge_runs_follow_a_minimum_off_the_end_of_its_profile_until_it_is_inside():
    table = {"budgets": [2e11, 6e11], "sizes": list(range(1, 11)), "min_steps": 20}
    plan = design.Design.from_table({**table, "extend_edges": True})
    point = {**DESIGN_POINT, "precision": "fp32"}
    (designed,) = design.design_runs([point], plan)
    served = {b: sorted(c.model.size for c in designed if b in c.study.flop_budgets) for b in plan.budgets}
    top = served[2e11][-1]
    assert top + 3 <= 10  # shapes above the small budget's profile (the third has too few steps)
    size_n = {c.model.size: compute.run_row(c)["N"] for c in designed}
    size_n |= {s: compute.run_row(config.validate({**point, "model": {**point["model"], "size": s}}))["N"]
               for s in range(1, 11) if s not in size_n}
    # U in log N: the big budget's bottom is inside its profile, the small one's just above it
    bottom = {2e11: size_n[top + 1], 6e11: size_n[served[6e11][1]]}

    def landed(cfgs):
        return pd.DataFrame([{"run_id": c.run_id, "status": "ok", "N": compute.run_row(c)["N"], "budget": b,
                              "val_loss": (math.log(compute.run_row(c)["N"]) - math.log(bottom[b])) ** 2}
                             for c in cfgs for b in c.study.flop_budgets])

    rounds = [designed]
    while True:  # as `scaling sweep` does: train what is called for, land it, ask again
        (cfgs,) = design.extend_edges([point], [designed], plan, landed(rounds[-1]))
        if [c.run_id for c in cfgs] == [c.run_id for c in rounds[-1]]:
            break
        rounds.append(cfgs)
    edge = rounds[-1][len(designed):]
    # one shape per round, upwards, until the minimum has a neighbour above it
    assert [c.model.size for c in edge] == [top + 1, top + 2]
    assert [len(r) - len(designed) for r in rounds] == [0, 1, 2]
    for c in edge:  # each serves the small budget alone, at its own size's rate and step count
        assert tuple(c.study.flop_budgets) == (2e11,) and tuple(c.train.eval_at) == (1.0,)
        assert c.train.lr == config.validate({**point, "model": {**point["model"], "size": c.model.size}}).train.lr
        assert abs(c.train.tokens - 2e11 / _per_token(c)) <= 0.5 * c.tokens_per_step  # the nearest whole step
    # nothing while a run of the point is still to land; nothing without extend_edges
    (cfgs,) = design.extend_edges([point], [rounds[-1]], plan, landed(rounds[-1][:-1]))
    assert [c.run_id for c in cfgs] == [c.run_id for c in rounds[-1]]
    (cfgs,) = design.extend_edges([point], [designed], design.Design.from_table(table), landed(designed))
    assert [c.run_id for c in cfgs] == [c.run_id for c in designed]
    # the replicates then sit at the minimum the edge runs found
    plan = design.Design.from_table({**table, "extend_edges": True, "replicates": [1]})
    twins = design.replicates([rounds[-1]], plan, landed(rounds[-1]))
    assert {c.model.size for c in twins if 2e11 in c.study.flop_budgets} >= {top, top + 1, top + 2}
    assert {c.run_id for c in twins if tuple(c.study.flop_budgets) == (2e11,)} == {c.replace(seed=1).run_id for c in edge}
    # the shapes run out where a budget gives a shape fewer than min_steps steps (size top + 3 here)
    bottom[2e11] = size_n[10]
    (cfgs,) = design.extend_edges([point], [rounds[-1]], plan, landed(rounds[-1]))
    assert [c.run_id for c in cfgs] == [c.run_id for c in rounds[-1]]


def test_replicates_retrain_each_budgets_landed_minimum_and_its_neighbours_at_every_seed():
    plan = design.Design.from_table({"budgets": [2e11, 6e11], "sizes": [1, 2, 3, 4, 5, 6, 7, 8],
                                    "min_steps": 20, "replicates": [2, 1, 1]})
    assert plan.replicates == (1, 2)
    (cfgs,) = design.design_runs([{**DESIGN_POINT, "precision": "fp32"}], plan)

    def landed(loss_by_n, drop=()):
        rows = []
        for cfg in cfgs:
            n = compute.run_row(cfg)["N"]
            for budget in cfg.study.flop_budgets:
                rows.append({"run_id": cfg.run_id, "status": "ok", "N": n, "budget": budget,
                             "val_loss": loss_by_n(n, budget)})
        return pd.DataFrame([r for r in rows if r["run_id"] not in drop])

    by_budget = {b: sorted(compute.run_row(c)["N"] for c in cfgs if b in c.study.flop_budgets) for b in plan.budgets}
    # a U in log N with its bottom at each budget's 2nd-smallest size; at 6e11 the smallest is the minimum
    bottom = {2e11: by_budget[2e11][1], 6e11: by_budget[6e11][0]}
    loss = lambda n, b: (math.log(n) - math.log(bottom[b])) ** 2
    twins = design.replicates([cfgs], plan, landed(loss))
    expected = {(n, seed) for b in plan.budgets for n in by_budget[b][:3] for seed in (1, 2)}
    assert {(compute.run_row(c)["N"], c.seed) for c in twins} == expected
    for twin in twins:  # each as its seed-0 run was: same length, budgets and rate
        (orig,) = [c for c in cfgs if c.model == twin.model]
        assert twin.replace(seed=0).run_id == orig.run_id
    # nothing until every run of the grid point has landed ok
    assert design.replicates([cfgs], plan, landed(loss, drop={cfgs[-1].run_id})) == []
    assert design.replicates([cfgs], design.Design.from_table({"budgets": [2e11, 6e11], "sizes": [1, 2, 3, 4, 5, 6, 7, 8],
                                                             "min_steps": 20}), landed(loss)) == []


def test_the_design_reads_each_minimum_from_the_mean_over_landed_seeds_and_never_drops_a_landed_run():
    """Seed noise is as large as neighbouring sizes' differences: seed 0 alone put a minimum inside that
    the mean over three seeds puts on the edge. The edge run follows the mean, and runs already landed
    (replicates at a minimum that later moved, edge runs) stay in the design."""
    plan = design.Design.from_table({"budgets": [2e11, 6e11], "sizes": list(range(1, 11)),
                                    "min_steps": 20, "replicates": [1, 2], "extend_edges": True})
    point = {**DESIGN_POINT, "precision": "fp32"}
    (cfgs,) = design.design_runs([point], plan)
    small = sorted((c for c in cfgs if 2e11 in c.study.flop_budgets), key=lambda c: c.model.size)
    top, second = small[-1].model.size, small[-2].model.size
    # 2e11: seed 0 is best one below the largest size (inside); seeds 1 and 2 favour the largest
    table = {(second, 0): 1.00, (top, 0): 1.02, (second, 1): 1.10, (top, 1): 0.90, (second, 2): 1.10, (top, 2): 0.90}

    def rows(runs, loss):
        return pd.DataFrame([{"run_id": c.run_id, "status": "ok", "N": compute.run_row(c)["N"], "budget": b,
                              "val_loss": loss(c, b)} for c in runs for b in c.study.flop_budgets])

    def loss(c, b):
        return table.get((c.model.size, c.seed), 3.0) if b == 2e11 else (c.model.size - 4.0) ** 2

    (own,) = design.extend_edges([point], [cfgs], plan, rows(cfgs, loss))
    assert [c.run_id for c in own] == [c.run_id for c in cfgs]  # seed 0 alone: inside
    twins = design.replicates([cfgs], plan, rows(cfgs, loss))
    (grown,) = design.extend_edges([point], [cfgs], plan, rows(cfgs + twins, loss))
    (edge,) = grown[len(cfgs):]  # mean 0.94 at the largest size against 1.07: the minimum is on the edge
    assert tuple(edge.study.flop_budgets) == (2e11,) and edge.model.size == top + 1
    # the edge run lands worse (the minimum is inside again), then seeds move it down to small[-4]
    table[(top + 1, 0)] = 5.0
    table |= {(small[-4].model.size, s): 0.5 for s in (0, 1, 2)}
    later = rows(cfgs + twins + [edge], loss)
    (kept,) = design.extend_edges([point], [cfgs], plan, later)
    assert [c.run_id for c in kept] == [c.run_id for c in grown]  # the landed edge run stays
    again = {c.run_id for c in design.replicates([kept], plan, later)}
    assert {c.run_id for c in twins} <= again  # the replicates at the old minimum stay
    assert small[-5].replace(seed=1).run_id in again  # and the new minimum's neighbours get theirs


def test_a_chosen_law_without_a_bits_axis_gives_p_star_only_from_within_noise_bits_laws():
    """capacity prices precision by measured quantisation error: it has no P* over bits. P* then comes from the
    within-noise laws whose axis is bits, or the report says these data give none (never a raw error)."""
    from scaling.study.analysis import fit
    from scaling.study.report import law_prose

    runs = _isoflop_runs({"bf16": 0.0, "fp8": 0.01}, noise=0.005)
    kumar = {"E": 1.7, "A": 400.0, "B": 2000.0, "alpha": 0.34, "beta": 0.36, "gamma": 2.5, "kappa": 3.0}
    capacity = {"E": 1.7, "A": 400.0, "B": 2000.0, "alpha": 0.34, "beta": 0.36, "F": 0.03, "C": 3.0}

    def chosen(kumar_within_noise):
        f = fit.FitResult(law="capacity", params=capacity, objective=0.0, residuals=np.zeros(0))
        f.selection = {"chosen": "capacity", "candidates": [
            {"name": "capacity", "law": "capacity", "within_noise": True, "params": capacity},
            {"name": "kumar", "law": "kumar", "within_noise": kumar_within_noise, "params": kumar,
             "fixed": {"kappa": 3.0}}]}
        return f

    no_qerr = runs.drop(columns=[c for c in runs.columns if c.startswith("qerr_")])  # nothing to rank recipes by
    (alone,) = findings_lib.findings(no_qerr, chosen(False), budgets=[1e14])["P_star"]  # a budget no run reaches
    assert alone["P"] is None and not alone["measured"] and "no P*" in alone["error"] and "capacity" in alone["error"]
    text = law_prose.pstar_section({"P_star": [alone], "law": {"name": "capacity"}})
    assert "no P*" in text and "context" not in text
    (measured,) = findings_lib.findings(no_qerr, chosen(False), budgets=[1e12])["P_star"]  # the IsoFLOP measurement alone
    bits = [m["bits"] for m in measured["measured"]]
    assert bits and "error" not in measured and measured["interval"] == [min(bits), max(bits)]
    (both,) = findings_lib.findings(runs, chosen(True), budgets=[1e12])["P_star"]
    assert both["P"] is None and "error" not in both
    specs = {r["spec"] for r in both["specifications"]}  # x each cost model
    assert "kumar (within noise)" in specs and all(s == "kumar (within noise)" or s.startswith("capacity (chosen")
                                                   for s in specs)
    lo, hi = both["interval"]
    assert lo <= both["P_range"][0] <= both["P_range"][1] <= hi and set(both["published"]) == set(findings_lib.PUBLISHED)
    text = law_prose.pstar_section({"P_star": [both], "law": {"name": "capacity"}})
    assert "no continuous P*" in text and f"{lo:.3g}" in text


def test_a_quantisation_error_law_ranks_the_measured_recipes_at_their_own_errors_and_costs():
    """capacity read at each recipe's measured qerr and effective bits: when quantisation costs nothing
    (F large: capacity ~1) the cheapest recipe wins; when it costs much (F tiny) the unquantised one does."""
    from scaling.study.analysis import fit
    from scaling.study.report import law_prose

    runs = _isoflop_runs({"bf16": 0.0, "fp8": 0.0, "mxfp4": 0.0}, noise=0.005)
    cfg = ladder.config_for_size(2, seq_len=64)
    per_recipe = {r: compute.columns(cfg, r, 1024) for r in ("bf16", "fp8", "mxfp4")}  # each recipe's own bits
    runs = pd.DataFrame([{**row, **per_recipe[row["recipe"]]} for row in runs.to_dict("records")])
    qerr = {"bf16": 0.0, "fp8": 2e-3, "mxfp4": 3e-2}
    runs = runs.assign(**{c: runs["recipe"].map(qerr) for c in ("qerr_w", "qerr_a", "qerr_g")})
    base = {"E": 1.7, "A": 400.0, "B": 2000.0, "alpha": 0.34, "beta": 0.36, "C": 1.0}
    for F, winner in ((1e3, "mxfp4"), (1e-3, "bf16")):
        law = fit.FitResult(law="capacity", params={**base, "F": F}, objective=0.0, residuals=np.zeros(0))
        (entry,) = findings_lib.findings(runs, law, budgets=[1e12])["P_star"]
        ranked = entry["recipes"]
        assert [r["recipe"] for r in ranked][0] == winner and ranked[0]["best"], (F, ranked)
        assert [r["loss"] for r in ranked] == sorted(r["loss"] for r in ranked)
        assert {r["recipe"]: r["bits"] for r in ranked}["mxfp4"] < {r["recipe"]: r["bits"] for r in ranked}["fp8"] < 16
        assert entry["interval"][0] <= ranked[0]["bits"] <= entry["interval"][1]
        text = law_prose.pstar_section({"P_star": [entry], "law": {"name": "capacity"}})
        assert f"its lowest loss is {winner}'s" in text and "no continuous P*" in text


def test_p_star_never_overrules_the_isoflop_measurement():
    """A law that prefers a recipe the IsoFLOP profiles rule out (here capacity with F large prefers the
    cheap mxfp4 while the measured mxfp4 is 0.3 nats worse) widens P*'s interval to what the measurement
    cannot rule out, and the report says the two disagree."""
    from scaling.study.analysis import fit
    from scaling.study.report import law_prose

    runs = _isoflop_runs({"bf16": 0.0, "fp8": 0.3, "mxfp4": 0.3}, noise=0.005)
    cfg = ladder.config_for_size(2, seq_len=64)
    per_recipe = {r: compute.columns(cfg, r, 1024) for r in ("bf16", "fp8", "mxfp4")}
    runs = pd.DataFrame([{**row, **per_recipe[row["recipe"]]} for row in runs.to_dict("records")])
    runs["D"] = 1e12 / compute.get("bits").per_token(runs)  # each recipe's runs land on the budget at its own cost
    qerr = {"bf16": 0.0, "fp8": 2e-3, "mxfp4": 3e-2}
    runs = runs.assign(**{c: runs["recipe"].map(qerr) for c in ("qerr_w", "qerr_a", "qerr_g")})
    law = fit.FitResult(law="capacity", params={"E": 1.7, "A": 400.0, "B": 2000.0, "alpha": 0.34, "beta": 0.36,
                                                "C": 1.0, "F": 1e3}, objective=0.0, residuals=np.zeros(0))
    facts = findings_lib.findings(runs, law, budgets=[1e12])
    (entry,) = facts["P_star"]
    assert entry["recipes"][0]["recipe"] == "mxfp4"
    assert [m["recipe"] for m in entry["measured"]] == ["bf16"] == [facts["budgets"][0]["winner"]]
    assert entry["interval"][0] <= entry["recipes"][0]["bits"] < 16 == entry["interval"][1]
    text = law_prose.pstar_section({"P_star": [entry], "law": {"name": "capacity"}})
    assert "disagrees with the law's mxfp4" in text and "cannot rule out as best bf16" in text


def _purpose_rows(recipes: dict, seeds=(0, 1), noise=0.01, rng=0):
    """Granularity-sweep rows: recipe -> (format, granularity, scaling, true loss); a seed effect shared by
    every recipe (same initialisation and data order) plus independent noise."""
    rng = np.random.default_rng(rng)
    shared = {s: 0.05 * rng.standard_normal() for s in seeds}
    return pd.DataFrame([{"run_id": f"{r}-{s}", "sweep": "granularity", "recipe": r, "format": f, "granularity": g,
                          "scaling": t, "seed": s, "N": 1.6e5, "D": 1.6e6, "status": "ok",
                          "val_loss": loss + shared[s] + noise * rng.standard_normal()}
                         for r, (f, g, t, loss) in recipes.items() for s in seeds])


def test_scaling_schemes_are_compared_with_per_tensor_scaling_paired_by_seed():
    recipes = {"fp8-tensor": ("fp8", "tensor", "current", 1.60), "fp8-block": ("fp8", "block", "current", 1.60),
               "fp4-tensor": ("fp4", "tensor", "current", 2.00), "fp4-mx": ("fp4", "mx", "current", 1.70),
               "fp4-tensor-delayed": ("fp4", "tensor", "delayed", 2.30), "fp6-mx": ("fp6", "mx", "current", 1.6)}
    rows = _purpose_rows(recipes, seeds=(0, 1, 2))
    g = findings_lib.scheme_effects(rows)
    by = {r["recipe"]: r for r in g["rows"]}
    assert set(by) == {"fp8-block", "fp4-mx", "fp4-tensor-delayed"}  # fp6 has no per-tensor reference
    assert g["comparisons"] == 3 and g["dof"] == 3 * 2
    assert by["fp4-mx"]["verdict"] == "lower" and by["fp4-tensor-delayed"]["verdict"] == "higher"
    assert by["fp8-block"]["verdict"] == "cannot tell" and by["fp8-block"]["ci"][0] < 0 < by["fp8-block"]["ci"][1]
    assert by["fp4-mx"]["diff"] == pytest.approx(-0.30, abs=0.05) and by["fp4-mx"]["reference"] == "fp4-tensor"
    # pairing removes the shared seed effect (sd 0.05): the pooled sigma is the independent noise, ~0.01 * sqrt(2)
    assert g["sigma"] < 0.04
    # a scheme that trains chaotically (seeds 0.6 apart) keeps its own scatter instead of swamping the others'
    wild = rows.copy()
    wild.loc[wild["run_id"] == "fp4-tensor-delayed-1", "val_loss"] += 0.6
    g3 = findings_lib.scheme_effects(wild)
    by3 = {r["recipe"]: r for r in g3["rows"]}
    assert by3["fp4-tensor-delayed"]["own_noise"] and by3["fp4-tensor-delayed"]["verdict"] == "cannot tell"
    assert g3["sigma"] == pytest.approx(g["sigma"], rel=0.5) and by3["fp4-mx"]["verdict"] == "lower"
    assert not any(r["own_noise"] for r in g["rows"])
    # one seed: no noise estimate, so no verdict
    one = findings_lib.scheme_effects(_purpose_rows(recipes, seeds=(0,)))
    assert one["sigma"] is None and {r["verdict"] for r in one["rows"]} == {"cannot tell"}
    # a run that did not finish is counted, not compared
    broken = rows.copy()
    broken.loc[broken["run_id"] == "fp4-mx-0", ["status", "val_loss"]] = ["diverged", np.nan]
    g2 = findings_lib.scheme_effects(broken)
    assert g2["not_ok"] == {"fp4-mx": {"diverged": 1}} and {r["recipe"]: r["n"] for r in g2["rows"]}["fp4-mx"] == 2
    from scaling.study.report import prose
    text = prose.granularity_section(g2, "nats/byte")
    assert "Bonferroni" in text and "fp4-mx" in text and "1 diverged" in text
    assert "apart from fp4-tensor-delayed" in prose.granularity_section(g3, "nats/byte")
    assert "every comparison is *cannot tell*" in prose.granularity_section(one, "nats/byte")


def test_smooth_swiglu_is_compared_on_against_off_paired_by_recipe_rate_and_seed():
    rng = np.random.default_rng(1)
    rows = [{"run_id": f"{r}-{lr}-{on}", "sweep": "outliers", "recipe": r, "lr": lr, "seed": 0, "smooth_swiglu": on,
             "D": 2.6e6, "status": "ok", "val_loss": 1.3 + (lr == 0.03) * 0.2 - 0.05 * on + 0.005 * rng.standard_normal()}
            for r in ("fp8", "fp8-delayed") for lr in (0.01, 0.03) for on in (False, True)]
    o = findings_lib.smooth_swiglu_effect(pd.DataFrame(rows))
    assert o["n"] == 4 and o["verdict"] == "lower" and o["diff"] == pytest.approx(-0.05, abs=0.02)
    same = [{**r, "val_loss": r["val_loss"] + 0.05 * r["smooth_swiglu"]} for r in rows]
    assert findings_lib.smooth_swiglu_effect(pd.DataFrame(same))["verdict"] == "cannot tell"
    from scaling.study.report import prose
    assert "lower with Smooth-SwiGLU" in prose.outliers_section(o, "nats/byte")
    assert findings_lib.purpose_rows(pd.DataFrame(rows), "granularity") is None
