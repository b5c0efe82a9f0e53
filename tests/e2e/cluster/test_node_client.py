"""The Node.js example (examples/node/client.js), a client built from protos/ alone: against the
live local cluster it starts a 2-step run, prints each step as it watches, and generates a
completion; against a token-checking server it sends the token as brorl.security expects it,
in plaintext and over TLS.
Without node the tests are skipped (scripts/setup.sh notes it); with node but without the npm
packages they fail, because setup.sh installs them."""

import json
import shutil
import subprocess

import grpc
import pytest

from brorl.apps.cluster.launcher import REPO_ROOT
from brorl.config.base import validate
from brorl.rpc import Server
from brorl.security import SecurityConfig
from brorl.v1 import learner_pb2, learner_pb2_grpc
from tests.certs import make_tls_files

CLIENT = REPO_ROOT / "examples" / "node" / "client.js"


@pytest.fixture(scope="module")
def node() -> str:
    exe = shutil.which("node")
    if exe is None:
        pytest.skip("node is not installed (scripts/setup.sh skips examples/node without it)")
    if not (CLIENT.parent / "node_modules" / "@grpc" / "grpc-js").is_dir():
        pytest.fail("examples/node has no node_modules: run `bash scripts/setup.sh`")
    return exe


def run_client(node: str, *args, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [node, str(CLIENT), *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.redis
def test_node_client_starts_watches_and_generates(shared_cluster, node, tmp_path):
    from demo.task import problems

    data = tmp_path / "train.jsonl"  # under the learner's read_roots (the session's basetemp)
    data.write_text(
        "".join(
            json.dumps({"prompt": p.prompt, "reference": p.answer}) + "\n"
            for p in problems(50, seed=7)
        )
    )
    config = tmp_path / "run.yaml"
    config.write_text(
        f"""
model: {shared_cluster["model"]}
data: {{train_path: {data}}}
reward_fn: format
sampling: {{n: 64, temperature: 1.0, max_tokens: 6}}
train: {{steps: 2, groups_per_step: 2, lr: 0.001}}
async: {{publish_every: 1}}
checkpoint_every: 0
"""
    )
    procs = shared_cluster["procs"]
    out = run_client(node, procs["learner"].address, procs["rollout0"].address, config)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    run_id = lines[0].split()[1]  # "started <run_id> (2 steps) in <run_dir>"
    assert lines[0].startswith("started ") and "(2 steps)" in lines[0], lines
    assert [line.split()[1] for line in lines if line.startswith("step ")] == ["1", "2"], lines
    assert f"run {run_id}: finished at step 2/2" in lines, lines
    completion = [line for line in lines if line.startswith('completion of "12+34=": "')]
    assert len(completion) == 1 and "weight_version" in completion[0], lines
    # what the program printed is the run the learner trained
    metrics = (shared_cluster["runs"] / run_id / "metrics.jsonl").read_text().splitlines()
    assert sum(1 for m in metrics if "learner/loss" in json.loads(m)) == 2


class _Learner(learner_pb2_grpc.LearnerServiceServicer):
    def StartRun(self, request, context):
        return learner_pb2.RunInfo(run_id="token-ok", state="running", total_steps=0)

    def WatchRun(self, request, context):
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the token got through")


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
def test_node_client_sends_the_bearer_token(node, tmp_path, tls):
    """The real server skeleton and token check (brorl.rpc.Server, brorl.security.TokenCheck, as
    every service installs them) in front of a learner stand-in, over plaintext (the token as
    per-call metadata needs no TLS) and over TLS with --tls-ca: no process to start, so this
    costs the Node program's start-ups only."""
    files = make_tls_files(tmp_path / "tls")
    files.token.write_text(files.token.read_text().strip() + "\n")  # the services strip it
    security = {"token_file": str(files.token)}
    if tls:
        security["tls"] = {"cert": str(files.cert), "key": str(files.key)}
    service = learner_pb2.DESCRIPTOR.services_by_name["LearnerService"].full_name
    server = Server("127.0.0.1:0", [service], security=validate(SecurityConfig, security))
    learner_pb2_grpc.add_LearnerServiceServicer_to_server(_Learner(), server.grpc)
    server.start()
    config = tmp_path / "run.yaml"
    config.write_text("model: unused\n")
    address = f"127.0.0.1:{server.port}"
    ca = ["--tls-ca", files.ca] if tls else []
    try:
        refused = run_client(node, address, address, config, *ca)
        assert refused.returncode == 2
        assert "error: UNAUTHENTICATED: missing credentials" in refused.stderr, refused.stderr
        wrong = run_client(node, address, address, config, *ca, "--token", "x" * 32)
        assert "error: UNAUTHENTICATED: invalid token" in wrong.stderr, wrong.stderr
        token = files.token.read_text().strip()
        for flags in (["--token-file", files.token], ["--token", token]):
            passed = run_client(node, address, address, config, *ca, *flags)
            assert passed.returncode == 2, passed.stdout + passed.stderr
            assert passed.stdout.startswith("started token-ok"), passed.stdout
            assert "FAILED_PRECONDITION: the token got through" in passed.stderr, passed.stderr
    finally:
        server.stop()
