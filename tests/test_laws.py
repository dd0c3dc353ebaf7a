"""Law forms: hand-computed values, numpy/JAX agreement, stability, the registry, the kumar and sun maths."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scaling import laws
from scaling.errors import ConfigError

HOFFMANN = dict(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)
KUMAR = dict(E=1.8, A=400.0, B=2000.0, alpha=0.34, beta=0.36, gamma=2.5, kappa=3.0)
SUN = dict(n=80.0, d=500.0, eps=1.8, alpha=0.3, beta=0.3, gamma=50.0, delta=1.0, nu=2.0)


def test_chinchilla_hand_computed():
    # Hoffmann et al.'s fit at Chinchilla's size: N = 70e9, D = 1.4e12.
    expected = 1.69 + 406.4 / 70e9 ** 0.34 + 410.7 / 1.4e12 ** 0.28
    got = laws.get("chinchilla").predict(HOFFMANN, {"N": np.array([70e9]), "D": np.array([1.4e12])})
    assert got[0] == pytest.approx(expected, rel=1e-13)
    assert expected == pytest.approx(1.9367, abs=1e-3)  # the number usually quoted for Chinchilla


def test_kumar_effective_params_hand_computed():
    N, D, P = 1e8, 2e9, 4.0
    n_eff = N * (1 - math.exp(-P / 2.5)) ** 3
    expected = 1.8 + 400 * n_eff ** -0.34 + 2000 * D ** -0.36
    got = laws.get("kumar").predict(KUMAR, {"N": np.array([N]), "D": np.array([D]), "P": np.array([P])})
    assert got[0] == pytest.approx(expected, rel=1e-13)


def test_kumar_roles_equals_kumar_when_roles_share_precision():
    x = {"N": np.array([1e7, 3e8]), "D": np.array([1e9, 5e10]), "P": np.array([3.0, 8.0])}
    roles = {**x, "P_w": x["P"], "P_a": x["P"], "P_g": x["P"]}
    params = {k: v for k, v in KUMAR.items() if k not in ("gamma", "kappa")}
    params.update(gamma_w=2.5, gamma_a=2.5, gamma_g=2.5)
    np.testing.assert_allclose(laws.get("kumar_roles").predict(params, roles),
                               laws.get("kumar").predict(KUMAR, x), rtol=1e-13)


def test_sun_hand_computed():
    N, D, E, M, B = 1e8, 1e10, 4.0, 3.0, 128.0
    expected = (80 * N ** -0.3 + 500 * D ** -0.3 + 1.8
                + D ** 0.3 / N ** 0.3 * math.log2(B) / (50 * (E + 0.5) ** 1.0 * (M + 0.5) ** 2.0))
    x = {"N": np.array([N]), "D": np.array([D]), "ebits": np.array([E]), "mbits": np.array([M]), "block": np.array([B])}
    assert laws.get("sun").predict(SUN, x)[0] == pytest.approx(expected, rel=1e-13)


@pytest.mark.parametrize("name,params,extra", [
    ("chinchilla", HOFFMANN, {}),
    ("kumar", KUMAR, {"P": [3.0, 16.0]}),
    ("sun", SUN, {"ebits": [2.0, 5.0], "mbits": [1.0, 2.0], "block": [32.0, 128.0]}),
])
def test_numpy_and_jax_agree(name, params, extra):
    x = {"N": [1e7, 1e9], "D": [1e9, 1e11], **extra}
    law = laws.get(name)
    ref = law.predict(params, {k: np.array(v) for k, v in x.items()}, np)
    with jax.enable_x64(True):
        got = law.predict({k: jnp.asarray(v) for k, v in params.items()}, {k: jnp.array(v) for k, v in x.items()}, jnp)
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-12)


def test_log_predict_is_stable_where_the_direct_sum_overflows():
    # B·D^-beta = 410.7·(1e-200)^-2 = 4.1e402 overflows float64; its log does not.
    law = laws.get("chinchilla")
    p = {**HOFFMANN, "beta": 2.0}
    x = {"N": np.array([1e9]), "D": np.array([1e-200])}
    with np.errstate(over="ignore"):
        assert np.isinf(p["B"] * x["D"] ** -p["beta"])[0]
    expected = math.log(410.7) + 2.0 * 200 * math.log(10)  # the other two terms are negligible
    assert law.log_predict(p, x)[0] == pytest.approx(expected, rel=1e-15)


def test_register_a_new_law_in_a_few_lines():
    @laws.register(params=("E", "A", "alpha"), positive=("E", "A"), columns=("N",), name="test_power",
                   init_grid={"E": [1.0], "A": [10.0], "alpha": [0.5]})
    def test_power(p, x, xp):
        """L = E + A·N^-alpha"""
        return [xp.log(p["E"]), xp.log(p["A"]) - p["alpha"] * xp.log(x["N"])]

    law = laws.get("test_power")
    assert law.columns == ("N",) and law.positive == {"E", "A"} and "test_power" in laws.names()
    assert law.predict({"E": 2.0, "A": 10.0, "alpha": 0.5}, {"N": np.array([100.0])})[0] == pytest.approx(3.0)


def test_registry_errors():
    with pytest.raises(ConfigError, match="law: got 'nope'"):
        laws.get("nope")
    with pytest.raises(ConfigError, match="missing"):
        laws.register(params=("E", "A"), columns=("N",), init_grid={"E": [1.0]})(lambda p, x, xp: [])
    with pytest.raises(ConfigError, match="positive"):
        laws.register(params=("E",), positive=("E",), columns=("N",), init_grid={"E": [0.0]})(lambda p, x, xp: [])


def test_kumar_sweet_spot_root():
    # e^x - 1 = kappa·x: kappa = 3 -> 1.9038 (the 1.904), kappa = 2 -> 1.2564.
    x3 = laws.kumar_sweet_spot_x(3.0)
    assert x3 == pytest.approx(1.904, abs=5e-4)
    assert math.expm1(x3) == pytest.approx(3 * x3, rel=1e-12)
    assert laws.kumar_sweet_spot_x(2.0) == pytest.approx(1.2564312086, rel=1e-9)
    with pytest.raises(ConfigError, match="kappa"):
        laws.kumar_sweet_spot_x(1.0)


def test_kumar_sweet_spot_maximises_precision_efficiency():
    # At fixed compute the sweet spot maximises (1 - e^(-P/gamma))^kappa / P (see laws.kumar).
    gamma = 2.5
    P = np.linspace(0.5, 20, 200001)
    efficiency = (1 - np.exp(-P / gamma)) ** 3 / P
    assert P[np.argmax(efficiency)] == pytest.approx(gamma * laws.kumar_sweet_spot_x(3.0), abs=1e-3)


def test_sun_critical_data_size_is_the_loss_minimum_over_data():
    law = laws.get("sun")
    fmt = {"ebits": 2.0, "mbits": 1.0, "block": 128.0}
    d_crit = laws.sun_critical_data_size(SUN, 1e8, **fmt)

    def loss(D):
        return law.predict(SUN, {"N": np.array([1e8]), "D": np.array([D]), **{k: np.array([v]) for k, v in fmt.items()}})[0]

    D = np.geomspace(d_crit / 100, d_crit * 100, 4001)
    losses = np.array([loss(d) for d in D])
    assert D[np.argmin(losses)] == pytest.approx(d_crit, rel=2e-3)  # grid spacing is 0.23%
    assert loss(d_crit * 4) > loss(d_crit) < loss(d_crit / 4)
