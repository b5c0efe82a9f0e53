"""EnvironmentService servicer: protobuf → the episode table (envs/episodes.py) → protobuf; one
environment per process, chosen by the config."""

from __future__ import annotations

import logging

from brorl import rpc
from brorl.errors import InvalidArgument
from brorl.metrics import Metrics
from brorl.v1 import environment_pb2, environment_pb2_grpc
from envs.config import EnvServiceConfig
from envs.episodes import EpisodeTable

log = logging.getLogger(__name__)
SERVICE_NAME = environment_pb2.DESCRIPTOR.services_by_name["EnvironmentService"].full_name
MAX_ID = 512  # characters of an episode id


def build_env(config: EnvServiceConfig):
    if config.env == "calculator":
        from envs.calculator import Calculator

        return Calculator(config.calculator)
    from envs.dialogue import Dialogue

    return Dialogue(config.dialogue)


class EnvironmentServicer(environment_pb2_grpc.EnvironmentServiceServicer):
    def __init__(self, table: EpisodeTable):
        self.table = table
        self.env = table.env

    @rpc.translate_errors
    def Reset(self, request, context):
        _check_id(request.episode_id)
        observation = self.table.reset(
            request.episode_id, request.prompt, request.reference, dict(request.extra), request.seed
        )
        return environment_pb2.ResetResponse(
            observation=environment_pb2.Observation(text=observation),
            max_turns=self.env.max_turns,
        )

    @rpc.translate_errors
    def Step(self, request, context):
        _check_id(request.episode_id)
        if request.turn < 1:
            raise InvalidArgument("turn", f"must be 1 or more, got {request.turn}")
        turn = self.table.step(
            request.episode_id, request.turn, request.action_text, request.policy_done
        )
        return environment_pb2.StepResponse(
            observation=environment_pb2.Observation(text=turn.observation),
            reward=turn.reward,
            done=turn.done,
            info=turn.info,
        )

    @rpc.translate_errors
    def Close(self, request, context):
        self.table.close(request.episode_id)
        return environment_pb2.CloseResponse()

    @rpc.translate_errors
    def Describe(self, request, context):
        return environment_pb2.DescribeResponse(
            name=self.env.name,
            version=self.env.version,
            max_turns=self.env.max_turns,
            description=self.env.description,
        )


def _check_id(episode_id: str) -> None:
    if not episode_id or len(episode_id) > MAX_ID:
        raise InvalidArgument("episode_id", f"must be 1 to {MAX_ID} characters")


def build_server(config: EnvServiceConfig) -> rpc.Server:
    table = EpisodeTable(build_env(config), config.capacity, config.episode_ttl_s)
    server = rpc.Server(
        config.bind,
        [SERVICE_NAME],
        max_workers=config.workers,
        security=config.security,
        max_concurrent_rpcs=config.max_concurrent_rpcs,
        metrics=Metrics(),
    )
    environment_pb2_grpc.add_EnvironmentServiceServicer_to_server(
        EnvironmentServicer(table), server.grpc
    )
    return server


def serve(config: EnvServiceConfig) -> None:
    server = build_server(config)
    rpc.serve_until_stopped(server, "env", config.port_file, metrics_bind=config.metrics_bind)
