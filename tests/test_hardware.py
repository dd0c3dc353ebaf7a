"""CPU model and flags as benchmarks and summaries name them; where bf16 dots are native."""

from scaling import hardware

ZEN3 = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx avx2 fma bmi2\n\nprocessor\t: 1\n"
SAPPHIRE = ("model name\t: Intel(R) Xeon(R) Platinum 8481C\n"
            "flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n")


def test_cpu_flags_and_native_bf16():
    assert hardware.cpu(ZEN3) == {"model": "AMD EPYC 7B13", "flags": ["avx2"]}
    assert hardware.cpu(SAPPHIRE)["flags"] == ["avx2", "avx512f", "avx512_bf16", "amx_bf16"]
    assert not hardware.native_bf16("cpu", ZEN3) and hardware.native_bf16("cpu", SAPPHIRE)
    assert hardware.native_bf16("gpu", ZEN3)  # any accelerator runs bf16 dots natively


def test_describe_names_the_model_and_the_flags_it_lacks():
    assert hardware.describe("cpu", ZEN3) == "cpu: AMD EPYC 7B13 (avx2; no avx512f, avx512_bf16, amx_bf16)"
    assert hardware.describe("cpu", SAPPHIRE) == "cpu: Intel(R) Xeon(R) Platinum 8481C (avx2, avx512f, avx512_bf16, amx_bf16)"
