"""One service as a child process on a free port (port 0 + a port file), stopped by its own pid:
the tests' and benchmarks' way to start services (the local cluster is
brorl.apps.cluster.launcher)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from brorl.apps.cluster.launcher import REPO_ROOT, child_env, security_overrides, service_command
from brorl.rpc import metrics_port_file, wait_serving
from brorl.security import SecurityConfig


class ServiceProc:
    """One service as a child process on a free port (port 0 + port file): tests and benchmarks."""

    def __init__(
        self,
        service: str,
        tmp: Path,
        name: str | None = None,
        security: SecurityConfig | None = None,
        omp_threads: int = 1,
        **overrides,
    ):
        """``omp_threads``: the process's OpenMP (torch) threads, OMP_NUM_THREADS; 1 as in the
        demo's cluster (``threads_per_process``), 0 for torch's default of one per core. The
        suite runs two lanes of tests on 2 cores, so a service seldom has a core to itself: with
        one core kept busy beside the reward-hacking test's services, its learner took 26.6 s
        an update at two threads and 0.53 s at one (0.48 s at two on idle cores), as each op of
        two threads waits for the one that was descheduled."""
        self.name = name or service
        self.security = security
        self.port_file = tmp / f"{self.name}.port"
        self.log_path = tmp / f"{self.name}.log"
        overrides = {
            "bind": "127.0.0.1:0",
            "port_file": str(self.port_file),
            "metrics_bind": "127.0.0.1:0",
            **security_overrides(security),
            **overrides,
        }
        with open(self.log_path, "wb") as out:
            self.popen = subprocess.Popen(
                service_command(service, overrides),
                cwd=REPO_ROOT,
                env=child_env(omp_threads),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = self.popen.pid

    @property
    def address(self) -> str:
        deadline = time.monotonic() + 60
        while not self.port_file.exists() or not self.port_file.read_text().strip():
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} wrote no port: {self.log()}")
            time.sleep(0.1)
        return f"127.0.0.1:{self.port_file.read_text().strip()}"

    @property
    def metrics_url(self) -> str:
        self.address  # noqa: B018 - waits for the port files (metrics first, then gRPC)
        return f"http://127.0.0.1:{metrics_port_file(self.port_file).read_text()}/metrics"

    def wait_serving(self, timeout: float = 420) -> "ServiceProc":
        try:
            wait_serving(self.address, timeout=timeout, security=self.security)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.log()}") from None
        return self

    def log(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def kill(self, sig=signal.SIGKILL) -> None:
        """Signal the service and everything in its process group (vLLM engine processes)."""
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass
        self.popen.wait(timeout=30)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


def stop_all(procs) -> None:
    """Stop several ServiceProcs: signal them all first so their shutdowns overlap."""
    procs = list(procs)
    for p in procs:
        if p.popen.poll() is None:
            p.popen.terminate()
    for p in procs:
        p.stop()
