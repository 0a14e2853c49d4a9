"""tbf's burst after pyroute2's and the kernel's rounding, at every rate the netem
backend can ask for (pure: pyroute2's own encoder, no kernel).

The kernel's side is modelled from sch_tbf.c (`tbf_change`, `psched_ns_t2l`,
`tbf_enqueue`/`tbf_dequeue`) and sch_api.c (`psched_ratecfg_precompute`,
`__detect_linklayer`) of Linux 6.1; the VM lane reads the real qdiscs back
(tests/testbed/links/test_netem_kernel.py).
"""

from __future__ import annotations

import math
import struct
from functools import cache

import numpy as np
import pytest
from pyroute2.netlink.rtnl.tcmsg import common as pr_common
from pyroute2.netlink.rtnl.tcmsg import plugins, tcmsg

from testbed.links.netem_plan import (
    CATCH_UP_MS,
    DEFAULT_INTERVAL_MS,
    FRAME_BYTES,
    PSCHED_TICKS_PER_US,
    ZERO_RATE_FLOOR_KBIT,
    compile_schedule,
    kernel_tbf_burst,
    kernel_tbf_max_size,
    pyroute2_buffer_ticks,
    tbf_params,
)
from testbed.links.traces import kbit_per_opportunity_ms, load_named, trace_catalogue

FIXED_RATES_KBIT = (100.0, 500.0, 1000.0, 2000.0, 12_000.0, 16_000.0, 100_000.0)
"""Fixed rates of the tests, `bench link` (fixed20_12mbit) and the vocabulary tests."""
PRESET_OFFSETS_MS = (0.0, 5_000.0, 15_000.0)
"""Trace offsets the shipped presets replay from."""


def _max_per_interval(name: str, interval_ms: float) -> int:
    """Most opportunities any window of `interval_ms` can hold, at any offset."""
    trace = load_named(name)
    stamps = trace.stamps_ms
    unrolled = np.concatenate([stamps, stamps + trace.period_ms])
    inside = np.searchsorted(unrolled, unrolled + interval_ms, side="left") - np.arange(unrolled.size)
    return int(inside.max())


@cache
def _emitted_rates(*, whole_period: bool) -> frozenset[float]:
    """Every step rate compile_schedule emits for the shipped traces at the presets'
    offsets: over one period as a whole (its last step may be narrower), or as the
    backend replays it (10 s chunks from replay time 0: every step a full interval)."""
    rates: set[float] = set()
    for name in trace_catalogue():
        trace = load_named(name)
        for offset_ms in PRESET_OFFSETS_MS:
            if whole_period:
                pieces = [(0.0, float(trace.period_ms))]
            else:
                chunk = 10_000.0
                pieces = [(k * chunk, chunk) for k in range(math.ceil(trace.period_ms / chunk))]
            for start_ms, duration_ms in pieces:
                steps = compile_schedule(trace, offset_ms=offset_ms, start_ms=start_ms,
                                         interval_ms=DEFAULT_INTERVAL_MS, duration_ms=duration_ms)
                rates.update(s.rate_kbit for s in steps)
    return frozenset(rates)


@cache
def _lattice() -> frozenset[float]:
    """Every rate a full interval of a shipped trace can have at any offset: k
    opportunities per 10 ms, up to the densest window of any trace."""
    top = max(_max_per_interval(name, DEFAULT_INTERVAL_MS) for name in trace_catalogue())
    return frozenset(kbit_per_opportunity_ms(k, DEFAULT_INTERVAL_MS) for k in range(top + 1))


def _possible_rates() -> tuple[float, ...]:
    return tuple(sorted(_lattice() | _emitted_rates(whole_period=True) | set(FIXED_RATES_KBIT)))


def test_the_lattice_covers_what_the_replay_emits() -> None:
    replayed = {round(r, 6) for r in _emitted_rates(whole_period=False)}
    assert len(replayed) > 100
    assert replayed <= {round(r, 6) for r in _lattice()}
    # the densest window of the shipped traces: T-Mobile's downlink, 196 packets in 10 ms
    assert max(_lattice()) == pytest.approx(235_200.0)


# --- a model of the kernel's side, beyond max_size --------------------------------------


def _ratecfg_mult_shift(rate_bytes_s: int) -> tuple[int, int]:
    """psched_ratecfg_precompute: time_ns = (len * mult) >> shift."""
    factor, shift = 1_000_000_000, 0
    while True:
        mult = factor // rate_bytes_s
        if mult & (1 << 31) or factor & (1 << 63):
            return mult, shift
        factor <<= 1
        shift += 1


def _l2t_ns(rate_bytes_s: int, length: int) -> int:
    mult, shift = _ratecfg_mult_shift(rate_bytes_s)
    return (length * mult) >> shift


def _encoded_tbf(params: dict[str, int]) -> tuple[dict[str, int], tuple[int, ...]]:
    """The TCA_TBF_PARMS fields and the rate table exactly as pyroute2 puts them on the
    wire for `ipr.tc("add", "tbf", ..., **params)` (encoded, then decoded back)."""
    options = plugins["tbf"].get_parameters(dict(params, kind="tbf", index=1, handle=0x100000))
    msg = tcmsg()
    msg["attrs"] = [["TCA_KIND", "tbf"], ["TCA_OPTIONS", options]]
    msg.encode()
    back = tcmsg(msg.data)
    back.decode()
    opts = back.get_attr("TCA_OPTIONS")
    parms = opts.get_attr("TCA_TBF_PARMS")
    rtab = struct.unpack("256I", bytes(opts.get_attr("TCA_TBF_RTAB"))[:1024])
    return {k: int(parms[k]) for k in ("rate", "buffer", "limit", "mtu", "rate_cell_log",
                                        "rate___reserved", "rate_mpu", "rate_overhead")}, rtab


def _kernel_sees_ethernet(parms: dict[str, int], rtab: tuple[int, ...]) -> bool:
    """__detect_linklayer: pyroute2 sends linklayer 0 (unaware), so the kernel guesses
    from the rate table; ATM would scale every length by 48/53."""
    low = math.ceil(parms["rate_mpu"] / 48) * 48
    high = math.ceil((low + 1) / 48) * 48
    cell_low, cell_high = low >> parms["rate_cell_log"], (high >> parms["rate_cell_log"]) - 1
    if parms["rate"] > 100_000_000 // 8 or rtab[0] == 0:
        return True
    return not (cell_low < cell_high < 256 and rtab[cell_low] == rtab[cell_high])


# --- the tests ---------------------------------------------------------------------------


def test_pyroute2_reads_the_psched_clock_the_model_assumes() -> None:
    # pyroute2 reads /proc/net/psched at import; without it, it falls back to 1 tick/us
    assert pr_common.tick_in_usec == PSCHED_TICKS_PER_US


def test_the_old_exact_burst_lost_bytes_as_the_vm_lane_saw() -> None:
    # dmesg in the guest: "sch_tbf: burst 1513 is lower than device ... mtu (1514)" at
    # 12 Mbit/s and 10.8 Mbit/s; 2 Mbit/s (the one rate the old tests used) kept 1514
    assert kernel_tbf_burst(1_500_000, 1514) == 1513
    assert kernel_tbf_burst(1_350_000, 1514) == 1513
    assert kernel_tbf_burst(150_000, 1514) == 1513
    assert kernel_tbf_burst(250_000, 1514) == 1514
    # truncations: 1514 B at 1.5 MB/s is 1009.33 us -> 1009 us -> 15765 ticks -> 1513.4 B
    assert pyroute2_buffer_ticks(1_500_000, 1514) == 15765
    assert kernel_tbf_max_size(1_500_000, 15765) == 1513


@pytest.mark.parametrize("rate_kbit", [0.0, *_possible_rates()])
def test_kernel_keeps_a_full_frame_at_every_rate(rate_kbit: float) -> None:
    params = tbf_params(rate_kbit, limit_bytes=1_500_000)
    rate = params["rate"]
    parms, rtab = _encoded_tbf(params)
    # pyroute2's encoder gives what the model computes
    assert parms["rate"] == rate
    assert parms["buffer"] == pyroute2_buffer_ticks(rate, params["burst"])
    assert parms["limit"] == params["limit"] >= params["burst"]
    assert parms["rate___reserved"] == 0  # the link layer: unaware (the kernel guesses)
    assert parms["rate_overhead"] == 0
    assert _kernel_sees_ethernet(parms, rtab)
    max_size = kernel_tbf_max_size(rate, parms["buffer"])
    # tbf_enqueue drops any frame longer than max_size (the sch_tbf warning's figure)
    assert max_size >= FRAME_BYTES
    # and CATCH_UP_MS of the rate beyond it, for a dequeue timer that fires late
    catch_up = math.ceil(rate * CATCH_UP_MS / 1000)
    assert max_size >= FRAME_BYTES + catch_up
    # tbf_dequeue: a full bucket must cover one full frame's transmission time
    assert _l2t_ns(rate, FRAME_BYTES) <= parms["buffer"] << 6
    # the padding stays small: a few bytes of slack beyond what was wanted
    assert params["burst"] - (FRAME_BYTES + catch_up) <= math.ceil(rate * 1.1e-6) + 1


def test_zero_steps_use_the_floor_rate() -> None:
    assert tbf_params(0.0, limit_bytes=1)["rate"] == ZERO_RATE_FLOOR_KBIT * 1000 / 8
    assert tbf_params(0.0, limit_bytes=1) == tbf_params(ZERO_RATE_FLOOR_KBIT, limit_bytes=1)
