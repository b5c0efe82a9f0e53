"""Service side of the code sandbox: starts the fork-server (runner.py), feeds it jobs, collects
answers.

The fork-server is a separate, single-threaded ``python -I -S`` process started with an empty
environment, so nothing of the service (secrets in its environment, gRPC threads) reaches a job. One
pool serves every request; at most ``concurrency`` jobs run at once, the rest queue in the runner.
If the runner dies, waiting jobs fail with status error and the next call starts a new one.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future, wait
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)
RUNNER = Path(__file__).with_name("runner.py")  # started by file path, never imported
START_TIMEOUT_S = 20.0


@dataclass
class SandboxSettings:
    wall_s: float = 2.0
    cpu_s: float = 2.0
    memory_mb: int = 256
    file_size_mb: int = 8
    disk_mb: int = 64
    nproc: int = 32
    nofile: int = 64
    concurrency: int = 4
    isolation: str = "auto"  # auto | namespaces | guard
    uid_base: int = 0  # 0: a random block of unused uids


class SandboxUnavailable(RuntimeError):
    pass


class SandboxPool:
    def __init__(self, settings: SandboxSettings):
        self.settings = settings
        self.isolation = ""  # what the runner actually uses, once started
        self._lock = threading.Lock()  # guards _proc, _pending, _counter
        self._write_lock = threading.Lock()  # one writer on the runner's stdin at a time
        self._proc: subprocess.Popen | None = None
        self._root = ""
        self._pending: dict[str, Future] = {}
        self._counter = 0

    # ------------------------------------------------------------------ lifecycle
    def _ensure_started(self) -> subprocess.Popen:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._cleanup_root()
        s = self.settings
        self._root = tempfile.mkdtemp(prefix="brorl-sandbox-")
        uid_base = s.uid_base or random.randrange(1_000_000, 2_000_000_000, 1000)
        cfg = dict(asdict(s), root=self._root, uid_base=uid_base)
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(RUNNER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd="/",
            close_fds=True,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            start_new_session=True,
        )
        proc.stdin.write((json.dumps(cfg) + "\n").encode())
        proc.stdin.flush()
        ready = self._first_line(proc)
        if not ready.get("ready"):
            proc.kill()
            proc.wait()
            raise SandboxUnavailable(ready.get("fatal") or f"sandbox runner did not start: {ready}")
        self.isolation = ready["isolation"]
        log.info(
            "code sandbox ready: isolation=%s concurrency=%d limits wall=%.1fs cpu=%.1fs "
            "mem=%dMB nproc=%d",
            self.isolation,
            s.concurrency,
            s.wall_s,
            s.cpu_s,
            s.memory_mb,
            s.nproc,
        )
        self._proc = proc
        threading.Thread(
            target=self._read_answers, args=(proc,), daemon=True, name="sandbox-reader"
        ).start()
        threading.Thread(
            target=self._drain_stderr, args=(proc,), daemon=True, name="sandbox-stderr"
        ).start()
        return proc

    @staticmethod
    def _first_line(proc: subprocess.Popen) -> dict:
        box: list[bytes] = []
        reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(START_TIMEOUT_S)
        if not box or not box[0]:
            err = b""
            if proc.poll() is not None:
                err = proc.stderr.read()[-2000:]
            return {"fatal": f"sandbox runner gave no answer: {err.decode(errors='replace')}"}
        return json.loads(box[0])

    def _read_answers(self, proc: subprocess.Popen) -> None:
        for raw in proc.stdout:
            try:
                answer = json.loads(raw)
            except ValueError:
                log.warning("sandbox runner wrote a non-JSON line: %r", raw[:200])
                continue
            with self._lock:
                fut = self._pending.pop(str(answer.get("id")), None)
            if fut is not None and not fut.done():
                fut.set_result(answer)
        code = proc.wait()
        with self._lock:
            pending, self._pending = self._pending, {}
            if self._proc is proc:
                self._proc = None
        for fut in pending.values():
            fut.set_result({"runner_error": f"sandbox runner exited with code {code}"})
        if pending:
            log.error("sandbox runner exited with code %s; %d jobs failed", code, len(pending))

    @staticmethod
    def _drain_stderr(proc: subprocess.Popen) -> None:
        for raw in proc.stderr:
            log.warning("sandbox: %s", raw.decode(errors="replace").rstrip())

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None:
            try:
                proc.stdin.close()  # EOF: the runner kills its jobs and exits
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
        self._cleanup_root()

    def _cleanup_root(self) -> None:
        if self._root:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = ""

    # ------------------------------------------------------------------ jobs
    def run(self, jobs: list[dict]) -> list[dict]:
        """Run ``jobs`` ({"code", "setup", "tests"}) and return the runner's answers in the same
        order."""
        if not jobs:
            return []
        futures: list[Future] = []
        lines = []
        with self._lock:
            try:
                proc = self._ensure_started()
            except (OSError, SandboxUnavailable) as exc:
                return [{"runner_error": f"sandbox unavailable: {exc}"} for _ in jobs]
            for job in jobs:
                self._counter += 1
                job_id = str(self._counter)
                fut: Future = Future()
                self._pending[job_id] = fut
                futures.append(fut)
                lines.append(json.dumps(dict(job, id=job_id)))
        # Not under _lock: the reader thread needs it to hand out answers while this pipe fills up.
        with self._write_lock:
            try:
                proc.stdin.write(("\n".join(lines) + "\n").encode())
                proc.stdin.flush()
            except OSError as exc:
                for fut in futures:
                    if not fut.done():
                        fut.set_result({"runner_error": f"sandbox runner unreachable: {exc}"})
        s = self.settings
        rounds = -(-len(jobs) // s.concurrency) + 1
        wait(futures, timeout=rounds * (s.wall_s + 1.0) + 30.0)
        return [
            f.result() if f.done() else {"runner_error": "sandbox runner did not answer in time"}
            for f in futures
        ]

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
