"""StartRun reads only under the learner's read_roots (services/learner/read_roots.py): every way
out — absolute paths, '..', symlinked files and directories, relative paths — is PERMISSION_DENIED
naming the field and the rule, checked before the file is looked at (a path outside says nothing
about whether it exists); paths inside pass on to the usual checks."""

from __future__ import annotations

import json
import os

import grpc
import pytest

from brorl import rpc
from brorl.config.base import validate
from brorl.v1 import learner_pb2, learner_pb2_grpc
from services.learner.config import LearnerServiceConfig
from services.learner.server import SERVICE_NAME, LearnerServicer

DENIED, INVALID = grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT

# field, value ({root}: the allowed root, {out}: a directory beside it), expected status.
# Unless a row sets it, model and data.train_path are valid files inside the root.
ROWS = [
    ("absolute-model", "model", "/etc", DENIED),
    ("absolute-data", "data.train_path", "/etc/passwd", DENIED),
    ("missing-outside", "model", "/nonexistent/model", DENIED),  # not "does not exist"
    ("dotdot", "data.train_path", "{root}/../out/secret.jsonl", DENIED),
    ("dotdot-deep", "model", "{root}/model/../../../../../../etc", DENIED),
    ("relative", "data.train_path", "../../../../../../../../etc/passwd", DENIED),
    ("symlinked-file", "data.train_path", "{root}/link.jsonl", DENIED),
    ("symlinked-dir", "model", "{root}/outlink", DENIED),
    ("through-symlinked-dir", "data.train_path", "{root}/outlink/secret.jsonl", DENIED),
    ("prefix-sibling", "data.train_path", "{root}-evil/data.jsonl", DENIED),
    ("embedding-model", "explore.embedding_model", "/etc", DENIED),
    ("eval-data", "data.eval_path", "{out}/secret.jsonl", DENIED),
    ("eval-data-dotdot", "data.eval_path", "{root}/../out/secret.jsonl", DENIED),
    ("nul-byte", "model", "{root}/model\x00x", INVALID),
    # inside: the roots pass it on, and the next check answers
    ("inside-missing-model", "model", "{root}/no-model", INVALID),
    ("inside-symlink-to-inside", "data.train_path", "{root}/inlink/missing.jsonl", INVALID),
    ("runs-dir-always", "model", "{runs}/r0/final", INVALID),
]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    base = tmp_path_factory.mktemp("roots")
    root, out, runs = base / "root", base / "out", base / "runs"
    for d in (root / "model", root / "sub", out, runs, base / "root-evil"):
        d.mkdir(parents=True)
    (root / "model" / "config.json").write_text("{}")
    (root / "data.jsonl").write_text('{"prompt": "1+1=", "reference": "2"}\n')
    (out / "secret.jsonl").write_text('{"prompt": "secret"}\n')
    (base / "root-evil" / "data.jsonl").write_text('{"prompt": "x"}\n')
    os.symlink(out / "secret.jsonl", root / "link.jsonl")
    os.symlink(out, root / "outlink")
    os.symlink(root / "sub", root / "inlink")
    return {"root": root, "out": out, "runs": runs}


@pytest.fixture(scope="module")
def stub(tree):
    cfg = validate(
        LearnerServiceConfig,
        {"bind": "127.0.0.1:0", "runs_dir": str(tree["runs"]), "read_roots": [str(tree["root"])]},
    )
    server = rpc.Server(cfg.bind, [SERVICE_NAME])
    learner_pb2_grpc.add_LearnerServiceServicer_to_server(
        LearnerServicer(cfg, redis_client=None), server.grpc
    )
    server.start().set_serving(True)
    channel = rpc.channel(f"127.0.0.1:{server.port}")
    yield learner_pb2_grpc.LearnerServiceStub(channel)
    channel.close()
    server.stop(0)


def run_config(tree, field: str, value: str) -> str:
    paths = {
        "model": str(tree["root"] / "model"),
        "data.train_path": str(tree["root"] / "data.jsonl"),
        "explore.embedding_model": "",
        "data.eval_path": "",
    }
    paths[field] = value.format(**{k: str(v) for k, v in tree.items()})
    cfg = {"model": paths["model"], "data": {"train_path": paths["data.train_path"]}}
    if paths["data.eval_path"]:
        cfg["data"]["eval_path"] = paths["data.eval_path"]
    if paths["explore.embedding_model"]:
        cfg["explore"] = {
            "dedup": "keep_one",
            "dedup_method": "embedding",
            "embedding_model": paths["explore.embedding_model"],
        }
    return json.dumps(cfg)  # JSON is YAML; its escapes carry the NUL byte through


@pytest.mark.parametrize("case, field, value, expected", ROWS, ids=[r[0] for r in ROWS])
def test_start_run_reads_only_under_the_roots(tree, stub, case, field, value, expected):
    text = run_config(tree, field, value)
    with pytest.raises(grpc.RpcError) as err:
        stub.StartRun(learner_pb2.StartRunRequest(config_yaml=text), timeout=30)
    assert err.value.code() == expected, err.value.details()
    details = err.value.details()
    assert details.startswith(f"{field}:"), details
    if expected == DENIED:
        assert "outside the learner's read_roots" in details and str(tree["root"]) in details


def test_default_roots_keep_the_demo_working():
    """The working directory (the repository, .cache/demo among it, where the launcher starts the
    learner) is the default root; runs_dir is added by the servicer."""
    cfg = LearnerServiceConfig()
    assert cfg.read_roots == ["."]
