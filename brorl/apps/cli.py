"""The ``brorl`` command line: the CPU demo, a local cluster, and clients of the services.

brorl demo                       warm-start (cached) + local cluster + RL run + evaluation
brorl sweep                      the BroRL table: N in {16,64,256,512}, equal samples / steps
brorl study broaden              saturate with N=16, then broaden to N=512 (docs/broadening.md)
brorl study countdown            the same claim on Countdown, per difficulty (docs/countdown.md)
brorl compare --config FILE      learner options side by side (configs/algorithms.yaml, ...)
brorl cluster --model DIR        reward + K rollout workers + learner as local processes
brorl run start CONFIG           start a run on a learner (watch with --watch)
brorl run status|watch|stop|checkpoint RUN_ID
brorl generate PROMPT --n 8      sample paths from a rollout service
brorl score --fn NAME ...        score one completion
brorl warmstart / brorl eval     the demo model's supervised warm-start and its evaluation
brorl rm train ...               train a pairwise reward model
brorl report RUN_DIR             a run's self-contained HTML page: plots, config, sample paths

Every subcommand checks its inputs before it starts anything (brorl/apps/checks.py); a bad one
is answered with one line on stderr and exit code 2. Exit codes: docs/cluster.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc

from brorl.apps import checks, compare_cmd, countdown_study, demo_cmd, report, study_cmd, sweep_cmd
from brorl.apps.cluster.launcher import REPO_ROOT, Cluster, ClusterSpec
from brorl.apps.cluster.scrape_targets import FILE_SD
from brorl.apps.progress import watch_run
from brorl.client import LearnerClient, RewardClient, RolloutClient
from brorl.config.base import parse_overrides
from brorl.errors import BrorlError
from brorl import cluster

log = logging.getLogger("brorl")


def _passthrough(module: str, args: list[str]) -> int:
    """Run ``python -m module args`` (modules that need torch live outside this package)."""
    return subprocess.call([sys.executable, "-m", module, *args], cwd=REPO_ROOT)


def cmd_cluster(args) -> int:
    spec = ClusterSpec(
        model=args.model,
        workdir=Path(args.workdir),
        rollout_workers=args.workers,
        redis_url=args.redis_url,
        namespace=args.namespace,
        reward_port=args.reward_port,
        learner_port=args.learner_port,
        rollout_base_port=args.rollout_base_port,
        security=checks.security(args),
        read_roots=args.read_root,
        learner_overrides={"ranks": args.learner_ranks},
        threads_per_process=args.threads_per_process,
        rollout_overrides=parse_overrides(args.rollout_set),
    )
    try:
        with Cluster(spec) as cluster:
            # from here on an interrupt is the orderly stop (exit 0), even one that arrives while
            # the ready lines are printed: a script may signal as soon as it has read them
            try:
                pids = ", ".join(f"{p.name} {p.popen.pid}" for p in cluster.procs)
                rollouts = ", ".join(cluster.rollout_address(i) for i in range(args.workers))
                print(
                    f"cluster ready: learner {cluster.learner_address}, "
                    f"reward {cluster.reward_address}, rollout {rollouts or '-'}; "
                    f"pids: {pids}; logs in {cluster.logs}",
                    flush=True,
                )
                metrics = ", ".join(f"{n} {u}" for n, u in cluster.metrics_urls().items())
                targets = f"Prometheus targets: {spec.workdir}/{FILE_SD}"
                print(f"metrics: {metrics} ({targets})", flush=True)
                print("Ctrl-C stops every process.", flush=True)
                while True:
                    cluster.check_alive()
                    time.sleep(1.0)
            except KeyboardInterrupt:
                print("\nstopping", flush=True)
    except (RuntimeError, TimeoutError) as exc:  # a service died or never became ready: all stopped
        print(f"error: {exc}\nstopped every process of the cluster", file=sys.stderr)
        return checks.EXIT_FAILED
    return 0


def cmd_run(args) -> int:
    client = LearnerClient(args.learner, security=checks.security(args))
    if args.action == "start":
        info = client.start_file(args.target, run_id=args.run_id, resume=args.resume)
        print(f"started {info.run_id} ({info.total_steps} steps) in {info.run_dir}")
        if args.watch:
            print(json.dumps(watch_run(client, info.run_id, info.total_steps)))
    elif args.action == "status":
        info = client.get(args.target)
        print(
            json.dumps(
                {
                    "run_id": info.run_id,
                    "state": info.state,
                    "step": info.step,
                    "total_steps": info.total_steps,
                    "weight_version": info.weight_version,
                    "message": info.message,
                    "metrics": dict(info.last_metrics),
                },
                indent=1,
            )
        )
    elif args.action == "watch":
        for m in client.watch(args.target):
            print(
                json.dumps(
                    {"step": m.step, "event": m.event, "message": m.message, **dict(m.values)}
                )
            )
    elif args.action == "stop":
        print(client.stop(args.target).state)
    elif args.action == "checkpoint":
        ck = client.checkpoint(args.target)
        print(f"checkpoint at step {ck.step}: {ck.path}")
    return 0


def cmd_generate(args) -> int:
    resp = RolloutClient(args.rollout, security=checks.security(args)).generate(
        args.prompt,
        n=args.n,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        top_k=args.top_k,
        top_p=args.top_p,
    )
    for p in resp.paths:
        print(
            json.dumps(
                {
                    "path_id": p.path_id,
                    "text": p.text,
                    "finish_reason": p.finish_reason,
                    "weight_version": p.weight_version,
                    "logprob": sum(p.logprobs),
                }
            )
        )
    return 0


def cmd_score(args) -> int:
    resp = RewardClient(args.reward, security=checks.security(args)).score_batch(
        args.fn,
        [{"prompt": args.prompt, "completion": args.completion, "reference": args.reference}],
    )
    r = resp.results[0]
    print(
        json.dumps(
            {
                "reward": r.reward,
                "status": r.status,
                "detail": r.detail,
                "components": dict(r.components),
            }
        )
    )
    return 0


def _security_arguments(p, server: bool = False) -> None:
    """Token and TLS flags (docs/security.md); unset ones fall back to BRORL_SECURITY__*."""
    p.add_argument("--token-env", default="", metavar="VAR", help="variable holding the token")
    p.add_argument("--token-file", default="", metavar="FILE", help="file holding the token")
    if server:
        p.add_argument("--tls-cert", default="", metavar="FILE", help="every server's certificate")
        p.add_argument("--tls-key", default="", metavar="FILE", help="its private key")
    p.add_argument(
        "--tls-ca", default="", metavar="FILE", help="CA of the servers' certificates (TLS on)"
    )


def build_parser() -> argparse.ArgumentParser:
    p = checks.Parser(
        prog="brorl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--log-level", default="WARNING")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="the CPU demo: warm-start, cluster, RL with N=512, evaluation")
    demo_cmd.add_arguments(d)
    d.set_defaults(handler=demo_cmd.run_demo)

    sw = sub.add_parser(
        "sweep", help="N in {16,64,256,512} at equal samples and equal steps (writes docs/sweep)"
    )
    sweep_cmd.add_arguments(sw)
    sw.set_defaults(handler=sweep_cmd.run_sweep)

    cp = sub.add_parser(
        "compare", help="learner options side by side, several seeds (docs/algorithms.md)"
    )
    compare_cmd.add_arguments(cp)
    cp.set_defaults(handler=compare_cmd.run_compare)

    st = sub.add_parser("study", help="studies of BroRL's claims (docs/broadening.md)")
    studies = st.add_subparsers(dest="study", required=True)
    broaden = studies.add_parser(
        "broaden", help="N=16 to a plateau, then N=16 vs N=512 (writes docs/broadening)"
    )
    study_cmd.add_arguments(broaden)
    broaden.set_defaults(handler=study_cmd.run_study, study_config=study_cmd.BroadenConfig)
    cd = studies.add_parser(
        "countdown", help="Countdown: N=16 saturated vs N=512 forked, N from the warm-start, "
        "the adaptive budget (writes docs/countdown)",
    )  # fmt: skip
    countdown_study.add_arguments(cd)
    cd.set_defaults(
        handler=countdown_study.run_study, study_config=countdown_study.CountdownStudyConfig
    )

    c = sub.add_parser("cluster", help="start reward, K rollout workers and the learner locally")
    c.add_argument("--model", required=True, help="HF model directory the rollout workers load")
    c.add_argument("--workers", type=int, default=2)
    c.add_argument(
        "--learner-ranks", type=int, default=1, help="learner processes (data parallel, DeepSpeed)"
    )
    c.add_argument(
        "--threads-per-process",
        type=int,
        default=None,
        metavar="N",
        help="OpenMP threads of each service (default: the cores split evenly between the "
        "workers and the learner's ranks, at least one; 0: torch's default of one per core)",
    )
    c.add_argument("--workdir", default=".cache/cluster")
    c.add_argument("--redis-url", default=cluster.REDIS_URL)
    c.add_argument("--namespace", default="default", help="keeps clusters that share a Redis apart")
    c.add_argument("--reward-port", type=int, default=cluster.DEFAULT.reward_port)
    c.add_argument("--learner-port", type=int, default=cluster.DEFAULT.learner_port)
    c.add_argument(
        "--rollout-base-port",
        type=int,
        default=cluster.DEFAULT.rollout_base_port,
        help="worker i listens on this port + i",
    )
    c.add_argument(
        "--read-root",
        action="append",
        default=[],
        metavar="DIR",
        help="a directory run configs may read besides the repository, workdir and model",
    )
    c.add_argument(
        "--rollout-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a rollout service setting for every worker, e.g. engine.in_process=false",
    )
    _security_arguments(c, server=True)
    c.set_defaults(handler=cmd_cluster)

    r = sub.add_parser("run", help="control runs on a learner")
    r.add_argument("action", choices=["start", "status", "watch", "stop", "checkpoint"])
    r.add_argument("target", help="config file (start) or run id")
    r.add_argument("--learner", default=cluster.address(cluster.DEFAULT.learner_port))
    r.add_argument("--run-id", default="")
    r.add_argument("--resume", action="store_true")
    r.add_argument("--watch", action="store_true")
    _security_arguments(r)
    r.set_defaults(handler=cmd_run)

    g = sub.add_parser("generate", help="sample paths from a rollout service")
    g.add_argument("prompt")
    g.add_argument("--rollout", default=cluster.address(cluster.DEFAULT.rollout_base_port))
    g.add_argument("--n", type=int, default=4)
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=-1)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--max-tokens", type=int, default=16)
    _security_arguments(g)
    g.set_defaults(handler=cmd_generate)

    s = sub.add_parser("score", help="score one completion with a reward function")
    s.add_argument("--reward", default=cluster.address(cluster.DEFAULT.reward_port))
    s.add_argument("--fn", default="math_answer")
    s.add_argument("--prompt", default="")
    s.add_argument("--completion", required=True)
    s.add_argument("--reference", default="")
    _security_arguments(s)
    s.set_defaults(handler=cmd_score)

    rp = sub.add_parser("report", help="write a run's HTML report (plots, config, sample paths)")
    report.add_arguments(rp)
    rp.set_defaults(handler=report.cmd_report)

    for name, module, text in [
        ("warmstart", "demo", "supervised warm-start of the demo model (cached)"),
        ("eval", "demo", "greedy held-out accuracy of a demo model"),
    ]:
        sp = sub.add_parser(name, help=text, add_help=False)
        sp.set_defaults(passthrough=(module, [name]))
    rm = sub.add_parser("rm", help="reward models: brorl rm train ...", add_help=False)
    rm.set_defaults(passthrough=("services.reward.training.rm_train", []))
    return p


def _interrupt(*_):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    passthrough = getattr(args, "passthrough", None)
    if passthrough and args.command == "rm" and rest[:1] == ["train"]:
        rest = rest[1:]
    if rest and not passthrough:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        # Inputs first: nothing is started (no process, no warm-start) before they pass.
        checks.PREFLIGHT[args.command](args, rest)
        if passthrough:
            module, prefix = passthrough
            return _passthrough(module, prefix + rest)
        # SIGTERM stops like Ctrl-C, so a launched cluster is torn down by its context manager.
        # SIGINT too, even when started in the background by a shell without job control, which
        # starts it with SIGINT ignored (and then Python installs no KeyboardInterrupt handler).
        signal.signal(signal.SIGTERM, _interrupt)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        return args.handler(args)
    except BrorlError as exc:
        print(f"error: {checks.one_line(exc)}", file=sys.stderr)
        return checks.EXIT_BAD_INPUT
    except grpc.RpcError as exc:
        print(f"error: {exc.code().name}: {checks.one_line(exc.details())}", file=sys.stderr)
        return checks.EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return checks.EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
