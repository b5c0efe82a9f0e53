"""The checks every ``brorl`` subcommand makes of its inputs before it starts anything.

A bad input found after a cluster has started (or a warm-start has trained for minutes) costs
the user a long wait and a traceback from some child process; found here it costs one line. So
the rules live in one place: what a model directory is (a directory with ``config.json``), a
usable input file, config file, output directory, free port, Redis, reachable service and
token/TLS settings — and how a failure is answered: ``BadInput``, which the CLI prints as ONE
line on stderr naming the input and what to do, with exit code ``EXIT_BAD_INPUT`` (2).

``PREFLIGHT`` maps every subcommand to its checks (test_cli_bad_input.py checks each has one).
"""

from __future__ import annotations

import argparse
import re
import shutil
import socket
from pathlib import Path

import grpc
import redis
import yaml

from brorl import cluster
from brorl.apps import compare_cmd, demo_cmd, recipe, sweep_cmd, tasks
from brorl.apps.cluster.launcher import REPO_ROOT
from brorl.config.base import load_config, parse_text
from brorl.contract import KeyName
from brorl.errors import BrorlError
from brorl.security import SecurityConfig

EXIT_FAILED = 1  # something started and then failed: a service died, a run failed
EXIT_BAD_INPUT = 2  # an input is wrong or a service does not answer; nothing was started
EXIT_INTERRUPTED = 130  # Ctrl-C / SIGTERM
HOST = "127.0.0.1"  # where the launcher binds every service (ClusterSpec.host)
MODEL_FIX = "pass a Hugging Face model directory (the one holding config.json and the weights)"


class BadInput(BrorlError):
    """An input the command cannot use; the message names it, says why, and says what to do."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, what: str, problem: str, fix: str):
        super().__init__(f"{what}: {problem}; {fix}")


def one_line(text: str) -> str:
    """``text`` on one line: YAML and gRPC messages span several, and the answer must not."""
    return " ".join(str(text).split())


class Parser(argparse.ArgumentParser):
    """argparse that answers a usage error in one line (argparse's own prints the usage first)."""

    def error(self, message: str):
        self.exit(
            EXIT_BAD_INPUT, f"{self.prog}: error: {one_line(message)}; see `{self.prog} --help`\n"
        )


# ---- the rules -------------------------------------------------------------------------------


def model_dir(flag: str, path: str) -> Path:
    """A model directory is a directory with ``config.json`` (what vLLM / transformers load)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise BadInput(f"{flag} {path}", "no such directory", MODEL_FIX)
    if not p.is_dir():
        raise BadInput(f"{flag} {path}", "is a file, not a directory", MODEL_FIX)
    if not (p / "config.json").is_file():
        raise BadInput(f"{flag} {path}", "has no config.json, so it holds no model", MODEL_FIX)
    return p


def input_file(flag: str, path: str, fix: str) -> Path:
    """A file the command reads: checked here, the reading child process cannot fail on it."""
    p = Path(path).expanduser()
    if not p.is_file():
        problem = "is a directory, not a file" if p.is_dir() else "no such file"
        raise BadInput(f"{flag} {path}", problem, fix)
    return p


def config_file(flag: str, path: str) -> dict:
    """An existing file that parses as a YAML mapping; returns the mapping."""
    p = input_file(flag, path, "pass the path of an existing YAML config file")
    try:
        text = p.read_text()
        yaml.safe_load(text)
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{flag} {path}", f"cannot be read ({exc})", "fix the file") from None
    except yaml.MarkedYAMLError as exc:  # said briefly: parse_text quotes the text over lines
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise BadInput(f"{flag} {path}", f"not valid YAML{where} ({exc.problem})", "fix the file")
    except yaml.YAMLError as exc:
        raise BadInput(f"{flag} {path}", f"not valid YAML ({one_line(exc)})", "fix the file")
    try:
        return parse_text(text, source=str(path))  # the rule for what a config holds
    except BrorlError as exc:
        problem = str(exc).removeprefix(f"{path}: ")
        raise BadInput(f"{flag} {path}", problem, "fix the file") from None


def run_dir(flag: str, path: str) -> Path:
    """A run directory is one a learner wrote: a directory holding ``metrics.jsonl``."""
    p = Path(path).expanduser()
    fix = "pass a run directory (<runs_dir>/<run_id>, the one holding metrics.jsonl)"
    if not p.is_dir():
        problem = "is a file, not a directory" if p.exists() else "no such directory"
        raise BadInput(f"{flag} {path}", problem, fix)
    if not (p / "metrics.jsonl").is_file():
        raise BadInput(f"{flag} {path}", "has no metrics.jsonl, so it holds no run", fix)
    return p


def output_dir(flag: str, path: str, model: bool = False) -> Path:
    """A directory the command may create or write into; with ``model``, an existing non-empty
    one must already be a model directory (writing a model into other files mixes the two)."""
    p = Path(path).expanduser()
    if p.exists():
        if not p.is_dir():
            raise BadInput(f"{flag} {path}", "is a file, not a directory", f"choose another {flag}")
        if model and any(p.iterdir()) and not (p / "config.json").is_file():
            raise BadInput(
                f"{flag} {path}",
                "holds files but no model (no config.json)",
                f"choose a new or empty directory, or one holding a model, as {flag}",
            )
        return p
    parent = next(a for a in p.absolute().parents if a.exists())
    if not parent.is_dir():
        raise BadInput(
            f"{flag} {path}", f"cannot be created: {parent} is a file", f"choose another {flag}"
        )
    return p


def output_file(flag: str, path: str) -> Path:
    """A file the command writes: not a directory, in a directory that exists or can be made."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise BadInput(f"{flag} {path}", "is a directory, not a file", f"choose another {flag}")
    output_dir(flag, str(p.parent))
    return p


def free_ports(ports: list[tuple[str, int, str]]) -> None:
    """Every ``(flag, port, what)`` distinct, in range and free on ``HOST`` (``flag`` set the
    port; ``what`` says which service's it is where the flag sets several)."""
    seen: dict[int, str] = {}
    for flag, port, what in ports:
        name = f"{flag} {port}" + (f" ({what})" if what else "")
        if not 0 < port < 65536:
            raise BadInput(name, "not a port (1-65535)", f"choose another {flag}")
        if port in seen:
            raise BadInput(name, f"also the port of {seen[port]}", "give each service its own")
        seen[port] = name
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no obstacle
            try:
                s.bind((HOST, port))
            except OSError as exc:
                raise BadInput(
                    name,
                    f"cannot be bound on {HOST} ({exc.strerror or exc})",
                    f"stop what holds it or choose another {flag}",
                ) from None


def cluster_ports(
    workers: int, reward: tuple[str, int], learner: tuple[str, int], rollout: tuple[str, int]
) -> list[tuple[str, int, str]]:
    """The ports a local cluster binds, each with the flag that sets it (``(flag, port)`` of
    reward, learner and the first rollout worker; worker i listens on that port + i)."""
    flag, base = rollout
    shared = reward[0] == learner[0]  # the sweep's --base-port sets all of them
    return [
        (*reward, "reward" if shared else ""),
        (*learner, "learner" if shared else ""),
        *[(flag, base + i, f"rollout worker {i}") for i in range(workers)],
    ]


def redis_ready(flag: str, url: str) -> None:
    """A Redis answers at ``url``, or the launcher can start one (a redis-server binary)."""
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    except ValueError as exc:
        raise BadInput(f"{flag} {url}", one_line(str(exc)), f"pass e.g. {cluster.REDIS_URL}")
    try:
        client.ping()
        return
    except redis.RedisError:
        pass
    if not shutil.which("redis-server"):
        raise BadInput(
            f"{flag} {url}",
            "no Redis answers and there is no redis-server to start one",
            "start Redis (scripts/ensure_redis.sh) or install redis-server",
        )


_ADDRESS = re.compile(r"^(?:dns:(?://[^/]*/)?|ipv4:)?(\[[^\]]+\]|[^:/\[\]]+):(\d+)$")


def reachable(flag: str, address: str, service: str) -> None:
    """Something listens at ``address`` (a TCP connect; gRPC itself answers the rest)."""
    match = _ADDRESS.match(address)
    if not match:
        if ":" not in address:
            raise BadInput(f"{flag} {address}", "has no port", f"pass {flag} HOST:PORT")
        return  # another gRPC target form (unix:, ipv6: lists): gRPC answers for it
    host, port = match.group(1).strip("[]"), int(match.group(2))
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as exc:
        raise BadInput(
            f"{flag} {address}",
            f"no {service} answers there ({exc.strerror or exc})",
            f"start one with `brorl cluster --model DIR` (all services) or "
            f"`python -m services.{service} bind={address}`, or pass {flag} HOST:PORT",
        ) from None


SECURITY_FLAGS = ("token_env", "token_file", "tls_cert", "tls_key", "tls_ca")  # tls_x: tls.x


def security(args) -> SecurityConfig:
    """The command's token and TLS settings: its --token-*/--tls-* flags over the BRORL_SECURITY__*
    variables the services read too (docs/security.md)."""
    overrides = []
    for dest in (d for d in SECURITY_FLAGS if getattr(args, d, "")):
        value = getattr(args, dest)
        # the services a command starts run elsewhere (the repository): paths go absolute
        value = value if dest == "token_env" else str(Path(value).expanduser().absolute())
        overrides.append(f"{dest.replace('tls_', 'tls.')}={value}")
    try:
        return load_config(SecurityConfig, None, overrides, env_prefix="BRORL_SECURITY__")
    except BrorlError as exc:
        problem = one_line(str(exc)).removeprefix("config: ").removeprefix("Value error, ")
        what = "token/TLS settings (--token-*, --tls-* or BRORL_SECURITY__*)"
        raise BadInput(what, problem, "fix them (docs/security.md)") from None


# ---- what each subcommand checks -------------------------------------------------------------


def _flags(command: str, rest: list[str], *names: str) -> argparse.Namespace:
    """The flags of a pass-through command that name paths (its module parses the rest)."""
    p = Parser(prog=f"brorl {command}", add_help=False)
    for name in names:
        p.add_argument(name)
    return p.parse_known_args(rest)[0]


def _required(flag: str, value, fix: str):
    if not value:
        raise BadInput(flag, "missing", fix)
    return value


def _recipe(cls, args, command: str):
    config_file("--config", args.config)
    try:
        return recipe.load_recipe(cls, args.config, args.overrides)
    except BrorlError as exc:  # a base file or an override is wrong: the message names which
        raise BadInput(
            f"brorl {command} settings", one_line(str(exc)), "fix it in --config or the overrides"
        ) from None


def check_cluster(args, rest) -> None:
    model_dir("--model", args.model)
    ranges = [("workers", args.workers, 0, 4096), ("learner-ranks", args.learner_ranks, 1, 64)]
    ranges.append(("threads-per-process", args.threads_per_process or 0, 0, 1024))  # None: unset
    for flag, value, low, high in ranges:
        if not low <= value <= high:
            raise BadInput(f"--{flag} {value}", f"must be {low} to {high}", f"pass --{flag} N")
    if not KeyName.fits(args.namespace):
        raise BadInput(f"--namespace {args.namespace!r}", KeyName.RULE, "pass --namespace NAME")
    security(args)
    _local_cluster(args, args.workers)


def check_demo(args, rest) -> None:
    cfg = _recipe(demo_cmd.DemoConfig, args, "demo")
    _local_cluster(args, cfg.workers)
    if tasks.environment(cfg):  # the task's environment service binds a port of its own
        free_ports([("--env-port", args.env_port, "environment")])


def _local_cluster(args, workers: int) -> None:
    """What a command that starts a local cluster on fixed ports needs (cluster, demo)."""
    output_dir("--workdir", args.workdir)
    flags = ("--reward-port", "--learner-port", "--rollout-base-port")
    ports = (args.reward_port, args.learner_port, args.rollout_base_port)
    free_ports(cluster_ports(workers, *zip(flags, ports)))
    redis_ready("--redis-url", args.redis_url)


def _recipe_on_base_port(cls, command: str):
    """The check of a recipe command on a cluster at ``--base-port`` (sweep, study, compare;
    ``cls`` None: the subcommand's ``study_config``)."""

    def check(args, rest) -> None:
        cfg = _recipe(cls or args.study_config, args, command)
        output_dir("--workdir", args.workdir)
        output_dir("out", str(REPO_ROOT / cfg.out))
        ports = recipe.base_port_layout(args.base_port)
        names = ("reward_port", "learner_port", "rollout_base_port")
        free_ports(cluster_ports(cfg.workers, *[("--base-port", ports[n]) for n in names]))
        redis_ready("--redis-url", args.redis_url)

    return check


def check_run(args, rest) -> None:
    if args.action == "start":
        config_file("run config", args.target)
    security(args)
    reachable("--learner", args.learner, "learner")


def check_generate(args, rest) -> None:
    security(args)
    reachable("--rollout", args.rollout, "rollout")


def check_score(args, rest) -> None:
    security(args)
    reachable("--reward", args.reward, "reward")


def _wants_help(rest: list[str]) -> bool:
    return "-h" in rest or "--help" in rest


def check_eval(args, rest) -> None:
    if _wants_help(rest):
        return
    model = _flags("eval", rest, "--model").model
    model_dir(
        "--model", _required("--model", model, MODEL_FIX + ", e.g. --model .cache/demo/warmstart")
    )


def check_warmstart(args, rest) -> None:
    if _wants_help(rest):
        return
    out = _flags("warmstart", rest, "--out").out
    output_dir(
        "--out", _required("--out", out, "pass the model directory to write or reuse"), model=True
    )


def check_rm(args, rest) -> None:
    if _wants_help(rest):
        return
    f = _flags("rm train", rest, "--data", "--out", "--generate", "--backbone")
    data = _required("--data", f.data, "pass the preference JSONL (--generate N writes one)")
    out = _required("--out", f.out, "pass the directory to save the reward model in")
    try:
        generate = int(f.generate or 0)
    except ValueError:
        raise BadInput(f"--generate {f.generate}", "not a number", "pass --generate N") from None
    if generate > 0:
        output_file("--data", data)
    else:
        fix = "pass an existing preference JSONL (prompt, chosen, rejected), or add --generate N"
        input_file("--data", data, fix + " to write one there")
    output_dir("--out", out)
    if f.backbone:
        model_dir("--backbone", f.backbone)


def check_report(args, rest) -> None:
    run_dir("RUN_DIR", args.run_dir)
    if args.out:
        output_file("--out", args.out)


PREFLIGHT = {
    "demo": check_demo,
    "sweep": _recipe_on_base_port(sweep_cmd.SweepConfig, "sweep"),
    "study": _recipe_on_base_port(None, "study"),
    "compare": _recipe_on_base_port(compare_cmd.CompareConfig, "compare"),
    "cluster": check_cluster,
    "run": check_run,
    "generate": check_generate,
    "score": check_score,
    "warmstart": check_warmstart,
    "eval": check_eval,
    "rm": check_rm,
    "report": check_report,
}
