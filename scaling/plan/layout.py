"""A step's parallel layout and batch (StepLayout: tp, pp, dp, cp, ep, etp, ZeRO, recompute, overlaps)
and its text form for the command line and the cluster recipes ('tp=4,pp=1,dp=2,zero=1')."""

from __future__ import annotations

from dataclasses import dataclass

from scaling.errors import ConfigError

RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class StepLayout:
    """Parallel layout and batch of one optimizer step. GPUs = tp * cp * pp * dp.

    Megatron-LM defaults: the distributed optimizer (ZeRO-1) when dp > 1, sequence parallel when
    tp > 1, no recompute, 1F1B without interleaving (vpp = 1), gradient reduction and parameter
    all-gather not overlapped (Megatron's --overlap-grad-reduce / --overlap-param-gather are opt-in),
    TP communication not overlapped (--tp-comm-overlap is opt-in), pipeline send/recv overlapped
    with compute under interleaving (--overlap-p2p-communication, Megatron's default, applies to
    vpp > 1 only). NeMo's performance recipes turn all of them on (see scaling/plan/step_cases.json).
    MoE: experts split over ep ranks, each expert's matrices over etp ranks (Megatron's
    --expert-tensor-parallel-size, which defaults to tp); tp * cp * dp must be a multiple of
    ep * etp (the experts fold into the data-parallel ranks of a stage). seo: the shared experts'
    GEMMs overlap the token all-to-all (--moe-shared-expert-overlap); a2ao: the all-to-all
    overlaps another micro-batch's compute (DeepSeek's DualPipe, Megatron's
    --overlap-moe-expert-parallel-comm); deepep: tokens cross the network once per remote node
    holding one of their experts, then fan out over NVLink (DeepEP, Megatron's flex dispatcher;
    DeepSeek-V3's own kernels), instead of once per expert (NCCL all-to-all). All off by default,
    as in Megatron-LM. dualpipe: DeepSeek-V3's bidirectional schedule (Sec. 3.2.1) instead of 1F1B:
    GPU i holds pipeline stages i and pp - 1 - i and feeds half the micro-batches from each end.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None  # None: tp (Megatron's default)
    zero: int | None = None  # None: 1 if dp * cp > 1 else 0
    sp: bool | None = None  # None: tp > 1
    recompute: str = "none"
    micro_batch: int = 1
    micro_batches: int = 1
    vpp: int = 1
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    tp_overlap: bool = False
    overlap_p2p: bool | None = None  # None: vpp > 1
    shared_expert_overlap: bool = False
    a2a_overlap: bool = False
    deepep: bool = False
    dualpipe: bool = False

    def __post_init__(self):
        for key in ("tp", "pp", "dp", "cp", "ep", "etp", "micro_batch", "micro_batches", "vpp"):
            value = getattr(self, key)
            if not (isinstance(value, int) and value >= 1) and not (key == "etp" and value is None):
                raise ConfigError(f"layout.{key}", value, "an integer >= 1")
        if self.zero not in (None, 0, 1, 2, 3):
            raise ConfigError("layout.zero", self.zero, (0, 1, 2, 3))
        if self.recompute not in RECOMPUTE:
            raise ConfigError("recompute", self.recompute, RECOMPUTE)
        if self.sp and self.tp == 1:
            raise ConfigError("sequence-parallel", self.sp, "only with tp > 1")
        if self.tp_overlap and not (self.tp > 1 and self.sequence_parallel):
            raise ConfigError("layout.tpo", 1, "only with tp > 1 and sequence parallel (TE's userbuffer overlap)")
        if self.dualpipe and (self.pp < 2 or self.pp % 2 or self.vpp > 1):
            raise ConfigError("layout.dualpipe", 1, "only with an even pp >= 2 and vpp = 1 (DualPipe is its own schedule)")
        if self.vpp > 1 and self.pp == 1:
            raise ConfigError("layout.vpp", self.vpp, "1 unless pp > 1 (virtual stages interleave a pipeline)")

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def zero_stage(self) -> int:
        # the distributed optimizer shards over the dp x cp group, so cp alone turns it on too
        return (1 if self.dp * self.cp > 1 else 0) if self.zero is None else self.zero

    @property
    def sequence_parallel(self) -> bool:
        return self.tp > 1 if self.sp is None else self.sp

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def expert_dp(self) -> int:
        """Ranks holding the same experts of a stage (their ZeRO / gradient-reduction group)."""
        return max(1, self.tp * self.cp * self.dp // (self.ep * self.expert_tp))

    @property
    def p2p_overlapped(self) -> bool:
        return (self.vpp > 1 or self.dualpipe) if self.overlap_p2p is None else self.overlap_p2p


LAYOUT_KEYS = {"tp": int, "pp": int, "dp": int, "cp": int, "ep": int, "etp": int, "zero": int, "vpp": int, "sp": int,
               "ogr": int, "opg": int, "tpo": int, "p2p": int, "seo": int, "a2ao": int,
               "deepep": int, "dualpipe": int}
# boolean layout keys -> StepLayout fields
FLAG_KEYS = {"sp": "sp", "ogr": "overlap_grad_reduce", "opg": "overlap_param_gather", "tpo": "tp_overlap",
             "p2p": "overlap_p2p", "seo": "shared_expert_overlap", "a2ao": "a2a_overlap", "deepep": "deepep",
             "dualpipe": "dualpipe"}


def parse_step_layout(text: str, **extra: int | str | bool | None) -> StepLayout:
    """'tp=4,pp=1,dp=2,zero=1' (keys: tp pp dp cp ep etp zero vpp, flags sp ogr opg tpo p2p seo a2ao deepep = 0|1) -> StepLayout (plus `extra` fields)."""
    allowed = "comma-separated key=integer with keys " + ", ".join(LAYOUT_KEYS) + ", e.g. tp=4,pp=1,dp=2,zero=1"
    fields: dict[str, int | str | bool] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or key not in LAYOUT_KEYS or key in fields:
            raise ConfigError("layout", text, allowed)
        try:
            fields[key] = int(value)
        except ValueError:
            raise ConfigError("layout", text, allowed) from None
    for key, name in FLAG_KEYS.items():
        if key in fields:
            if fields[key] not in (0, 1):
                raise ConfigError(f"layout.{key}", fields[key], (0, 1))
            fields[name] = bool(fields.pop(key))
    for key, value in extra.items():
        if value is not None:
            if key in fields and fields[key] != value:
                raise ConfigError(key, value, f"the same as layout {key}={fields[key]}, or only one of them")
            fields[key] = value
    return StepLayout(**fields)
