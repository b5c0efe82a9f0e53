"""Which files a run config may make the cluster read: StartRun takes paths from whoever calls
it, so the learner opens only paths under its configured ``read_roots`` (docs/security.md).

The check runs on the path after symlinks and ``..`` are resolved (relative paths against the
learner's working directory, as opening them would), before anything looks at the file — so a
refused path says nothing about whether it exists. The run then uses the resolved path, so what
was checked is what is opened.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from brorl.errors import InvalidArgument, PermissionDenied
from brorl.config.run import RunConfig


class ReadRoots:
    def __init__(self, roots: Iterable[str | Path]):
        # Resolved once, at start: a root is where it pointed when the service started.
        self.roots = tuple(dict.fromkeys(Path(r).resolve() for r in roots))

    def check(self, field: str, path: str) -> Path:
        """``path`` resolved; PermissionDenied naming ``field`` and the rule when it lies outside
        every root."""
        try:
            resolved = Path(path).resolve()
        except (OSError, ValueError, RuntimeError) as exc:  # NUL bytes, symlink loops
            raise InvalidArgument(field, f"{path!r} is not a usable path ({exc})") from None
        if any(resolved.is_relative_to(root) for root in self.roots):
            return resolved
        shown = str(resolved) if str(resolved) == path else f"{path} (resolves to {resolved})"
        raise PermissionDenied(
            field,
            f"{shown} is outside the learner's read_roots "
            f"({', '.join(str(r) for r in self.roots)}); put it under one of them, or add its "
            "directory to read_roots in the learner's config",
        )

    def confine(self, cfg: RunConfig) -> None:
        """Check every path of ``cfg``; the paths the learner opens become their resolved form."""
        cfg.model = str(self.check("model", cfg.model))
        cfg.data.train_path = str(self.check("data.train_path", cfg.data.train_path))
        if cfg.data.eval_path:
            cfg.data.eval_path = str(self.check("data.eval_path", cfg.data.eval_path))
        if cfg.probe is not None:
            cfg.probe.path = str(self.check("probe.path", cfg.probe.path))
        if cfg.explore.embedding_model:
            # Loaded by the rollout workers, which see the same paths in the launcher's and
            # compose's clusters; kept as written since a worker resolves it on its own disk.
            self.check("explore.embedding_model", cfg.explore.embedding_model)
