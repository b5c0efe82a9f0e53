"""CPU benchmark: memory and time of the learner's token log-prob + entropy computation.

Compares, in one run, the chunked path (``kernels.token_logprobs_entropy`` on CPU: online
log-sum-exp over vocabulary chunks, backward recomputed chunk by chunk) with the naive path
(``token_logprobs_entropy_reference``: full ``log_softmax``, autograd). Default shape:
B*T = 2,048 tokens (B=4, T=512), V = 151,936 (Qwen), float32 logits, temperature 1.

Method: every (path, mode) runs in its own fresh Python process. The process allocates the
logits (and ids, upstream grads), records its resident set size as the baseline, resets
the kernel's peak-RSS counter (``/proc/self/clear_refs`` <- 5, so VmHWM restarts at the
current RSS), runs the computation once, and reports extra = VmHWM - baseline. Modes:

* ``forward``: under ``torch.no_grad()`` (scoring old / reference policies);
* ``forward_backward``: forward with autograd, then backward into ``logits.grad``
  (a training step; the (B, T, V) gradient itself is part of both paths' peak).

``--truncated``: the same comparison for the learner's log-probs under top-k / top-p (default
the run config's 40 / 0.95): naive = what the learner did before, the (B, T, V) mask of
``truncate_logits_reference`` then ``token_logprobs_entropy``; chunked =
``truncated_logprobs_entropy`` (cut-offs and log-probs R positions at a time).

Time is the best of ``--repeats`` runs in the same process (wall and user+sys CPU seconds;
the first run, which also pays the page faults of fresh allocations, is reported apart).
On a shared machine wall times are noisy; CPU time is less so. The outputs of the two paths
are compared (first rows and checksums) to show they computed the same thing.
Prints ONE JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
# the printed object's documented keys (tests/unit/bench/test_bench_smoke.py checks them)
KEYS = (
    "bench",
    "shape",
    "forward.peak_extra_ratio_chunked_over_naive",
    "forward_backward.peak_extra_ratio_chunked_over_naive",
    "meets_quarter_memory_target",
)
# Run as a script, this file's folder comes first on sys.path and its own name would shadow
# the `kernels` package: put the repository root there instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/self/status")


def _truncated_fns(B: int, temperature: float, top_k: int, top_p: float):
    """(naive, chunked) log-prob functions under a top-k / top-p cut-off, (logits, ids, _)."""
    import torch

    from kernels import token_logprobs_entropy, truncate_logits_reference
    from kernels import truncated_logprobs_entropy

    temps = torch.full((B,), temperature)
    ks, ps = torch.full((B,), top_k), torch.full((B,), top_p)

    def naive(logits, ids, _):  # the learner's path before kernels.truncated_logprobs
        scaled = truncate_logits_reference(logits / temps[:, None, None], ks, ps, ids)
        return token_logprobs_entropy(scaled, ids, temperature=1.0)

    def chunked(logits, ids, _):
        return truncated_logprobs_entropy(logits, ids, temps, ks, ps)

    return naive, chunked


def _worker(path: str, mode: str, B: int, T: int, V: int, args: argparse.Namespace) -> dict:
    import torch

    from kernels import token_logprobs_entropy, token_logprobs_entropy_reference

    os.environ["BRORL_TRITON"] = "0"  # the CPU path, even if someone exported BRORL_TRITON=1
    temperature, repeats = args.temperature, args.repeats
    fn = token_logprobs_entropy if path == "chunked" else token_logprobs_entropy_reference
    if args.truncated:
        naive, chunked = _truncated_fns(B, temperature, args.top_k, args.top_p)
        fn = chunked if path == "chunked" else naive
    train = mode == "forward_backward"
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, T, V, generator=g).requires_grad_(train)  # (B, T, V)
    ids = torch.randint(0, V, (B, T), generator=g)  # (B, T)
    g_logp, g_ent = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g)

    def step():
        if not train:
            with torch.no_grad():
                return fn(logits, ids, temperature)
        logp, ent = fn(logits, ids, temperature)
        torch.autograd.backward([logp, ent], [g_logp, g_ent])
        return logp.detach(), ent.detach()

    gc.collect()
    baseline_kib = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # VmHWM := current RSS
        f.write("5")
    if _status_kib("VmHWM") > baseline_kib + 1024:
        raise RuntimeError("could not reset the peak RSS counter (/proc/self/clear_refs)")

    def timed():
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        out = step()
        r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        return out, t1 - t0, cpu

    (logp, ent), wall, cpu = timed()
    times, cpus = [wall], [cpu]
    peak_kib = _status_kib("VmHWM")
    out = {
        "logp_head": logp.flatten()[:8].tolist(),
        "entropy_head": ent.flatten()[:8].tolist(),
        "logp_sum": logp.double().sum().item(),
        "entropy_sum": ent.double().sum().item(),
    }
    if train:
        out["grad_head"] = logits.grad[0, 0, :8].tolist()
        out["grad_abs_sum"] = logits.grad.double().abs().sum().item()
    for _ in range(repeats - 1):
        logits.grad = None
        del logp, ent
        gc.collect()
        (logp, ent), wall, cpu = timed()
        times.append(wall)
        cpus.append(cpu)
    out.update(
        peak_extra_mib=round((peak_kib - baseline_kib) / 1024, 1),
        baseline_rss_mib=round(baseline_kib / 1024, 1),
        time_s=round(min(times), 3),
        first_time_s=round(times[0], 3),
        cpu_time_s=round(min(cpus), 3),
        threads=torch.get_num_threads(),
    )
    return out


def _spawn(path: str, mode: str, args: argparse.Namespace) -> dict:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        path,
        mode,
        "--bt",
        str(args.bt),
        "--batch",
        str(args.batch),
        "--vocab",
        str(args.vocab),
        "--temperature",
        str(args.temperature),
        "--repeats",
        str(args.repeats),
        "--top-k",
        str(args.top_k),
        "--top-p",
        str(args.top_p),
    ] + (["--truncated"] if args.truncated else [])
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{path}/{mode} worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _max_diff(a: list, b: list) -> float:
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bt", type=int, default=2048, help="tokens per step, B*T")
    ap.add_argument("--batch", type=int, default=4, help="B (T = bt / B)")
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--truncated", action="store_true", help="log-probs under top-k / top-p")
    ap.add_argument("--top-k", type=int, default=40, help="with --truncated; -1: off")
    ap.add_argument("--top-p", type=float, default=0.95, help="with --truncated; 1: off")
    ap.add_argument("--worker", nargs=2, metavar=("PATH", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bt % args.batch:
        ap.error("--bt must be a multiple of --batch")
    B, T, V = args.batch, args.bt // args.batch, args.vocab
    if args.worker:
        print(json.dumps(_worker(*args.worker, B, T, V, args)))
        return

    op = "truncated_logprobs_entropy" if args.truncated else "token_logprobs_entropy"
    result: dict = {
        "bench": f"kernels.{op} (CPU)",
        "shape": {"B": B, "T": T, "B_T": B * T, "V": V},
        "dtype": "float32",
        "temperature": args.temperature,
        "logits_mib": round(B * T * V * 4 / MIB, 1),
        "method": "fresh process per path/mode; extra = VmHWM - RSS after allocating logits "
        "(peak reset via /proc/self/clear_refs); time = best of repeats",
    }
    if args.truncated:
        result.update(top_k=args.top_k, top_p=args.top_p)
    ok = True
    for mode in ("forward", "forward_backward"):
        naive, chunked = _spawn("naive", mode, args), _spawn("chunked", mode, args)
        ratio = chunked["peak_extra_mib"] / max(naive["peak_extra_mib"], 1e-9)
        diff = {
            k: _max_diff(naive[k], chunked[k])
            for k in ("logp_head", "entropy_head", "grad_head")
            if k in naive
        }
        diff["entropy_sum_rel"] = abs(naive["entropy_sum"] - chunked["entropy_sum"]) / abs(
            naive["entropy_sum"]
        )
        if "grad_abs_sum" in naive:
            diff["grad_abs_sum_rel"] = (
                abs(naive["grad_abs_sum"] - chunked["grad_abs_sum"]) / naive["grad_abs_sum"]
            )
        pick = ("peak_extra_mib", "time_s", "cpu_time_s", "first_time_s")
        result[mode] = {
            "naive": {k: naive[k] for k in pick},
            "chunked": {k: chunked[k] for k in pick},
            "peak_extra_ratio_chunked_over_naive": round(ratio, 4),
            "speed_ratio_naive_over_chunked": round(naive["time_s"] / chunked["time_s"], 3),
            "max_abs_diff": {k: float(f"{v:.3g}") for k, v in diff.items()},
        }
        if mode == "forward_backward":  # the (B, T, V) gradient both paths must produce
            result[mode]["of_which_logits_grad_mib"] = result["logits_mib"]
        ok = ok and ratio <= 0.25
        result["threads"] = naive["threads"]
    result["meets_quarter_memory_target"] = ok
    print(json.dumps(result))


if __name__ == "__main__":
    main()
