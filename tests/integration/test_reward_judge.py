"""LLM-as-judge against a fake OpenAI-compatible server on 127.0.0.1 (port 0), through gRPC."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from brorl.v1 import reward_pb2
from services.reward.base import ScoreItem
from services.reward.config import JudgeSpec, RewardServiceConfig
from services.reward.functions.judge import LLMJudge, parse_score

from .conftest import reward_server


class FakeJudge(BaseHTTPRequestHandler):
    """Answers by the completion it is asked to grade: good / garbage / slow / flaky / http400."""

    calls: dict[str, int] = {}
    seen_auth: list[str] = []

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.path == "/v1/chat/completions"
        prompt = body["messages"][0]["content"]
        self.seen_auth.append(self.headers.get("Authorization", ""))
        key = next(
            (
                k
                for k in ("GOOD", "GARBAGE", "SLOW", "FLAKY", "HTTP400", "NOCONTENT")
                if k in prompt
            ),
            "GOOD",
        )
        FakeJudge.calls[key] = FakeJudge.calls.get(key, 0) + 1
        if key == "SLOW":
            time.sleep(4.0)  # beyond both attempts' timeout
        if key == "FLAKY" and FakeJudge.calls[key] == 1:
            return self._send(503, {"error": "overloaded"})
        if key == "HTTP400":
            return self._send(400, {"error": "bad request"})
        content = {"GARBAGE": "I like turtles. SCORE: banana", "NOCONTENT": None}.get(
            key, "Solid answer.\nSCORE: 8"
        )
        self._send(200, {"choices": [{"message": {"role": "assistant", "content": content}}]})

    def _send(self, code, payload):
        data = json.dumps(payload).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.fixture(scope="module")
def fake_url():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeJudge)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_parse_score():
    assert parse_score("Reasoning...\nSCORE: 7", 0, 10) == 7
    assert parse_score("score = 3.5 then SCORE: 9", 0, 10) == 9
    assert parse_score('{"score": 4}', 0, 10) == 4
    assert parse_score("I'd give it 6/10", 0, 10) == 6
    assert parse_score(" 5 ", 0, 10) == 5
    assert parse_score("SCORE: 11", 0, 10) is None
    assert parse_score("no idea", 0, 10) is None


def test_judge_through_grpc(fake_url, monkeypatch):
    monkeypatch.setenv("BRORL_TEST_JUDGE_KEY", "sk-test")
    cfg = RewardServiceConfig(
        bind="127.0.0.1:0",
        functions={
            "judge": {
                "type": "judge",
                "base_url": fake_url,
                "api_key_env": "BRORL_TEST_JUDGE_KEY",
                "timeout_s": 1.5,  # an answer that is not SLOW comes well within it, loaded or not
                "retries": 1,
                "backoff_s": 0.05,
                "concurrency": 4,
            }
        },
    )
    with reward_server(cfg) as (_, stub):
        names = ["GOOD", "GARBAGE", "SLOW", "FLAKY", "HTTP400", "NOCONTENT"]
        items = [
            reward_pb2.ScoreRequest(id=n, prompt="Explain gravity.", completion=n) for n in names
        ]
        resp = stub.ScoreBatch(
            reward_pb2.ScoreBatchRequest(reward_fn="judge", items=items), timeout=30
        )
        got = {r.id: r for r in resp.results}
        assert (got["GOOD"].status, got["GOOD"].reward) == ("ok", pytest.approx(0.8))
        assert got["GOOD"].components["judge_score"] == 8
        assert got["GARBAGE"].status == "error" and "no score" in got["GARBAGE"].detail
        assert got["SLOW"].status == "timeout" and "attempt 2/2" in got["SLOW"].detail
        assert (got["FLAKY"].status, got["FLAKY"].reward) == ("ok", pytest.approx(0.8))
        assert got["FLAKY"].components["attempts"] == 2
        assert got["HTTP400"].status == "error" and "HTTP 400" in got["HTTP400"].detail
        assert got["NOCONTENT"].status == "error"
        assert all(r.reward == 0 for k, r in got.items() if k not in ("GOOD", "FLAKY"))
        assert "Bearer sk-test" in FakeJudge.seen_auth
        # still serving after all that
        ok = stub.Score(
            reward_pb2.ScoreRequest(reward_fn="math_answer", completion="1", reference="1"),
            timeout=5,
        )
        assert ok.reward == 1.0


def test_unreachable_judge_is_an_error_status():
    judge = LLMJudge(
        "j", JudgeSpec(base_url="http://127.0.0.1:9", timeout_s=0.5, retries=1, backoff_s=0.01)
    )
    try:
        [s] = judge.score_batch([ScoreItem("a", "p", "c", "")])
        assert s.status == "error" and "unreachable" in s.detail and s.reward == 0
    finally:
        judge.close()


def test_rubric_placeholders():
    judge = LLMJudge(
        "j",
        JudgeSpec(
            base_url="http://x/v1",
            rubric='Q={prompt} A={completion} R={reference} {min}-{max} {"json": 1}',
        ),
    )
    assert judge.url == "http://x/v1/chat/completions"
    text = judge.prompt_for(ScoreItem("a", "2+2 {completion}", "4", "4"))
    assert text == 'Q=2+2 {completion} A=4 R=4 0-10 {"json": 1}'
    judge.close()


def test_rubric_extra_placeholders_are_the_prompts_data_fields():
    judge = LLMJudge(
        "j",
        JudgeSpec(base_url="http://x/v1", rubric="{completion} | {extra.rubric} | {extra.none}"),
    )
    item = ScoreItem("a", "p", "c", "r", extra={"rubric": "cite {prompt}"})
    assert judge.prompt_for(item) == "c | cite {prompt} | "  # values are not re-scanned
    judge.close()
