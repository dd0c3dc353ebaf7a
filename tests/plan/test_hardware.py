"""scaling.plan.hardware: the GPU table's spec-sheet peaks and the hardware format for P bits."""

import pytest

from scaling.errors import ConfigError
from scaling.plan import hardware, runplan


def test_spec_sheet_peaks():
    assert hardware.get_gpu("h100").peak("bf16") == 989e12
    assert hardware.get_gpu("h100").peak("fp8") == 1979e12
    assert hardware.get_gpu("h200").peak_tflops == hardware.get_gpu("h100").peak_tflops
    assert hardware.get_gpu("h800").peak_tflops == hardware.get_gpu("h100").peak_tflops
    assert hardware.get_gpu("h800").nvlink_gbps == hardware.get_gpu("h100").nvlink_gbps * 4 / 9  # 400 of 900 GB/s
    assert hardware.get_gpu("a100").peak("fp16") == 312e12
    assert hardware.get_gpu("b200").peak("bf16") == 2250e12 and hardware.get_gpu("b200").peak("fp8") == 4500e12
    with pytest.raises(ConfigError, match="precision: got 'fp8'"):
        hardware.get_gpu("a100").peak("fp8")
    with pytest.raises(ConfigError, match="precision: got 'fp4'"):
        runplan.train_days(1e24, 1024, gpu="h100", precision="fp4", mfu=0.4)


@pytest.mark.parametrize(
    "bits, gpu, expected",
    [(4, "b200", "fp4"), (4, "h100", "fp8"), (4, "a100", "bf16"), (4.5, "b200", "fp6"), (6, "h100", "fp8"),
     (8, "b200", "fp8"), (8, "a100", "bf16"), (12, "h100", "bf16"), (16, "h100", "bf16"), (32, "h100", "tf32"),
     # FP6: native on Blackwell (at its FP8 rate) and MI355X (at its FP4 rate); FP8 on Hopper and MI300X
     (6, "b300", "fp6"), (6, "mi355x", "fp6"), (6, "mi300x", "fp8"), (4, "mi300x", "fp8"), (4, "mi355x", "fp4"),
     (8.5, "mi355x", "bf16"), (32, "mi300x", "tf32"), (32, "mi355x", "fp32")],
)
def test_precision_for_bits(bits, gpu, expected):
    assert hardware.precision_for_bits(bits, gpu) == expected


def test_the_new_chips_rates_follow_their_data_sheets():
    b200, b300 = hardware.get_gpu("b200"), hardware.get_gpu("b300")
    mi300x, mi355x = hardware.get_gpu("mi300x"), hardware.get_gpu("mi355x")
    # Blackwell runs FP6 at its FP8 rate; Blackwell Ultra raised FP4 only
    assert b200.peak("fp6") == b200.peak("fp8") and b300.peak("fp6") == b300.peak("fp8")
    assert b300.peak("bf16") == b200.peak("bf16") and b300.peak("fp4") > b200.peak("fp4")
    assert b300.memory_gb == 288
    # MI300X: FP8 2x BF16 2x TF32, no FP6/FP4 path
    assert mi300x.peak("fp8") == 2614.9e12 and mi300x.peak("bf16") == 1307.4e12 and mi300x.peak("tf32") == 653.7e12
    with pytest.raises(ConfigError, match="precision: got 'fp6'"):
        mi300x.peak("fp6")
    # MI355X: FP6 at the FP4 rate, twice FP8, four times BF16; no TF32
    assert mi355x.peak("fp6") == mi355x.peak("fp4") == pytest.approx(2 * mi355x.peak("fp8"), rel=1e-4)
    assert mi355x.peak("fp8") == pytest.approx(2 * mi355x.peak("bf16"), rel=1e-4)
    assert "tf32" not in mi355x.peak_tflops and "nvfp4" not in mi355x.block_scaled and "mxfp6" in mi355x.block_scaled


@pytest.mark.parametrize(
    "bits, gpu, expected",
    [(4, "h100", ("fp4", "fp8")), (6, "h100", ("fp6", "fp8")), (6, "mi300x", ("fp6", "fp8")), (6, "b200", None),
     (6, "mi355x", None), (4, "b300", None), (8, "a100", ("fp8", "bf16")), (32, "mi355x", ("tf32", "fp32")),
     (16, "mi355x", None)],
)
def test_fallback_names_the_format_a_chip_lacks_and_what_it_runs_instead(bits, gpu, expected):
    assert hardware.fallback(bits, gpu) == expected
    assert hardware.precision_for_bits(bits, gpu) == (expected[1] if expected else hardware.native_precision(bits))
