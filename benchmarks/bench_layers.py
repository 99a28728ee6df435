"""Forward+backward time: SV-Attention (batched) against causal softmax attention.

For each T, both run on the same ``[B, H, T, D]`` tensors in one process:

* ``op``: :func:`svattn.nn.sv_attention` (``mode="batched"``, the default
  ``SolverOptions()``) vs :func:`torch.nn.functional.scaled_dot_product_attention`
  (``is_causal=True``);
* ``layer``: :class:`svattn.nn.SVAttention` vs the same projections around SDPA.

Each pair is timed side by side: one warm-up call each (compilation — numba kernels on
first use — stays outside the figures; the first call's time is recorded apart), then
``--reps`` rounds alternating SV and softmax, so load from other jobs falls on both.
The row holds the median and best of each and the ratio of the medians (``slowdown``:
how many times the SV call takes), in wall time and in this process's CPU time
(``cpu_slowdown``: on a shared machine the steadier of the two), on CPU with
``--threads`` threads (default 1) and on CUDA when present (``--device`` picks one), in
each ``--dtype`` (fp32, bf16), with the peak device memory on CUDA. ``--profile`` adds
a torch profiler table of one SV layer call at the largest T; its top items go into the
record. ``--no-working-set`` runs the full optimum finish at every size (the reference
of :mod:`svattn.nn.working_set`, which takes over from 1,024 keys on CPU). ``--json``
writes the rows with the command, the machine and the load average around the run.

Run: ``.venv/bin/python benchmarks/bench_layers.py [--T 256 1024 4096] [--device cuda]
[--dtype fp32 bf16] [--profile] [--conditions TEXT] [--json results/bench_layers.json]``
(the defaults take about a minute on one idle core).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from svattn.nn import SolverOptions, SVAttention, sv_attention, working_set


class SoftmaxAttention(nn.Module):
    """The baseline layer: SVAttention's projections around causal SDPA."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.h = n_heads
        self.qkv = nn.ModuleList(nn.Linear(d_model, d_model, bias=False) for _ in range(3))
        self.out = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.h, C // self.h).transpose(1, 2) for p in self.qkv)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        return self.out(o.transpose(1, 2).reshape(B, T, C))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _once(fn, device: torch.device) -> tuple[float, float]:
    """Wall and CPU (this process) seconds of one call."""
    _sync(device)
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    _sync(device)
    return time.perf_counter() - t0, time.process_time() - c0


def _side_by_side(sv_fn, sm_fn, device: torch.device, reps: int) -> dict:
    """Warm-up each (its time and peak device memory recorded), then ``reps`` rounds
    alternating the two."""
    _peak_reset(device)
    first = {"sv_first_call_s": _once(sv_fn, device)[0], "sv_peak_mib": _peak_mib(device)}
    _peak_reset(device)
    first.update(softmax_first_call_s=_once(sm_fn, device)[0], softmax_peak_mib=_peak_mib(device))
    sv, sm = [], []
    for _ in range(reps):
        sv.append(_once(sv_fn, device))
        sm.append(_once(sm_fn, device))
    out = dict(first)
    for unit, i in (("", 0), ("cpu_", 1)):
        a, b = [t[i] for t in sv], [t[i] for t in sm]
        out.update({f"sv_{unit}s": a, f"softmax_{unit}s": b,
                    f"sv_{unit}median_s": statistics.median(a),
                    f"softmax_{unit}median_s": statistics.median(b),
                    f"{unit}slowdown": statistics.median(a) / statistics.median(b),
                    f"{unit}slowdown_best": min(a) / min(b)})
    return out


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _peak_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)


def _peak_mib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def bench(
    device: torch.device, B: int, H: int, T: int, D: int, C: float, reps: int,
    dtype: str = "fp32",
) -> list[dict]:  # fmt: skip
    g = torch.Generator(device="cpu").manual_seed(0)
    dt = DTYPES[dtype]

    def leaf(*shape):
        return torch.randn(*shape, generator=g).to(device, dt).requires_grad_(True)

    q, k, v = leaf(B, H, T, D), leaf(B, H, T, D), leaf(B, H, T, D)

    def sv_op():
        sv_attention(q, k, v, C=C).sum().backward()

    def sdpa_op():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    x = leaf(B, T, H * D)
    sv_layer = SVAttention(H * D, H, C=C).to(device, dt)
    sm_layer = SoftmaxAttention(H * D, H).to(device, dt)

    def sv_lay():
        sv_layer(x).sum().backward()

    def sm_lay():
        sm_layer(x).sum().backward()

    rows = []
    for name, sv_fn, sm_fn in (("op", sv_op, sdpa_op), ("layer", sv_lay, sm_lay)):
        row = {"device": device.type, "dtype": dtype, "what": name, "B": B, "H": H, "T": T,
               "D": D, "C": C, "threads": torch.get_num_threads()}  # fmt: skip
        try:
            timed = _side_by_side(sv_fn, sm_fn, device, reps)
        except (RuntimeError, ValueError) as err:  # e.g. a dtype the layer refuses
            print(f"{device.type:5} {dtype:4} {name:5} T={T:5d}  failed: {err}")
            rows.append({**row, "error": str(err).splitlines()[0]})
            continue
        t_sv, t_sm = timed["sv_median_s"], timed["softmax_median_s"]
        print(
            f"{device.type:5} {dtype:4} {name:5} T={T:5d}  SV {B * T / t_sv:10.0f} tok/s  "
            f"softmax {B * T / t_sm:10.0f} tok/s  ratio {timed['slowdown']:6.2f}x (medians of "
            f"{reps}; best {timed['slowdown_best']:.2f}x; CPU time {timed['cpu_slowdown']:.2f}x)"
        )
        rows.append({**row, "sv_tok_s": B * T / t_sv, "softmax_tok_s": B * T / t_sm, **timed})
    print(f"{'':11} tokens_kept (largest memory over batch and head) = {sv_layer.tokens_kept()}")
    return rows


def profile(device: torch.device, B: int, H: int, T: int, D: int, C: float, top: int) -> dict:
    """One SV layer call (forward + backward) under the torch profiler, after a warm-up:
    prints the table, returns its ``top`` items by self CPU time."""
    from torch.profiler import ProfilerActivity, profile, record_function

    x = torch.randn(B, T, H * D, device=device, requires_grad=True)
    layer = SVAttention(H * D, H, C=C).to(device)
    layer(x).sum().backward()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts, with_stack=False) as prof:
        with record_function("SVAttention fwd+bwd"):
            layer(x).sum().backward()
    avg = prof.key_averages()
    print(avg.table(sort_by="self_cpu_time_total", row_limit=top))
    items = sorted(avg, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    total = sum(e.self_cpu_time_total for e in avg)
    return {"what": "layer", "device": device.type, "B": B, "H": H, "T": T, "D": D, "C": C,
            "note": "self CPU time; the record_function row's self time is the Python and "
                    "numba work (working-set finish, copy groups) outside torch operators",
            "total_ms": total / 1e3,
            "top": [{"name": e.key, "self_cpu_ms": e.self_cpu_time_total / 1e3,
                     "share": e.self_cpu_time_total / total, "calls": e.count} for e in items]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--D", type=int, default=32)
    ap.add_argument("--C", type=float, default=0.05)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="auto: cpu, and cuda when present")
    ap.add_argument("--dtype", nargs="+", choices=sorted(DTYPES), default=["fp32"])
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--profile-top", type=int, default=12)
    ap.add_argument("--no-working-set", action="store_true",
                    help="the full optimum finish at every size (the working set's reference)")
    ap.add_argument("--conditions", default="",
                    help="what else ran on the machine (written to the record)")
    ap.add_argument("--json", type=Path, help="also write the rows to this file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.no_working_set:
        working_set.WORKING_SET_MIN = sys.maxsize
    rows, profiles = [], []
    if args.device == "auto":
        devices = [torch.device("cpu")] + (
            [torch.device("cuda")] if torch.cuda.is_available() else [])
    else:
        devices = [torch.device(args.device)]
    load_before = os.getloadavg()
    print(f"B={args.B} H={args.H} D={args.D} C={args.C} threads={torch.get_num_threads()} "
          f"load average {load_before[0]:.2f}")
    for device in devices:
        for dtype in args.dtype:
            for T in args.T:
                rows += bench(device, args.B, args.H, T, args.D, args.C, args.reps, dtype)
        if args.profile:
            profiles.append(profile(device, args.B, args.H, max(args.T), args.D, args.C,
                                    args.profile_top))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {"command": "python benchmarks/bench_layers.py " + shlex.join(sys.argv[1:]),
               "machine": f"{platform.machine()} {platform.processor() or 'CPU'}, "
                          f"{os.cpu_count()} cores, {torch.get_num_threads()} torch threads",
               "conditions": args.conditions,
               "load_average_1min": {"before": load_before[0], "after": os.getloadavg()[0]},
               "torch": torch.__version__, "solver": repr(SolverOptions()),
               "working_set_from_keys": min(working_set.WORKING_SET_MIN, 10**9), "rows": rows,
               "profile": profiles}
        args.json.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
