"""Forward+backward throughput: SV-Attention (batched) against causal softmax attention.

For each T, both run on the same ``[B, H, T, D]`` tensors in one process:

* ``op``: :func:`svattn.nn.sv_attention` (``mode="batched"``) vs
  :func:`torch.nn.functional.scaled_dot_product_attention` (``is_causal=True``);
* ``layer``: :class:`svattn.nn.SVAttention` vs the same projections around SDPA.

Prints tokens/s (B·T per forward+backward) and the slowdown ratio, on CPU and on
CUDA when present (``--device`` picks one), in each ``--dtype`` (fp32, bf16), with
the peak device memory of each configuration on CUDA. ``--profile`` adds a torch
profiler table for the SV op. ``--json`` writes the rows with the command.

Run: ``.venv/bin/python benchmarks/bench_layers.py [--T 256 1024] [--device cuda]
[--dtype fp32 bf16] [--profile] [--json results/bench_layers.json]``
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from svattn.nn import SVAttention, sv_attention


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


def _time(fn, device: torch.device, reps: int) -> float:
    """Best of ``reps`` timed calls after one warm-up (robust on shared CPUs)."""
    fn()
    best = float("inf")
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


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
            _peak_reset(device)
            t_sv = _time(sv_fn, device, reps)
            row["sv_peak_mib"] = _peak_mib(device)
            _peak_reset(device)
            t_sm = _time(sm_fn, device, reps)
            row["softmax_peak_mib"] = _peak_mib(device)
        except (RuntimeError, ValueError) as err:  # e.g. a dtype the layer refuses
            print(f"{device.type:5} {dtype:4} {name:5} T={T:5d}  failed: {err}")
            rows.append({**row, "error": str(err).splitlines()[0]})
            continue
        print(
            f"{device.type:5} {dtype:4} {name:5} T={T:5d}  SV {B * T / t_sv:10.0f} tok/s  "
            f"softmax {B * T / t_sm:10.0f} tok/s  ratio {t_sv / t_sm:6.2f}x"
        )
        rows.append({**row, "sv_tok_s": B * T / t_sv, "softmax_tok_s": B * T / t_sm,
                     "slowdown": t_sv / t_sm})  # fmt: skip
    print(f"{'':11} tokens_kept (largest memory over batch and head) = {sv_layer.tokens_kept()}")
    return rows


def profile(device: torch.device, B: int, H: int, T: int, D: int, C: float) -> None:
    from torch.profiler import ProfilerActivity, profile, record_function

    q, k, v = (torch.randn(B, H, T, D, device=device, requires_grad=True) for _ in range(3))
    sv_attention(q, k, v, C=C).sum().backward()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts, with_stack=False) as prof:
        with record_function("sv_attention fwd+bwd"):
            sv_attention(q, k, v, C=C).sum().backward()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--D", type=int, default=32)
    ap.add_argument("--C", type=float, default=0.05)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="auto: cpu, and cuda when present")
    ap.add_argument("--dtype", nargs="+", choices=sorted(DTYPES), default=["fp32"])
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the rows to this file")
    args = ap.parse_args()
    rows = []
    if args.device == "auto":
        devices = [torch.device("cpu")] + (
            [torch.device("cuda")] if torch.cuda.is_available() else [])
    else:
        devices = [torch.device(args.device)]
    print(f"B={args.B} H={args.H} D={args.D} C={args.C} threads={torch.get_num_threads()}")
    for device in devices:
        for dtype in args.dtype:
            for T in args.T:
                rows += bench(device, args.B, args.H, T, args.D, args.C, args.reps, dtype)
        if args.profile:
            profile(device, args.B, args.H, max(args.T), args.D, args.C)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {"command": "python benchmarks/bench_layers.py " + shlex.join(sys.argv[1:]),
               "torch": torch.__version__, "rows": rows}
        args.json.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
