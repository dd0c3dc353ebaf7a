"""scaling.plan.shapes: published models' parameter counts and a GPT shape from a parameter count."""

import pytest

from scaling.errors import ConfigError
from scaling.plan import shapes


@pytest.mark.parametrize("params", [1e8, 7e9, 7e10])
def test_gpt_shape_from_params_matches_parameter_count(params):
    for tp in (1, 8):
        model = shapes.gpt_for_params(params, tp)
        assert model.hidden % 128 == 0 and model.heads % tp == 0 and model.hidden % model.heads == 0
        assert 12 * model.layers * model.hidden**2 == pytest.approx(params, rel=0.1)
        assert model.layers * (model.attention_params + model.mlp_params(False)) == 12 * model.layers * model.hidden**2
        assert 100 <= model.hidden / model.layers <= 160 or model.layers < 8
    with pytest.raises(ConfigError, match="params"):
        shapes.gpt_for_params(-1.0)


def test_presets_have_the_published_parameter_counts():
    # Llama 3 8B's released checkpoint has 8,030,261,248 parameters (untied embeddings)
    assert shapes.MODELS["llama3-8b"].params == 8_030_261_248
    assert shapes.MODELS["llama3-70b"].params == pytest.approx(70.55e9, rel=1e-3)
    assert shapes.MODELS["llama3-405b"].params == pytest.approx(405.9e9, rel=1e-3)
    assert shapes.MODELS["gpt3-175b"].params == pytest.approx(175e9, rel=0.01)


def test_moe_presets_have_the_published_parameter_counts():
    # DeepSeek-V3 report: 671B total, 37B activated; Kimi K2: 1.04T / 32B; Mixtral 8x7B: 46.7B / 12.9B;
    # Qwen3: 30.5B / 3.3B and 235B / 22B (model cards); DeepSeek-V2 report (arXiv 2405.04434): 236B / 21B
    published = {"deepseek-v3": (671e9, 37e9), "deepseek-v2": (236e9, 21e9), "kimi-k2": (1.04e12, 32e9), "mixtral-8x7b": (46.7e9, 12.9e9),
                 "qwen3-30b-a3b": (30.5e9, 3.3e9), "qwen3-235b-a22b": (235e9, 22e9)}
    for name, (total, activated) in published.items():
        m = shapes.MODELS[name]
        assert m.params == pytest.approx(total, rel=0.015), name
        assert m.activated_params == pytest.approx(activated, rel=0.03), name
    # DeepSeek-V3 by hand: MLA attention, 3 dense layers, 58 layers of 256 + 1 experts of 3 * 7168 * 2048
    attention = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    norms = 2 * 7168 + 1536 + 512
    expert = 3 * 7168 * 2048
    total = (61 * (attention + norms) + 3 * 3 * 7168 * 18432 + 58 * (257 * expert + 7168 * 256)
             + 2 * 129280 * 7168 + 7168)
    assert shapes.MODELS["deepseek-v3"].params == total
