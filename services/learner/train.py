"""The learner's training loop, as one narrative:

  enqueue prompt jobs (bounded in flight) → collect scored groups from the paths stream
  (deduplicated by group id, stale ones dropped, all-equal ones skipped) → group advantages
  → clipped policy loss on DeepSpeed → ack → publish a weight version every K steps →
  checkpoint (weights, optimizer, step, data cursor) → metrics.
"""
from __future__ import annotations

import json
import logging
import math
import random
import time
from collections import Counter
from pathlib import Path

import torch

from brorl import queue as q
from brorl.errors import InvalidArgument
from brorl.runconfig import RunConfig
from brorl.v1 import common_pb2
from brorl.weights import WeightStore
from services.learner import strategy
from brorl.schedule import temperature_at
from services.learner.assembly import GroupAssembler
from services.learner.batch import advantages_of, build_batch
from services.learner.losses import policy_loss
from services.learner.publish import export_final, publish_version
from services.learner.runstate import RunState

log = logging.getLogger(__name__)


def load_prompts(path: str) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        raise InvalidArgument("data.train_path", f"file {p} does not exist")
    rows = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidArgument("data.train_path", f"line {n} is not JSON: {exc}") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"]:
            raise InvalidArgument("data.train_path", f"line {n} needs a non-empty string 'prompt'")
        rows.append({"prompt": row["prompt"], "reference": str(row.get("reference", ""))})
    if not rows:
        raise InvalidArgument("data.train_path", f"{p} holds no prompts")
    return rows


class PromptOrder:
    """Deterministic prompt order: a fresh permutation per epoch, addressed by a cursor."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed = n, seed
        self._epoch, self._perm = -1, []

    def __getitem__(self, cursor: int) -> int:
        epoch, i = divmod(cursor, self.n)
        if epoch != self._epoch:
            self._perm = list(range(self.n))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(self._perm)
            self._epoch = epoch
        return self._perm[i]


def reward_entropy(rewards: list[float]) -> float:
    counts = Counter(round(r, 6) for r in rewards)
    total = len(rewards)
    return -sum(c / total * math.log(c / total) for c in counts.values())


class Trainer:
    def __init__(self, run_id: str, cfg: RunConfig, state: RunState, redis_client, store: WeightStore,
                 zero_stage: int = 0, keep_versions: int = 3, resume: bool = False, namespace: str = "default"):
        self.run_id, self.cfg, self.state, self.r, self.store = run_id, cfg, state, redis_client, store
        self.zero_stage, self.keep_versions, self.resume = zero_stage, keep_versions, resume
        self.namespace = namespace
        self.keys = q.keys(run_id)
        self.prompts = load_prompts(cfg.data.train_path)
        self.order = PromptOrder(len(self.prompts), cfg.data.shuffle_seed)
        self.ckpt_dir = state.run_dir / "checkpoints"
        # Progress that a checkpoint must carry to resume exactly:
        self.step = 0
        self.version = 0
        self.cursor = 0                   # prompt jobs enqueued so far
        self.consumed = 0                 # groups taken off the paths stream (used or dropped)
        self.seen: set[str] = set()       # group ids already consumed (idempotency)
        self.counters: Counter = Counter()
        self.assembler = GroupAssembler()
        self._generated_since_update = 0
        self._degenerate_streak = 0
        self._last_group: dict[str, float] = {}

    # -- setup ---------------------------------------------------------------------------------
    def setup(self) -> None:
        from transformers import AutoModelForCausalLM
        torch.manual_seed(self.cfg.train.seed)
        model = AutoModelForCausalLM.from_pretrained(self.cfg.model, dtype=torch.float32)
        # padding positions are masked out; any in-vocabulary id does
        self.pad_id = next((i for i in (model.config.pad_token_id, model.config.eos_token_id) if isinstance(i, int)), 0)
        self.ref_model = None
        if self.cfg.train.kl_coef > 0:
            self.ref_model = AutoModelForCausalLM.from_pretrained(self.cfg.model, dtype=torch.float32).eval()
            self.ref_model.requires_grad_(False)
        self.engine = strategy.build_engine(model, self.cfg.train, self.zero_stage)
        self.prompt_queue = q.StreamQueue(self.r, self.keys["prompts"], "rollout", dead_stream=self.keys["dead"])
        # The learner is the group's only consumer: it takes over a dead predecessor's pending
        # groups once at start, and never reclaims from itself (parts of a fanned-out group
        # wait un-acked in the assembler until their siblings arrive).
        self.path_queue = q.StreamQueue(self.r, self.keys["paths"], "learner", dead_stream=self.keys["dead"],
                                        claim_idle_ms=2 ** 31 - 1)
        self._backlog = self.path_queue.take_over()
        if self.resume:
            self._restore()
        else:
            # Version 0 is the initial policy, published so that workers which served another
            # run before load it rather than keep that run's weights.
            self.version = -1
            self.publish()
        self.r.set(q.active_run_key(self.namespace), self.run_id)

    @property
    def model(self):
        return self.engine.module

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        self.setup()
        train = self.cfg.train
        self.state.emit({"learner/weight_version": self.version}, event="start")
        while self.step < train.steps and not self.state.stop_requested.is_set():
            t0 = time.perf_counter()
            self.top_up()
            groups, entries, intake = self.collect(train.groups_per_step)
            if groups is None:
                break  # stop requested while waiting
            t1 = time.perf_counter()
            metrics = self.update(groups)
            for entry in entries:
                self.path_queue.ack(entry)
            self.step += 1
            if self.step % self.cfg.asynchrony.publish_every == 0:
                self.publish()
            if self.cfg.checkpoint_every and self.step % self.cfg.checkpoint_every == 0:
                self.checkpoint()
            self._serve_checkpoint_request()
            metrics.update(intake)
            metrics.update({"learner/step_s": time.perf_counter() - t0, "learner/update_s": time.perf_counter() - t1,
                            "learner/wait_s": t1 - t0, "learner/weight_version": self.version})
            self.state.step, self.state.weight_version = self.step, self.version
            self.state.emit(metrics)
        self.checkpoint()
        export_final(self.model, self.cfg.model, self.state.run_dir / "final")
        if self.r.get(q.active_run_key(self.namespace)) == self.run_id.encode():
            self.r.delete(q.active_run_key(self.namespace))

    def top_up(self) -> None:
        """Keep max_inflight_groups groups enqueued but not yet consumed; a group is one prompt
        job, or several parts when sampling.max_paths_per_job fans it out over workers."""
        s, e = self.cfg.sampling, self.cfg.explore
        while self.cursor - self.consumed < self.cfg.asynchrony.max_inflight_groups:
            index = self.order[self.cursor]
            row = self.prompts[index]
            temperature = temperature_at(s.temperature_schedule, self.step) if s.temperature_schedule else s.temperature
            per_job = s.max_paths_per_job or s.n
            sizes = [min(per_job, s.n - off) for off in range(0, s.n, per_job)]
            for part, size in enumerate(sizes):
                # oversampling scales with the part: each part keeps its share of n
                m = max(math.ceil(e.oversample_m * size / s.n), size) if e.oversample_m else 0
                explore = common_pb2.ExploreParams(oversample_m=m, dedup=e.dedup, dedup_threshold=e.dedup_threshold,
                                                   dedup_method=e.dedup_method, embedding_model=e.embedding_model,
                                                   retention=e.retention, predictor=e.predictor,
                                                   predictor_prefix_tokens=e.predictor_prefix_tokens)
                job = common_pb2.PromptJob(
                    run_id=self.run_id, job_id=f"{self.run_id}/{self.cursor}/{part}", group_id=f"g{self.cursor}",
                    prompt_id=f"p{index}", prompt=row["prompt"], reference=row["reference"],
                    reward_fn=self.cfg.reward_fn, learner_step=self.step, part_index=part,
                    part_count=len(sizes), path_offset=part * per_job, explore=explore,
                    sampling=common_pb2.SamplingParams(n=size, temperature=temperature, top_k=s.top_k,
                                                       top_p=s.top_p, max_tokens=s.max_tokens, stop=s.stop))
                self.prompt_queue.put(job.SerializeToString())
            self.cursor += 1

    def collect(self, want: int):
        """Read groups until ``want`` usable ones are in hand; returns (groups, entry ids, metrics)."""
        groups, entries = [], []
        intake: Counter = Counter()
        deadline = time.monotonic() + self.cfg.asynchrony.group_timeout_s
        while len(groups) < want:
            if self.state.stop_requested.is_set():
                return None, entries, {}
            if time.monotonic() > deadline:
                raise TimeoutError(f"no path group for {self.cfg.asynchrony.group_timeout_s:.0f}s: "
                                   "are rollout workers and the reward service running?")
            if self._backlog:
                deliveries, self._backlog = self._backlog, []
            else:
                deliveries = self.path_queue.read(count=max(want - len(groups), 1), block_ms=1000)
            for d in deliveries:
                part = common_pb2.PathGroup.FromString(d.data)
                if part.group_id in self.seen:
                    self.path_queue.ack(d.entry_id)
                    intake["learner/duplicate_groups"] += 1
                    continue
                group, group_entries, duplicate = self.assembler.add(part, d.entry_id)
                if duplicate:
                    self.path_queue.ack(d.entry_id)
                    intake["learner/duplicate_parts"] += 1
                if group is None:
                    continue
                self.seen.add(group.group_id)
                self.consumed += 1
                self.top_up()
                deadline = time.monotonic() + self.cfg.asynchrony.group_timeout_s
                staleness = self.version - group.weight_version
                rewards = [p.reward for p in group.paths]
                self._count_intake(group, rewards, staleness)
                if staleness > self.cfg.asynchrony.max_staleness:
                    self.counters["learner/dropped_stale"] += 1
                    self.counters["learner/dropped_paths/stale"] += len(group.paths)
                    self._ack(group_entries)
                elif not rewards or max(rewards) == min(rewards):
                    self.counters["learner/skipped_degenerate"] += 1  # no signal: all advantages 0
                    self.counters["learner/dropped_paths/degenerate"] += len(group.paths)
                    self._ack(group_entries)
                    self._degenerate_streak += 1
                    if self._degenerate_streak >= self.cfg.asynchrony.max_degenerate_streak:
                        raise RuntimeError(
                            f"{self._degenerate_streak} groups in a row had all rewards equal "
                            f"(last: {rewards[0] if rewards else 'none'}): no learning signal; the task is too "
                            "hard or too easy for this policy, or the reward function does not fit the data")
                else:
                    self._degenerate_streak = 0
                    groups.append(group)
                    entries.extend(group_entries)
                    intake["learner/staleness_sum"] += staleness
        intake["learner/staleness_mean"] = intake.pop("learner/staleness_sum", 0) / max(len(groups), 1)
        return groups, entries, dict(intake)

    def _ack(self, entries: list[str]) -> None:
        for entry in entries:
            self.path_queue.ack(entry)

    def _count_intake(self, group, rewards: list[float], staleness: int) -> None:
        c = self.counters
        generated = group.generated or len(group.paths)
        c["rollout/groups"] += 1
        c["rollout/paths"] += len(group.paths)
        c["rollout/generated"] += generated
        self._generated_since_update += generated
        for path in group.paths:
            c[f"rollout/paths_by/{path.worker}"] += 1
        for reason, count in group.dropped.items():
            c[f"rollout/dropped/{reason}"] += count
        lengths = sorted(len(p.token_ids) for p in group.paths) or [0]
        tokens = sum(lengths)
        c["rollout/tokens"] += tokens
        self._last_group = {
            "rollout/tokens_per_s": tokens / max(group.generate_seconds, 1e-9),
            "rollout/samples_per_s": generated / max(group.generate_seconds, 1e-9),
            "rollout/length_mean": tokens / len(lengths),
            "rollout/length_p90": float(lengths[min(len(lengths) - 1, int(0.9 * len(lengths)))]),
            "reward/latency_ms": group.score_seconds * 1000,
            "reward/mean": sum(rewards) / max(len(rewards), 1),
            "explore/reward_entropy": reward_entropy(rewards) if rewards else 0.0,
            "rollout/staleness": staleness,
            "rollout/workers_in_group": float(len({p.worker for p in group.paths})),
            **{k: float(v) for k, v in group.stats.items()},
        }

    def update(self, groups) -> dict[str, float]:
        train = self.cfg.train
        batch = build_batch(groups, advantages_of(groups, train.normalize_std), self.pad_id)
        total_tokens = max(batch.tokens, 1)
        sums: Counter = Counter()
        self.engine.train()
        starts = list(range(0, len(batch), train.micro_batch_paths))
        for i, start in enumerate(starts):
            micro = batch.slice(start, start + train.micro_batch_paths)
            loss, stats = policy_loss(self.engine, micro, train, self.ref_model)
            weight = micro.tokens / total_tokens  # token-mean over the whole step
            last = i == len(starts) - 1
            self.engine.set_gradient_accumulation_boundary(last)
            self.engine.backward(loss * weight)
            if last:
                sums["learner/grad_norm"] = strategy.grad_norm(self.engine)
            self.engine.step()
            sums["learner/loss"] += float(loss.detach()) * weight
            for k, v in stats.items():
                sums[f"learner/{k}"] += v * weight
        rewards = [p.reward for g in groups for p in g.paths]
        metrics = dict(sums)
        metrics.update(self._last_group)
        metrics.update({k: float(v) for k, v in self.counters.items()})
        metrics.update({
            "learner/reward_mean": sum(rewards) / len(rewards),
            "learner/paths": len(batch), "learner/tokens": batch.tokens,
            "learner/adv_std": float(batch.advantages.std()) if len(batch) > 1 else 0.0,
            # effective update ratio: paths with a non-zero advantage that reach the update per
            # path generated since the last update (dropped, stale and all-equal groups included)
            "explore/eur": float(((batch.advantages != 0) & (batch.weight > 0)).sum()) / max(self._generated_since_update, 1),
        })
        self._generated_since_update = 0
        return metrics

    # -- weights and checkpoints ----------------------------------------------------------------
    def publish(self) -> None:
        self.version += 1
        publish_version(self.model, self.store, self.r, self.keys["weights"], self.version, self.step)
        self.store.prune(self.keep_versions)

    def checkpoint(self) -> str:
        tag = f"step{self.step:07d}"
        strategy.save_checkpoint(self.engine, str(self.ckpt_dir), tag, {
            "step": self.step, "version": self.version, "cursor": self.cursor, "consumed": self.consumed,
            "seen": sorted(self.seen), "counters": dict(self.counters)})
        log.info("checkpoint %s written", tag)
        self.state.last_checkpoint = (str(self.ckpt_dir / tag), self.step)
        return str(self.ckpt_dir / tag)

    def _serve_checkpoint_request(self) -> None:
        if self.state.checkpoint_requested.is_set():
            self.checkpoint()
            self.state.checkpoint_requested.clear()
            with self.state.checkpoint_done:
                self.state.checkpoint_done.notify_all()

    def _restore(self) -> None:
        client = strategy.load_checkpoint(self.engine, str(self.ckpt_dir))
        self.step, self.version = client["step"], client["version"]
        self.cursor, self.consumed = client["cursor"], client["consumed"]
        self.seen = set(client["seen"])
        self.counters = Counter(client.get("counters", {}))
        # Rollout workers may hold any version: republish the restored weights as a new one.
        self.publish()
        log.info("resumed at step %d (cursor %d, now weight version %d)", self.step, self.cursor, self.version)
