"""What the learner does with the monitors' readings (docs/monitors.md): every step's readings go
into its metrics as ``monitor/<name>``; an alarm is a WatchRun event ("alarm") and a
``monitor/alarm/<name>`` metric, then ``monitors.action`` decides:

* ``warn``: nothing more;
* ``stop``: the run ends (state "stopped") with the alarm as its message;
* ``rollback``: the policy's weights and optimizer state go back to the newest checkpoint that
  passed every monitor; the learning rate and the KL coefficient become
  ``train.lr × lr_factor^k`` and ``train.kl_coef × kl_factor^k`` after the k-th rollback; the
  restored weights are published under a version above every published one; groups sampled by
  earlier versions are dropped ("rolled_back"); the windows start afresh. The step counter, the
  prompt cursor and the run's counters go on (they describe what was consumed, which a rollback
  does not undo). After ``max_rollbacks`` an alarm stops the run.

Whether each checkpoint passed lies in ``checkpoints/monitors.json`` beside it (tag → step,
passed), with the rollbacks so far. A checkpoint passes when no monitor alarmed at its step and
no later alarm read paths of later weights: an alarm at step s reads the ``window`` steps up to
s; the oldest weight version their paths came from (``learner/oldest_version``, the minimum over
the window) holds the weights of some step h, and every checkpoint from h on is marked failed too
(the initial policy's, step 0, never is). With paths of the newest weights h = s − window; a
staleness bound, a publish lag or the background publisher make them older and h earlier.
The ledger lives on disk, so a resumed run rolls back to the same places and keeps its scaled
learning rate and KL coefficient. With ``action: rollback`` a step-0 checkpoint of the initial
policy is written at the start, so there is always a place to go back to.
"""

from __future__ import annotations

import json
import logging
import math
from collections import deque
from pathlib import Path

from services.learner.guard.monitors import Monitors

log = logging.getLogger(__name__)
LEDGER = "monitors.json"


class RunGuard:
    def __init__(self, trainer):
        self.trainer = trainer
        self.cfg = trainer.cfg.monitors
        self.monitors = Monitors(self.cfg)
        self.stop_message = ""  # set when an alarm stopped the run
        self.ledger_path = Path(trainer.ckpt_dir) / LEDGER
        self.ledger = {"checkpoints": {}, "rollbacks": 0}
        self.alarms = 0
        self.version_step: dict[int, int] = {}  # weight version → the step whose weights it holds
        self.oldest: deque[int] = deque(maxlen=self.cfg.window)  # per step of the window

    # -- start ---------------------------------------------------------------------------------
    def start(self) -> None:
        """After the trainer's start (resume included): read the ledger, re-apply scaled
        hyper-parameters, and make sure a rollback has a checkpoint to go back to."""
        if self.ledger_path.exists():
            self.ledger = json.loads(self.ledger_path.read_text())
            if self.ledger["rollbacks"]:
                self._apply_scaled()
        if self.cfg.action == "rollback" and not self._passed_tags():
            self.trainer.checkpoint()
            self._record_checkpoint(passed=True)
        self.version_step[self.trainer.version] = self.trainer.step

    # -- every step ------------------------------------------------------------------------------
    def check(self, metrics: dict[str, float]) -> None:
        """Run the monitors on a step's metrics (adding ``monitor/*`` to them) and act."""
        self._record_versions(metrics)
        readings = self.monitors.observe(metrics)
        fired = {name: r for name, r in readings.items() if r.fired}
        metrics.update(
            {f"monitor/{name}": r.value for name, r in readings.items() if math.isfinite(r.value)}
        )
        metrics.update({f"monitor/alarm/{name}": 1.0 for name in fired})
        self.alarms += len(fired)
        metrics["monitor/alarms"] = float(self.alarms)
        metrics["monitor/rollbacks"] = float(self.ledger["rollbacks"])
        self._record_checkpoint(passed=not fired)
        if not fired:
            return
        self._suspect(self._horizon())
        message = "; ".join(f"{name}: {r.detail}" for name, r in fired.items())
        for name, r in fired.items():
            self.trainer.state.emit(
                {f"monitor/{name}": r.value}, event="alarm", message=f"{name}: {r.detail}"
            )
        log.warning("monitor alarm at step %d: %s", self.trainer.step, message)
        action = self.cfg.action
        if action == "rollback" and self.ledger["rollbacks"] >= self.cfg.max_rollbacks:
            action, message = "stop", f"{message} (after {self.cfg.max_rollbacks} rollbacks)"
        if action == "stop":
            self.stop_message = f"stopped by monitor alarm at step {self.trainer.step}: {message}"
            self.trainer.state.stop_requested.set()
        elif action == "rollback":
            self.rollback(message)
            metrics["monitor/rollbacks"] = float(self.ledger["rollbacks"])

    def rollback(self, why: str) -> None:
        t = self.trainer
        target = self._target()
        t.policy.load_checkpoint(str(t.ckpt_dir), tag=target)
        self.ledger["rollbacks"] += 1
        lr, kl = self._apply_scaled()
        # workers may hold any version: the restored weights get a number above all of them
        pointer = t._redis(t.channels.read_weights, "reading the weight pointer")
        t.version = max(t.version, pointer.version if pointer else 0)
        t.publish(at_once=True)
        t.intake.min_version = t.version  # paths of the abandoned weights are not trained on
        self.monitors.reset()
        self.oldest.clear()
        self.version_step[t.version] = self.ledger["checkpoints"][target]["step"]
        self._save()
        t.state.weight_version = t.version
        step = self.ledger["checkpoints"][target]["step"]
        message = (
            f"rolled back to checkpoint {target} (step {step}) after: {why}; published as weight "
            f"version {t.version}; lr {lr:.3g}, kl_coef {kl:.3g}"
        )
        t.state.emit(
            {
                "monitor/rollbacks": float(self.ledger["rollbacks"]),
                "learner/weight_version": float(t.version),
                "learner/lr": lr,
                "learner/kl_coef": kl,
            },
            event="rollback",
            message=message,
        )
        log.warning("%s", message)

    # -- the ledger ------------------------------------------------------------------------------
    def _apply_scaled(self) -> tuple[float, float]:
        k, train = self.ledger["rollbacks"], self.trainer.cfg.train
        lr, kl = train.lr * self.cfg.lr_factor**k, train.kl_coef * self.cfg.kl_factor**k
        self.trainer.policy.set_hyperparameters(lr=lr, kl_coef=kl)
        return lr, kl

    def _record_checkpoint(self, passed: bool) -> None:
        """Enter the checkpoint written at this step (if any) with the monitors' verdict."""
        last = self.trainer.state.last_checkpoint
        if last is None:
            return
        tag, step = Path(last[0]).name, last[1]
        entry = self.ledger["checkpoints"].get(tag)
        if step != self.trainer.step or (entry and entry["step"] == step):
            return  # not this step's, or already entered
        self.ledger["checkpoints"][tag] = {"step": step, "passed": passed}
        self._save()

    def _record_versions(self, metrics: dict[str, float]) -> None:
        """Which step's weights each published version holds (the step it was first seen at),
        and the oldest version this step trained on."""
        version = metrics.get("learner/weight_version")
        if version is not None:
            self.version_step.setdefault(int(version), self.trainer.step)
        oldest = metrics.get("learner/oldest_version")
        if oldest is not None:
            self.oldest.append(int(oldest))

    def _horizon(self) -> int:
        """The last step whose weights no path of the alarm's window came from: checkpoints
        after it are suspect. Without versions (none recorded): s − window − 1."""
        if not self.oldest:
            return self.trainer.step - self.cfg.window - 1
        oldest = min(self.oldest)  # its weights are those of step h: h and later are suspect
        known = [step for version, step in self.version_step.items() if version <= oldest]
        return max(known, default=0) - 1

    def _suspect(self, horizon: int) -> None:
        """The alarm read paths of the weights after step ``horizon``: their checkpoints no
        longer count as passed (the initial policy's, step 0, always does)."""
        for entry in self.ledger["checkpoints"].values():
            if entry["step"] > max(horizon, 0):
                entry["passed"] = False
        self._save()

    def _passed_tags(self) -> list[str]:
        return [t for t, e in self.ledger["checkpoints"].items() if e["passed"]]

    def _target(self) -> str:
        """The newest checkpoint that passed every monitor (step 0 at worst)."""
        passed = sorted(self._passed_tags(), key=lambda t: self.ledger["checkpoints"][t]["step"])
        if not passed:
            raise RuntimeError("rollback: no checkpoint passed the monitors")
        return passed[-1]

    def _save(self) -> None:
        self.ledger_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.ledger_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.ledger, indent=1))
        tmp.replace(self.ledger_path)
