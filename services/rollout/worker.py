"""The rollout worker loop: claim prompt jobs → reload weights if due → generate (the jobs that
sample alike in one engine call, services/rollout/batching.py) → the call's tail
(services/rollout/tail/finish.py: per job explore and select → score, a call's jobs in one request →
per job publish the scored group, which acks the job). In the service the tail runs beside the
next call's sampling (services/rollout/tail/runners.py), in a process of its own by default
(services/rollout/tail/process.py).

``step`` and ``process`` are the loop on one page; each stage is a method a unit test can drive
with fakes (an in-memory queue, a recording engine, a fake reward stub: tests/unit/services/
rollout/test_worker_loop.py). Between jobs the worker checks the run's weight pointer and reloads
the engine in place when a newer version is published, so every path carries the version that
produced it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Callable

from google.protobuf.message import DecodeError

from brorl import queue as q
from brorl import sampling
from brorl.v1 import common_pb2
from services.rollout import batching
from services.rollout.tail import runners as tails
from services.rollout.config import RolloutServiceConfig
from services.rollout.engine import EngineLock
from services.rollout.episodes import EnvironmentChannels, EpisodeRunner, episode_stats
from services.rollout.tail.finish import CallFinisher, Claimed, Generated, RunConsumers, WorkerStats
from services.rollout.scoring import RewardCalls
from services.rollout.weight_sync import WeightSync, weight_watch

log = logging.getLogger(__name__)

DEFAULTS = {k: f.default for k, f in RolloutServiceConfig.model_fields.items()}
# How often a worker with no run asks for one: a run's first jobs wait for it (at 0.5 s the
# first call of a demo_fast run started 0.39 s after its jobs); 20 Redis GETs a second are free.
NO_RUN_POLL_S = 0.05
# How often a worker holding jobs for a newer weight version reads the run's pointer: the learner
# waits for these groups, so the version is taken within this of its publication.
VERSION_POLL_S = 0.01


class Stopping(Exception):
    """The worker was stopped while it held jobs for a weight version: they stay pending."""


class RolloutWorker:
    def __init__(
        self,
        engine,
        engine_lock: EngineLock,
        registry: q.RunRegistry,
        open_run: Callable[[str], q.RunChannels],
        reward_stub,
        *,
        run_id: str = "",
        claim_idle_ms: int = DEFAULTS["claim_idle_ms"],
        batch_paths: int = DEFAULTS["batch_paths"],
        overlap_tail: bool = DEFAULTS["overlap_tail"],
        reward_deadline_s: float = DEFAULTS["reward_deadline_s"],
        weight_fetch_deadline_s: float = DEFAULTS["weight_fetch_deadline_s"],
        version_wait_s: float = DEFAULTS["version_wait_s"],
        watch_weights: bool = DEFAULTS["watch_weights"],
        background_cores: tuple[int, ...] = (),
        stats: WorkerStats | None = None,
        environments: EnvironmentChannels | None = None,
        finisher=None,
    ):
        """``registry`` says which run to follow (unless ``run_id`` fixes one); ``open_run``
        gives a run's channels (brorl.queue.RunChannels). The deadlines and the claim idle
        time default to the rollout config's (services/rollout/config.py owns them)."""
        self.engine, self.lock = engine, engine_lock
        self.registry, self.open_run = registry, open_run
        self.rewards = RewardCalls(reward_stub, reward_deadline_s)
        self.fixed_run_id = run_id
        self.batch_paths = batch_paths
        self.overlap_tail = overlap_tail
        self._claim_count = 1  # jobs to claim next (batching.claim_count after each call)
        self.stats = stats or WorkerStats()
        self.name = q.consumer_name()
        # runs a call's tail here or on the tail thread; finisher: one elsewhere (tail/process.py)
        self.finisher = finisher or CallFinisher(self.rewards, self.name, self.decode, self.stats)
        self._runs = RunConsumers(open_run, self.name, claim_idle_ms)  # each run: channels, queue
        # where the time between two jobs went (reported with the next group's stats)
        self._free_since = time.perf_counter()
        self._reload_s = 0.0
        self._tail_wait_s = 0.0  # the tail runner's waited_s at the previous call
        self.tails: tails.Inline | tails.TailThread = tails.Inline()  # run() overlaps them
        self.weights = WeightSync(engine, engine_lock, weight_fetch_deadline_s, background_cores)
        self.watch_weights = watch_weights
        self.version_wait_s = version_wait_s
        self._version_wait_s = 0.0  # held for a weight version since the previous call
        self.version_waits_expired = 0
        self._stop = threading.Event()  # run()'s
        self._run_id = ""  # the run the loop follows now, for the weights watch
        self.environments = environments or EnvironmentChannels()

    def run(self, stop: threading.Event) -> None:
        """The loop until ``stop``; with ``overlap_tail`` each call's tail runs beside the next
        call's sampling."""
        log.info("worker %s started", self.name)
        self._stop = stop
        self.tails = tails.TailThread() if self.overlap_tail else tails.Inline()
        try:
            with weight_watch(self.weights, self.followed, self.watch_weights):
                while not stop.is_set():
                    try:
                        self.step()
                    except Stopping:
                        break
                    except Exception:  # noqa: BLE001 - keep the loop alive; the job stays pending and is retried
                        log.exception("worker step failed; retrying in 2 s")
                        stop.wait(2.0)
        finally:
            self.tails.close()  # what was sampled is still published
            self.finisher.close()

    def followed(self) -> tuple[str, q.RunChannels | None]:
        """The run the loop follows and its channels, once opened (for the weights watch)."""
        return (run_id := self._run_id), self._runs.opened(run_id)

    # -- the loop ------------------------------------------------------------------------------
    def step(self) -> bool:
        """One turn of the loop: the jobs claimed together; False when there was nothing to do."""
        run_id = self._run_id = self.current_run()
        if not run_id:
            time.sleep(NO_RUN_POLL_S)
            return False
        self.maybe_reload(run_id)  # between calls: serve the run's newest published weights
        channels, queue = self._runs(run_id)
        deliveries = batching.claim(queue, self._claim_count, self.batch_paths)
        if not deliveries:
            return False
        lease = contextlib.ExitStack()  # held until the tail publishes: long jobs must not
        held = lease.enter_context(queue.lease(*(d.entry_id for d in deliveries)))  # look dead
        try:
            tail = self.sample_claims([Claimed(channels, queue, d, held) for d in deliveries])
        except BaseException:
            lease.close()
            raise
        self.tails.run(tail, then=lease.close)
        self._free_since = time.perf_counter()
        return True

    def process(self, claims: list[Claimed]) -> None:
        """Claimed jobs, start to end: generated together, each selected, all scored together,
        then each published as its own group; publishing a group acks its job."""
        self.sample_claims(claims)()

    def sample_claims(self, claims: list[Claimed]) -> tails.Tail:
        """The claimed jobs sampled together; returns the call's tail to run (the finisher's)."""
        jobs = [(claim, job) for claim in claims if (job := self.decode_job(claim)) is not None]
        self.await_version(max((job.min_weight_version for _, job in jobs), default=0))
        between = self._between_jobs()
        sampled = list(zip(jobs, self.generate_all([job for _, job in jobs])))
        version = self.engine.weight_version
        return lambda: self.finisher.finish(sampled, between, version)

    # -- its stages ----------------------------------------------------------------------------
    def decode_job(self, claim: Claimed) -> common_pb2.PromptJob | None:
        """The job, or None after dead-lettering an entry that is not one."""
        data = claim.delivery.data
        try:
            return common_pb2.PromptJob.FromString(data)
        except DecodeError as exc:
            claim.dead_letter(f"not a PromptJob: {exc}")
            return None

    def generate(self, job: common_pb2.PromptJob) -> Generated:
        """The job's candidates from the engine, sampled from the learner's prompt token ids
        when the job carries them (the ids the learner trains on), else from its text; with
        ``job.env`` set, its paths are episodes against that environment."""
        start = time.perf_counter()
        kwargs = self.engine_kwargs(job)
        if job.env.address:
            prompt = list(job.prompt_token_ids) or job.prompt
            return self.episodes(job, prompt, kwargs, start)
        return self.sample([job], kwargs)[0]

    def generate_all(self, jobs: list) -> list[Generated | ValueError]:
        """Each job's candidates, or the engine's refusal of its prompt: jobs with an environment
        run their episodes one by one; the others are sampled together, one engine call per set
        of equal sampling settings (batching.calls)."""
        out: list[Generated | ValueError | None] = [None] * len(jobs)
        plain = [i for i, job in enumerate(jobs) if not job.env.address]
        for i in sorted(set(range(len(jobs))) - set(plain)):
            out[i] = self._or_refusal(jobs[i])
        for kwargs, members in batching.calls([self.engine_kwargs(jobs[i]) for i in plain]):
            idx = [plain[m] for m in members]
            try:
                gens = self.sample([jobs[i] for i in idx], kwargs)
            except ValueError as exc:  # one refused prompt must not fail the call's others
                gens = [exc] if len(idx) == 1 else [self._or_refusal(jobs[i]) for i in idx]
            for i, gen in zip(idx, gens):
                out[i] = gen
        if plain:
            candidates = self.engine_kwargs(jobs[plain[-1]])["n"]
            self._claim_count = batching.claim_count(self.batch_paths, candidates)
        return out

    def _or_refusal(self, job) -> Generated | ValueError:
        try:
            return self.generate(job)
        except ValueError as exc:
            return exc

    @staticmethod
    def engine_kwargs(job: common_pb2.PromptJob) -> dict:
        """The engine's sampling settings for ``job`` (brorl.sampling owns them); ``n`` counts the
        candidates of a shared call (batching.width; hierarchical: M candidates, n kept)."""
        kwargs = sampling.effective(job.sampling).engine_kwargs()
        if candidates := batching.width(job):
            kwargs["n"] = candidates
        return kwargs

    def sample(self, jobs: list, kwargs: dict) -> list[Generated]:
        """One engine call for ``jobs`` (their prompts, the same settings); the call's seconds
        and its engine phases are shared out by paths (batching.shares)."""
        start = time.perf_counter()
        prompts = [list(job.prompt_token_ids) or job.prompt for job in jobs]
        with self.lock:
            version = self.engine.weight_version
            outputs = self.engine.generate(prompts, **kwargs)
            phases = dict(getattr(self.engine, "last_phases", {}))
        seconds = time.perf_counter() - start
        gens = []
        for (prompt_ids, samples), part in zip(
            outputs, batching.shares(1.0, [len(s) for _, s in outputs])
        ):
            self.stats.paths_generated += len(samples)
            self.stats.tokens_generated += sum(len(x.token_ids) for x in samples)
            gen = Generated(
                version, list(prompt_ids), samples, {k: v * part for k, v in phases.items()}
            )
            gen.seconds["generate"] = seconds * part
            gens.append(gen)
        return gens

    def episodes(self, job, prompt, engine_kwargs: dict, start: float) -> Generated:
        """The job's n paths as episodes (services/rollout/episodes.py)."""
        ids = list(prompt) if not isinstance(prompt, str) else self.engine.tokenizer.encode(prompt)
        env = self.environments.stub(job.env.address)
        runner = EpisodeRunner(self.engine, self.lock, env, job.env, self.engine.max_model_len)
        turn = {k: v for k, v in engine_kwargs.items() if k != "n"}
        version = self.engine.weight_version  # weights change only between jobs
        episodes = runner.run(job, ids, turn, job.sampling.n)
        self.stats.paths_generated += len(episodes)
        self.stats.tokens_generated += sum(sum(t > 0 for t in e.token_turns) for e in episodes)
        gen = Generated(version, ids, episodes, episode_stats(episodes))
        gen.seconds["generate"] = time.perf_counter() - start
        return gen

    def decode(self, token_ids: list[int]) -> str:
        """Text of ``token_ids`` as the engine detokenizes (explore's prefix scoring)."""
        return self.engine.decode(token_ids)

    # -- between jobs --------------------------------------------------------------------------
    def current_run(self) -> str:
        return self.fixed_run_id or self.registry.active()

    def maybe_reload(self, run_id: str) -> None:
        """Serve the run's newest published version (services/rollout/weight_sync.py). Versions
        count per run: a worker that served another run before reloads even a lower version
        (every run publishes v0)."""
        pointer = self._runs(run_id)[0].read_weights()
        if pointer is None or self.weights.current(run_id, pointer):
            return
        start = time.perf_counter()
        if self.weights.sync(run_id, pointer):  # fetch + verify + apply, bounded by a deadline
            self.stats.reloads += 1
            log.info(
                "serving weight version %d after %.2fs",
                self.engine.weight_version,
                time.perf_counter() - start,
            )
        self._reload_s += time.perf_counter() - start

    def await_version(self, version: int) -> None:
        """Hold the claimed jobs until the engine serves ``version`` of the followed run (the
        oldest their paths may have: services/learner/feed/lookahead.py), loading it as soon as
        it is published. After ``version_wait_s`` they are sampled with what the engine has
        (counted); a stop meanwhile leaves them pending for another worker (``Stopping``)."""
        run_id = self._run_id or self.fixed_run_id
        if not self._serving_below(run_id, version):
            return
        start = time.monotonic()
        while self._serving_below(run_id, version):
            if time.monotonic() - start > self.version_wait_s:
                self.version_waits_expired += 1
                log.warning(
                    "weight version %d not published after %.0fs: sampling with version %d",
                    version,
                    self.version_wait_s,
                    self.engine.weight_version,
                )
                break
            if self._stop.wait(VERSION_POLL_S):
                raise Stopping
            self.maybe_reload(run_id)
        self._version_wait_s += time.monotonic() - start

    def _serving_below(self, run_id: str, version: int) -> bool:
        if version <= 0:
            return False
        return self.weights.loaded_run != run_id or self.engine.weight_version < version

    def _between_jobs(self) -> dict[str, float]:
        """Since the previous call was handed to its tail: reloading weights, waiting for work;
        and before that hand-off, waiting for an earlier call's tail to finish."""
        waited, self._tail_wait_s = self.tails.waited_s - self._tail_wait_s, self.tails.waited_s
        out = {
            "rollout/publish_s": self.finisher.publish_s,
            "rollout/reload_s": self._reload_s,
            "rollout/idle_s": max(time.perf_counter() - self._free_since - self._reload_s, 0.0),
            "rollout/tail_wait_s": waited,
            "rollout/version_wait_s": self._version_wait_s,
            "rollout/version_waits_expired": float(self.version_waits_expired),
            **{k: float(v) for k, v in self.weights.counts.items()},  # cumulative, this worker
        }
        self._reload_s = self._version_wait_s = 0.0
        return out
