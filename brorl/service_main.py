"""The common entry point of every service: parse config (file, env, ``key=value`` overrides),
set up logging, log the resolved config, hand off to the service's ``serve(config)``."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import Callable, Sequence, TypeVar

from brorl.config.base import dump, load_config
from brorl.errors import BrorlError

C = TypeVar("C")


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s",
    )


def run_service(
    name: str,
    config_cls: type[C],
    serve: Callable[[C], None],
    argv: Sequence[str] | None = None,
    prog: str = "",
) -> int:
    parser = argparse.ArgumentParser(
        prog=prog or f"python -m services.{name}", description=f"brorl {name} service"
    )
    parser.add_argument("--config", help="YAML/JSON config file")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides (highest precedence)")
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    log = logging.getLogger(f"brorl.{name}")
    try:
        config = load_config(config_cls, args.config, args.overrides)
    except BrorlError as exc:
        print(f"error: invalid {name} config: {exc}", file=sys.stderr)
        return 2
    log.info("resolved config:\n%s", dump(config))
    # SIGTERM (the launcher, docker) ends the service like Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        serve(config)
    except KeyboardInterrupt:
        log.info("stopping")
    except ConnectionError as exc:  # a dependency is down at start (e.g. RedisUnavailable)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
