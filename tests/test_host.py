"""CPU model and flags as benchmarks and summaries name them; where bf16 dots are native."""

from scaling import host
from scaling.plan import hardware

ZEN3 = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx avx2 fma bmi2\n\nprocessor\t: 1\n"
SAPPHIRE = ("model name\t: Intel(R) Xeon(R) Platinum 8481C\n"
            "flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n")


def test_cpu_flags_and_native_bf16():
    assert host.cpu(ZEN3) == {"model": "AMD EPYC 7B13", "flags": ["avx2"]}
    assert host.cpu(SAPPHIRE)["flags"] == ["avx2", "avx512f", "avx512_bf16", "amx_bf16"]
    assert not host.native_bf16("cpu", ZEN3) and host.native_bf16("cpu", SAPPHIRE)
    assert host.native_bf16("gpu", ZEN3)  # any accelerator runs bf16 dots natively


def test_describe_names_the_model_and_the_flags_it_lacks():
    assert host.describe("cpu", ZEN3) == "cpu: AMD EPYC 7B13 (avx2; no avx512f, avx512_bf16, amx_bf16)"
    assert host.describe("cpu", SAPPHIRE) == "cpu: Intel(R) Xeon(R) Platinum 8481C (avx2, avx512f, avx512_bf16, amx_bf16)"


class FakeDevice:
    def __init__(self, platform, device_kind):
        self.platform, self.device_kind = platform, device_kind


def test_describe_names_each_accelerator_kind_and_count():
    h100 = [FakeDevice("gpu", "NVIDIA H100 80GB HBM3")] * 8
    assert host.describe(devices=h100[:1]) == "gpu: NVIDIA H100 80GB HBM3 x1"
    assert host.describe(devices=h100) == "gpu: NVIDIA H100 80GB HBM3 x8"
    mixed = [FakeDevice("gpu", "NVIDIA A100-SXM4-80GB"), FakeDevice("gpu", "NVIDIA H100 80GB HBM3")]
    assert host.describe(devices=mixed) == "gpu: NVIDIA A100-SXM4-80GB x1, NVIDIA H100 80GB HBM3 x1"
    assert host.describe(cpuinfo=ZEN3, devices=[FakeDevice("cpu", "cpu")]).startswith("cpu: AMD EPYC 7B13 (avx2;")


def test_device_kinds_map_to_the_gpu_table_only_where_its_peaks_hold():
    kinds = {"NVIDIA H100 80GB HBM3": "h100", "NVIDIA H200": "h200", "NVIDIA B200": "b200",
             "NVIDIA A100-SXM4-40GB": "a100", "NVIDIA A100 80GB PCIe": "a100",
             "NVIDIA H100 PCIe": None, "NVIDIA H100 NVL": None, "Tesla V100-SXM2-16GB": None}
    assert {kind: hardware.gpu_key(kind) for kind in kinds} == kinds
