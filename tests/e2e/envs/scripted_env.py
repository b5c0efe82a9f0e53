"""An environment for the e2e tests, served in the test's process: every episode lasts three
policy turns whatever the policy writes (each turn answered "1|"; reward 1 at the end when the
last turn's text is non-empty), and chosen episodes fail on purpose: their Step hangs past any
deadline, or answers token ids outside every vocabulary."""

from __future__ import annotations

import threading
import time

from brorl import rpc
from brorl.v1 import environment_pb2, environment_pb2_grpc
from envs.base import Turn
from envs.episodes import EpisodeTable
from envs.server import EnvironmentServicer, SERVICE_NAME


class ThreeTurns:
    name, version, max_turns, description = "three-turns", "1", 3, "three turns, always"

    def reset(self, prompt, reference, extra, seed):
        return {}, ""

    def step(self, state, turn, action, policy_done):
        if turn >= 3:
            return Turn(reward=float(bool(action.strip())), done=True)
        return Turn(observation="1|", reward=0.0)


class FaultyServicer(EnvironmentServicer):
    """Episodes whose index (the episode id's last part) is in ``hang`` never answer their
    second Step in time; those in ``garbage`` answer it with impossible token ids."""

    def __init__(self, table, hang=(), garbage=(), hang_s=30.0):
        super().__init__(table)
        self.hang, self.garbage, self.hang_s = set(hang), set(garbage), hang_s
        self.stopped = threading.Event()

    def Step(self, request, context):
        index = int(request.episode_id.rsplit("/", 1)[1]) % 8
        if request.turn == 2 and index in self.hang:
            self.stopped.wait(self.hang_s)
        answer = super().Step(request, context)
        if request.turn == 2 and index in self.garbage:
            answer.observation.token_ids.extend([10**6, -3])
        return answer


def start(hang=(), garbage=()):
    """(server, address, servicer) of a ThreeTurns environment on a free loopback port."""
    server = rpc.Server("127.0.0.1:0", [SERVICE_NAME], max_workers=64, max_concurrent_rpcs=4096)
    servicer = FaultyServicer(EpisodeTable(ThreeTurns()), hang, garbage)
    environment_pb2_grpc.add_EnvironmentServiceServicer_to_server(servicer, server.grpc)
    server.start().set_serving(True)
    return server, f"127.0.0.1:{server.port}", servicer


def stop(server, servicer) -> None:
    servicer.stopped.set()
    time.sleep(0.05)
    server.stop(0)


__all__ = ["start", "stop", "environment_pb2"]
