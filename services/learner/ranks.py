"""Several learner ranks: rank 0 serves gRPC, reads the queue, acks and publishes; every rank
holds the policy in one DeepSpeed engine (data parallel, ZeRO 0-3) and runs its share of each
step's chunks (batch.rank_share), DeepSpeed reducing the gradients.

Rank 0 drives the others with commands broadcast over the process group — ``start`` (a run's
config), ``update`` (the step's groups as serialized PathGroups), ``weights`` (publication),
``export``,
``save_checkpoint`` / ``load_checkpoint`` (collective in DeepSpeed), ``set_hyperparameters`` (a
rollback), ``exit`` — one at
a time, each followed at once by rank 0's own part of it. While rank 0 waits for paths it sends
a ``noop`` every ``heartbeat_s`` so no rank sits in a broadcast until the collective timeout.

Ranks come from ``ranks: R`` in the learner config (rank 0 starts ranks 1..R-1 as child
processes of the same command and watches their pids) or from a launcher (``torchrun``), whose
RANK/WORLD_SIZE are used as they are. A rank that dies fails the run with a message naming it
(collectives time out after ``collective_timeout_s``; a dead child is seen by its pid first),
and the learner then refuses new runs until it is restarted.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from brorl.config.run import parse_run_config
from brorl.v1 import common_pb2
from services.learner.model import deepspeed_engine

log = logging.getLogger(__name__)


class RankFailure(RuntimeError):
    """A learner rank died or a collective failed: the run cannot go on."""


def pack_groups(groups: list[common_pb2.PathGroup]) -> bytes:
    """Length-prefixed serialized PathGroups (protobuf, never pickle)."""
    out = bytearray()
    for g in groups:
        data = g.SerializeToString()
        out += struct.pack("<Q", len(data)) + data
    return bytes(out)


def unpack_groups(data: bytes) -> list[common_pb2.PathGroup]:
    groups, at = [], 0
    while at < len(data):
        (n,) = struct.unpack_from("<Q", data, at)
        groups.append(common_pb2.PathGroup.FromString(data[at + 8 : at + 8 + n]))
        at += 8 + n
    return groups


def _broadcast(header: dict | None = None, payload: bytes = b"") -> tuple[dict, bytes]:
    """One command from rank 0 to all: sizes, then header JSON + payload bytes."""
    import torch.distributed as dist

    head = json.dumps(header).encode() if header is not None else b""
    sizes = torch.tensor([len(head), len(payload)], dtype=torch.int64)
    dist.broadcast(sizes, src=0)
    n_head, n_payload = (int(x) for x in sizes)
    buf = torch.empty(n_head + n_payload, dtype=torch.uint8)
    if header is not None:
        buf.copy_(torch.frombuffer(bytearray(head + payload), dtype=torch.uint8))
    dist.broadcast(buf, src=0)
    raw = buf.numpy().tobytes()
    return json.loads(raw[:n_head]), raw[n_head:]


class RankGroup:
    """Rank 0's side: the children it started, the command channel, the heartbeat."""

    def __init__(self, world: int, children: list[subprocess.Popen], heartbeat_s: float):
        self.world, self.children, self.heartbeat_s = world, children, heartbeat_s
        self.lock = threading.Lock()  # one command (and rank 0's part of it) at a time
        self.failure = ""
        self._last = time.monotonic()
        self._closed = threading.Event()
        threading.Thread(target=self._heartbeat, name="rank-heartbeat", daemon=True).start()

    def _dead_child(self) -> str:
        for rank, child in enumerate(self.children, 1):
            if child.poll() is not None:
                return f"learner rank {rank} (pid {child.pid}) exited with code {child.returncode}"
        return ""

    def run(self, op: str, fn=None, header: dict | None = None, payload: bytes = b""):
        """Send ``op`` to every rank, then do rank 0's part (``fn()``); a failure on the way is
        a RankFailure naming the rank when one died."""
        with self.lock:
            self.failure = self.failure or self._dead_child()
            if self.failure:
                raise RankFailure(f"{self.failure}; restart the learner (resume=true continues)")
            try:
                _broadcast({"op": op, **(header or {})}, payload)
                out = fn() if fn else None
            except RuntimeError as exc:  # gloo: peer closed, timed out
                time.sleep(0.5)  # let a dying child's exit status land
                self.failure = self._dead_child() or f"a collective failed: {exc}"
                raise RankFailure(
                    f"{self.failure}; restart the learner (resume=true continues)"
                ) from None
            self._last = time.monotonic()
            return out

    def _heartbeat(self) -> None:
        while not self._closed.wait(self.heartbeat_s / 4):
            if self.failure or time.monotonic() - self._last < self.heartbeat_s:
                continue
            if self.lock.locked():  # a command is under way: the ranks are not idle
                continue
            try:
                self.run("noop")
            except RankFailure as exc:
                log.error("%s", exc)

    def close(self) -> None:
        self._closed.set()
        if not self.failure:
            try:
                self.run("exit")
            except RankFailure:
                pass
        for child in self.children:
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()


class DistributedPolicy:
    """Rank 0's policy: each call is sent to every rank before rank 0 does its own part."""

    def __init__(self, ranks: RankGroup, cfg, make_policy):
        self.ranks = ranks
        self.local = ranks.run("start", lambda: make_policy(cfg), {"config": _dump_cfg(cfg)})

    def update(self, groups) -> dict[str, float]:
        fn = lambda: self.local.update(groups)  # noqa: E731
        return self.ranks.run("update", fn, None, pack_groups(groups))

    @property
    def model(self):
        """Rank 0's model, for what only rank 0 reads (the probe set's log-probs)."""
        return self.local.model

    @property
    def pad_id(self) -> int:
        return self.local.pad_id

    def weights(self) -> dict:
        return self.ranks.run("weights", lambda: self.local.weights())

    def export(self, out: Path) -> Path:
        return self.ranks.run("export", lambda: self.local.export(out))

    def save_checkpoint(self, directory: str, tag: str, client_state: dict) -> None:
        fn = lambda: self.local.save_checkpoint(directory, tag, client_state)  # noqa: E731
        self.ranks.run("save_checkpoint", fn, {"directory": directory, "tag": tag})

    def load_checkpoint(self, directory: str, tag: str | None = None) -> dict:
        fn = lambda: self.local.load_checkpoint(directory, tag)  # noqa: E731
        return self.ranks.run("load_checkpoint", fn, {"directory": directory, "tag": tag})

    def set_hyperparameters(self, lr: float, kl_coef: float) -> None:
        fn = lambda: self.local.set_hyperparameters(lr, kl_coef)  # noqa: E731
        self.ranks.run("set_hyperparameters", fn, {"lr": lr, "kl_coef": kl_coef})

    def warm_forward(self, paths: int, length: int) -> float:
        """Nothing: the ranks run a forward together, in an update (Policy.warm_forward)."""
        return 0.0


def _dump_cfg(cfg) -> str:
    return cfg.model_dump_json(by_alias=True)


def follow(make_policy) -> None:
    """A rank above 0: do what rank 0 says until it says ``exit``."""
    policy = None
    while True:
        header, payload = _broadcast()
        op = header["op"]
        if op == "start":
            policy = make_policy(parse_run_config(header["config"]))
        elif op == "update":
            policy.update(unpack_groups(payload))
        elif op in ("weights", "export"):
            policy.weights(gather_only=True)  # the collective part (ZeRO-3 gathers)
        elif op == "save_checkpoint":
            policy.save_checkpoint(header["directory"], header["tag"], {})
        elif op == "load_checkpoint":
            policy.load_checkpoint(header["directory"], header.get("tag"))
        elif op == "set_hyperparameters":  # a rollback's lower lr / higher KL coefficient
            policy.set_hyperparameters(header["lr"], header["kl_coef"])
        elif op == "exit":
            return


def start_ranks(world: int, timeout_s: float) -> list[subprocess.Popen]:
    """Make this process rank 0 of ``world``: start ranks 1..world-1 as children running this
    same command (a launcher's RANK/WORLD_SIZE, if set, win: no children), then join the
    process group. Returns the children."""
    children = []
    if deepspeed_engine.launcher_world() is None and world > 1:
        os.environ.pop(deepspeed_engine.OWN_RANK_ENV, None)  # this process is their launcher
        env = dict(
            os.environ,
            WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(deepspeed_engine.free_port()),
            LOCAL_RANK="0",
        )
        for rank in range(1, world):
            child_env = dict(env, RANK=str(rank), LOCAL_RANK=str(rank))
            children.append(subprocess.Popen([sys.executable, *_argv()], env=child_env))
        os.environ.update({k: env[k] for k in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")})
        os.environ.update(RANK="0", LOCAL_RANK="0")
    deepspeed_engine.init_distributed(timeout_s)
    return children


def _argv() -> list[str]:
    """This process's command line (``python -m services.learner ...`` keeps its ``-m``)."""
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return ["-m", spec.name.removesuffix(".__main__"), *sys.argv[1:]]
    return sys.argv
