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
    [(4, "b200", "fp4"), (4, "h100", "fp8"), (4, "a100", "bf16"), (4.5, "b200", "fp8"), (6, "h100", "fp8"),
     (8, "b200", "fp8"), (8, "a100", "bf16"), (12, "h100", "bf16"), (16, "h100", "bf16"), (32, "h100", "tf32")],
)
def test_precision_for_bits(bits, gpu, expected):
    assert hardware.precision_for_bits(bits, gpu) == expected
