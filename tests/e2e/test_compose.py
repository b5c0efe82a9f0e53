"""docker-compose.yml for real, on an engine of the test's own (tests/e2e/compose/): the images
built without a registry, the cpu profile up with the tiny model mounted, a run started from the
host through the learner's published port that trains, `--scale rollout=2` while it runs (both
workers in one step's metrics), a rollout container killed while it holds a job (the job re-sent
and published once, no group trained twice), `down -v`, the engine stopped by its pid and nothing
of it left. A broken image fails with the service's name and last log lines.

Needs root (it installs docker.io and mmdebstrap with apt and starts dockerd when none answers).
Phase times are printed as `[compose] ...` lines as they happen (past pytest's capture).
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

from tests.e2e.compose import images, k8s_pods, scenario
from tests.e2e.compose.audit import PathAudit
from tests.e2e.compose.cluster import Compose, ServiceFailed
from tests.e2e.compose.engine import Engine, sh

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.docker]

STEPS = 200  # an upper bound: the run is stopped once the checks are done


PHASES: list[str] = []
_CAPTURE = []  # pytest's capture manager, to print the phase lines as they happen


@pytest.fixture(scope="module", autouse=True)
def _uncaptured(pytestconfig):
    _CAPTURE[:] = [pytestconfig.pluginmanager.get_plugin("capturemanager")]
    yield
    _CAPTURE.clear()


def phase(name: str, seconds: float, **facts) -> None:
    extra = "".join(f" {k}={v}" for k, v in facts.items())
    PHASES.append(f"[compose] {name}: {seconds:.1f} s{extra}")
    capture = _CAPTURE[0] if _CAPTURE else None
    if capture is None:
        print(PHASES[-1], file=sys.stderr, flush=True)
        return
    with capture.global_and_fixture_disabled():
        print(PHASES[-1], file=sys.stderr, flush=True)


@pytest.fixture(scope="module")
def engine():
    t0 = time.monotonic()
    eng = Engine().start()
    phase("engine start", time.monotonic() - t0, owned=eng.owned)
    yield eng
    eng.stop()  # the last test stops it and checks; this is for a failure before it


@pytest.fixture(scope="module")
def built(engine):
    t0 = time.monotonic()
    times = images.build_all()
    phase(
        "build",
        time.monotonic() - t0,
        **{k: f"{v:.1f}s" for k, v in times.items()},
        cpu_image_mb=round(images.image_size_mb(images.CPU_IMAGE)),
    )
    return times


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compose")
    model, datasets = scenario.make_inputs(root)
    (root / "secrets").mkdir()
    return {"model_dir": model, "datasets_dir": datasets, "secrets_dir": root / "secrets"}


def _project(kind: str) -> str:
    return f"brorl-{kind}-{uuid.uuid4().hex[:6]}"


def test_broken_image_fails_naming_the_service_and_its_last_log_lines(built, inputs):
    broken = images.build_broken()
    compose = Compose(_project("broken"), cpu_image=broken, **inputs)
    t0 = time.monotonic()
    try:
        with pytest.raises(ServiceFailed) as failed:
            compose.up(["learner"], timeout=120)
    finally:
        compose.down()
        sh("docker", "rmi", broken, check=False)
    message = str(failed.value)
    phase("broken image detected", time.monotonic() - t0)
    assert "service learner" in message, message
    assert "No module named services.learner" in message, message
    assert "last 15 log lines of learner" in message, message
    assert compose.leftovers() == []


def test_cluster_trains_scales_and_survives_a_killed_worker(built, inputs):
    compose = Compose(_project("ci"), **inputs)
    run_id = f"compose-{uuid.uuid4().hex[:6]}"
    audit = None
    try:
        phase("up", compose.up(["redis", "reward", "rollout", "learner"]))
        t0 = time.monotonic()
        audit = PathAudit(compose.redis_url, run_id)  # before the run: every publish seen
        run = scenario.Run.start(compose.learner_address, run_id, STEPS)
        run.wait("3 trained steps", lambda v: v["step"] >= 3 and "learner/loss" in v)
        [first] = compose.containers("rollout")
        version = scenario.worker_weight_version(first["Id"])
        assert version >= 1, "no weight version reached the rollout worker"
        phase("run to step 3", time.monotonic() - t0, worker_weight_version=version)

        t0 = time.monotonic()
        compose.up(["rollout"], scale={"rollout": 2})
        both = run.wait("both workers in one step", lambda v: len(scenario.workers_of(v)) == 2)
        phase(
            "scale to 2",
            time.monotonic() - t0,
            step=both["step"],
            workers=sorted(scenario.workers_of(both)),
        )

        t0 = time.monotonic()
        kill = scenario.kill_worker_holding_a_job(compose, compose.redis_url, run_id)
        scenario.wait_resent_once(compose, run, kill)
        after = run.step
        run.wait("training after the kill", lambda v: v["step"] >= after + 2)
        phase(
            "kill + recovery",
            time.monotonic() - t0,
            killed=kill.consumer,
            jobs=sorted(kill.jobs.values()),
        )
        run.client.stop(run_id)
        run.ended.wait(60)
        audit.settle()
        _check_run(run, kill, audit)
    finally:
        if audit is not None:
            audit.close()
        phase("down -v", compose.down())
    assert compose.leftovers() == []


def _check_run(run: scenario.Run, kill: scenario.Kill, audit: PathAudit) -> None:
    trained = [s for s in run.steps if "learner/loss" in s]
    assert len(trained) >= 5, f"{len(trained)} steps trained"
    duplicates = sum(s.get("learner/duplicate_groups", 0) for s in trained)
    assert duplicates == 0, f"{duplicates} groups delivered twice to the learner"
    for job, group in kill.groups.items():
        publishes = audit.of(job)  # the done set holds the job (wait_resent_once): one publish
        assert len(publishes) == 1, f"group {group} of job {job} published as {publishes}"
        [publish] = publishes
        assert publish.address not in kill.addresses, (
            f"the killed worker published {group} "
            f"({publish.ms - kill.checked_ms} ms after its held jobs were read)"
        )
    workers = set().union(*(scenario.workers_of(s) for s in trained))
    rewards = [s["reward/mean"] for s in trained if "reward/mean" in s]
    phase(
        "run",
        0.0,
        steps=trained[-1]["step"],
        reward_first=round(rewards[0], 3),
        reward_last=round(rewards[-1], 3),
        workers=sorted(workers),
        resent={j: g for j, g in kill.groups.items()},
        publishers=sorted({p.address for j in kill.groups for p in audit.of(j)}),
        publish_calls=audit.attempts,
    )


def test_k8s_cpu_overlay_containers_start_and_answer_their_probes(built, inputs, tmp_path):
    pods = k8s_pods.Pods(tmp_path / "k8s", inputs["model_dir"])
    t0 = time.monotonic()
    try:
        pods.start(k8s_pods.render("cpu"))
        ready = pods.check()
    finally:
        pods.stop()
    phase(
        "k8s cpu overlay",
        time.monotonic() - t0,
        ready={k.rsplit("-", 1)[-1]: f"{v:.0f}s" for k, v in ready.items()},
    )
    assert {name.split("-")[-1] for name in ready} == {"redis", "reward", "rollout", "learner"}
    assert pods.leftovers() == []


def test_gpu_profile_renders(engine, inputs):
    """The gpu profile's services as compose resolves them (no GPU here: nothing of it runs)."""
    compose = Compose(_project("gpu"), **inputs)
    argv = [a if a != "cpu" else "gpu" for a in compose.argv("config", "--services")]
    out = subprocess.run(argv, env=compose.env, capture_output=True, text=True, check=True).stdout
    assert set(out.split()) == {"redis", "reward", "rollout-gpu", "learner-gpu"}, out


def test_engine_stops_and_leaves_nothing(engine):
    if not engine.owned:
        pytest.skip("the engine was running before the test: left running")
    t0 = time.monotonic()
    engine.stop()
    phase("engine stop + cleanup", time.monotonic() - t0)
    assert engine.leftovers() == []
