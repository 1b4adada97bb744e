"""Timing helpers of the PyTorch anchor scripts (attention_anchor.py, cce_anchor.py,
ce_sweep_anchors.py): a function's median time over CUDA events, and the bf16 matmul rate their
floors are taken at."""
import statistics

import torch


# Cycles of the spin kernel that `queued` timing puts ahead of the start event: about 1.5-2 ms
# at an H100's or H200's clock, far longer than PyTorch takes to dispatch one call.
QUEUE_CYCLES = 3_000_000


def time_ms(fn, iters, before=None, queued=False):
    """Median milliseconds of fn() over `iters` runs after 3 warm-up runs; before() runs ahead of
    each run, outside the timed events.

    Unqueued, the start event is stamped while the GPU idles and fn()'s kernels start only once
    Python has dispatched them, so the time includes that dispatch: what a caller that waits on
    each call sees. queued: a spin kernel (torch.cuda._sleep) runs ahead of the start event, fn()'s
    launches queue behind it, and the events time the GPU's work alone, as a C++ benchmark's
    back-to-back launches do (for a 0.2 ms kernel the dispatch is a sizeable share)."""
    times = []
    for i in range(iters + 3):
        if before:
            before()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if queued:
            torch.cuda._sleep(QUEUE_CYCLES)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        if i >= 3:
            times.append(e0.elapsed_time(e1))
    return statistics.median(times)


def queued_ms(fn, iters, dispatch_ms, before=None):
    """time_ms(queued=True) of fn(), or None where it exceeds dispatch_ms (fn's time_ms unqueued)
    by over 5%: then fn() waits on the host inside and has waited out the spin kernel too, which
    queued timing cannot tell from its own work."""
    ms = time_ms(fn, iters, before, queued=True)
    return None if ms > 1.05 * dispatch_ms else ms


def bf16_matmul_flops(iters=20):
    """FLOP/s of an 8192^3 bf16 matmul on the current GPU."""
    m = torch.randn(3, 8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = time_ms(lambda: torch.matmul(m[0], m[1], out=m[2]), iters)
    return 2 * 8192**3 / (ms * 1e-3)
