"""Multi-turn episodes at BroRL's width, measured in one run: N episodes of one prompt, each
``--turns`` policy turns against a real environment service over gRPC (loopback, its own
process), driven by the rollout worker's episode runner (services/rollout/episodes.py) on a
real vLLM engine; then the same engine sampling the same prompt single-turn.

    python bench/episodes.py [--n 512] [--turns 3] [--turn-tokens 8] [--repeats 2]

The environment answers every turn with a 2-token observation and ends the episode at the last
turn, whatever the policy writes; observations are chat turns (``env.chat``), so a turn that
ends with EOS does not end its episode and every episode runs all its turns. The model is the
demo's tiny Qwen2 (random weights, the tool-use task's characters), created here.

Prints one JSON object: ``episodes_per_s``, ``complete_share`` (episodes that ran every turn with
status ok), ``engine_calls``, policy and environment tokens, the environment's Step latency
(p50/p95 ms, as the runner measured it), and ``overhead``: the episodes' wall-clock ÷ the time
the single-turn run takes for the same number of policy tokens (its tokens/s). Above 1 is the
price of turns: an engine call per turn (the batch shrinks as turns end at different times),
the observations' tokens to prefill, and the wait for the environment. ``logp_gap_turn{k}`` and
``logp_gap_single_turn``: token continuity — the mean |log-prob| difference between the
sampler's log-probs and transformers' on the kept ids (same fp32 files), per policy turn of the
episodes and for single-turn paths.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import stdout_to_stderr  # noqa: E402

PROMPT = "37*48="
OBSERVATION = "1|"
# the printed object's documented keys (tests/unit/bench/test_bench_smoke.py checks them)
KEYS = ("episodes_per_s", "complete_share", "engine_calls", "policy_tokens", "env_tokens",
        "env_step_ms_p50", "env_step_ms_p95", "overhead", "logp_gap_single_turn",
        "logp_gap_turn1")  # fmt: skip


class FixedTurns:
    """Every episode lasts ``turns`` policy turns; each turn answered ``1|``."""

    name, version, description = "fixed-turns", "1", "a fixed number of turns (bench)"

    def __init__(self, turns: int):
        self.max_turns = turns

    def reset(self, prompt, reference, extra, seed):
        return {}, ""

    def step(self, state, turn, action, policy_done):
        from envs.base import Turn

        last = turn >= self.max_turns
        return Turn(observation="" if last else OBSERVATION, reward=float(last), done=last)


def serve_environment(turns: int, port_queue) -> None:
    """A FixedTurns environment service on a free loopback port, in its own process (as a real
    environment is: its gRPC threads do not share this process's interpreter lock)."""
    from brorl import rpc
    from brorl.v1 import environment_pb2_grpc
    from envs.episodes import EpisodeTable
    from envs.server import SERVICE_NAME, EnvironmentServicer

    server = rpc.Server("127.0.0.1:0", [SERVICE_NAME], max_workers=64, max_concurrent_rpcs=8192)
    servicer = EnvironmentServicer(EpisodeTable(FixedTurns(turns)))
    environment_pb2_grpc.add_EnvironmentServiceServicer_to_server(servicer, server.grpc)
    server.start().set_serving(True)
    port_queue.put(server.port)
    threading.Event().wait()  # until the parent terminates this process


def start_environment(turns: int):
    """(process, stub) of the environment service."""
    import multiprocessing

    import grpc

    from brorl.v1 import environment_pb2_grpc

    ctx = multiprocessing.get_context("spawn")
    ports = ctx.Queue()
    proc = ctx.Process(target=serve_environment, args=(turns, ports), daemon=True)
    proc.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{ports.get(timeout=60)}")
    return proc, environment_pb2_grpc.EnvironmentServiceStub(channel)


class CountingEngine:
    """The engine as the runner sees it, counting its calls."""

    def __init__(self, engine):
        self.engine, self.calls, self.seconds = engine, 0, 0.0
        self.tokenizer, self.max_model_len = engine.tokenizer, engine.max_model_len

    def generate(self, prompts, **kwargs):
        self.calls += 1
        start = time.perf_counter()
        try:
            return self.engine.generate(prompts, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start

    def encode(self, text):
        return self.engine.encode(text)

    def decode(self, ids):
        return self.engine.decode(ids)


def run_episodes(engine, stub, args, repeat: int) -> tuple[dict, list]:
    """(timings and counts, the episodes) of one run of N episodes."""
    from brorl.contract import RewardStatus, TokenTurn
    from brorl.v1 import common_pb2
    from services.rollout.episodes import EpisodeRunner

    params = common_pb2.EnvironmentParams(
        address="bench", max_turns=args.turns, step_timeout_s=30.0, episode_timeout_s=600.0,
        max_inflight_steps=64, chat=True, chat_turn=common_pb2.ChatTurn(before=" "),
    )  # fmt: skip
    counting = CountingEngine(engine)
    runner = EpisodeRunner(counting, threading.Lock(), stub, params, engine.max_model_len)
    job = common_pb2.PromptJob(job_id=f"bench/{repeat}", prompt=PROMPT, reference="1776")
    sampling = dict(temperature=1.0, top_k=-1, top_p=1.0, max_tokens=args.turn_tokens, stop=None)
    start = time.perf_counter()
    episodes = runner.run(job, engine.encode(PROMPT), sampling, args.n)
    seconds = time.perf_counter() - start
    policy = sum(t != TokenTurn.ENVIRONMENT for e in episodes for t in e.token_turns)
    steps_ms = [1000 * e.env_seconds / max(e.turns, 1) for e in episodes]
    stats = {
        "seconds": seconds,
        "episodes_per_s": len(episodes) / seconds,
        "complete_share": sum(
            e.turns == args.turns and e.status == RewardStatus.OK for e in episodes
        ) / len(episodes),
        "turns_mean": statistics.fmean(e.turns for e in episodes),
        "engine_calls": counting.calls,
        "engine_seconds": counting.seconds,
        "policy_tokens": policy,
        "env_tokens": sum(len(e.token_ids) for e in episodes) - policy,
        "env_step_ms_p50": statistics.median(steps_ms),
        "env_step_ms_p95": statistics.quantiles(steps_ms, n=20)[-1] if len(steps_ms) > 1 else 0,
    }
    return stats, episodes


def logp_gaps(model_dir: str, prompt_ids: list[int], paths: list, turns_of) -> dict[str, float]:
    """Mean |log π_transformers − log π_sampler| over the policy's tokens of ``paths``, by turn
    (``turns_of(path)``: each token's turn, 0 the environment's): token continuity in numbers.
    The sampler is vLLM serving the same fp32 files at temperature 1, so what is left is the two
    engines' numerical difference — the same for every turn unless the ids sampled from differ
    from the ids kept."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    sums: dict[int, list[float]] = {}
    with torch.no_grad():
        for path in paths:
            ids = torch.tensor([prompt_ids + list(path.token_ids)])  # (1, T)
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), -1)
            start = len(prompt_ids) - 1  # the logits that predict the path's tokens
            for i, (token, turn) in enumerate(zip(path.token_ids, turns_of(path))):
                if turn:
                    gap = abs(float(logp[start + i, token]) - path.logprobs[i])
                    sums.setdefault(turn, []).append(gap)
    return {f"turn{k}": statistics.fmean(v) for k, v in sorted(sums.items())}


def run_single_turn(engine, args) -> tuple[dict, list]:
    """(timings and counts, the samples) of N paths of the prompt in one call with the
    episodes' whole token budget."""
    start = time.perf_counter()
    [(_, samples)] = engine.generate(
        [PROMPT], n=args.n, temperature=1.0, max_tokens=args.turns * args.turn_tokens
    )
    seconds = time.perf_counter() - start
    tokens = sum(len(s.token_ids) for s in samples)
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}, samples


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=512, help="episodes of the one prompt")
    p.add_argument("--turns", type=int, default=3, help="policy turns per episode")
    p.add_argument("--turn-tokens", type=int, default=8, help="tokens per policy turn at most")
    p.add_argument("--repeats", type=int, default=2, help="runs of each; the best is kept")
    p.add_argument("--gap-paths", type=int, default=64, help="paths whose log-prob gap is measured")
    args = p.parse_args()

    with stdout_to_stderr(), tempfile.TemporaryDirectory() as tmp:  # vLLM logs to stdout
        from demo.model import create_tiny_model
        from demo.tooluse import CHARS
        from services.rollout.engine import RolloutEngine

        model = create_tiny_model(Path(tmp) / "tiny", chars=CHARS, max_position=128)
        engine = RolloutEngine(str(model), max_num_seqs=max(args.n, 16))
        env, stub = start_environment(args.turns)
        try:
            runs = [run_episodes(engine, stub, args, r) for r in range(args.repeats)]
            flats = [run_single_turn(engine, args) for _ in range(args.repeats)]
            prompt_ids = engine.encode(PROMPT)
        finally:
            env.terminate()  # by its pid
            env.join(10)
            engine.close()
        k = min(args.gap_paths, args.n)
        gaps = logp_gaps(str(model), prompt_ids, runs[-1][1][:k], lambda e: e.token_turns)
        flat_gap = logp_gaps(str(model), prompt_ids, flats[-1][1][:k],
                             lambda s: [1] * len(s.token_ids))["turn1"]  # fmt: skip
    best = min((stats for stats, _ in runs), key=lambda r: r["seconds"])
    flat = max((stats for stats, _ in flats), key=lambda r: r["tokens_per_s"])
    same_tokens_s = best["policy_tokens"] / flat["tokens_per_s"]
    print(
        json.dumps(
            {
                "n": args.n,
                "turns": args.turns,
                "turn_tokens": args.turn_tokens,
                **{k: round(v, 4) if isinstance(v, float) else v for k, v in best.items()},
                "single_turn_seconds": round(flat["seconds"], 4),
                "single_turn_tokens": flat["tokens"],
                "single_turn_tokens_per_s": round(flat["tokens_per_s"], 1),
                "single_turn_seconds_same_tokens": round(same_tokens_s, 4),
                "overhead": round(best["seconds"] / same_tokens_s, 3),
                "logp_gap_single_turn": float(f"{flat_gap:.3g}"),
                **{f"logp_gap_{t}": float(f"{g:.3g}") for t, g in gaps.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
