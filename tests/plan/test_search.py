"""scaling.plan.search: the fastest layout that fits."""

import pytest

from scaling.errors import ConfigError
from scaling.plan import hardware, search, shapes, stepmodel


def test_layout_search_returns_the_fastest_fitting_layout():
    """Small enough to enumerate: every candidate is priced, the one returned fits and none that fits is faster."""
    model = shapes.load_model("llama3-8b", layers=4)
    gpu = hardware.get_gpu("h100")
    best, fitting = search.search(model, "h100", 8, 16, 2048)
    candidates = search.candidate_layouts(model, gpu, 8, 16, 2048)
    results = [stepmodel.step(model, "h100", lay, "bf16", 2048, 8) for lay in candidates]
    fits = [r for r in results if r.memory.total <= gpu.memory_bytes]
    assert fitting == len(fits) > 10
    assert best.memory.total <= gpu.memory_bytes and best.layout.gpus == 8
    assert best.tokens == 16 * 2048
    assert all(r.step_seconds >= best.step_seconds for r in fits)
    # layouts a hand check rules out are not candidates: tp over a node, dp not dividing the batch
    assert all(lay.tp <= 8 and 16 % lay.dp == 0 and lay.micro_batch * lay.micro_batches * lay.dp == 16 for lay in candidates)


def test_layout_search_says_when_nothing_fits():
    with pytest.raises(ConfigError) as e:
        search.search(shapes.load_model("llama3-405b"), "h100", 8, 8, 4096)
    assert e.value.key == "memory"
