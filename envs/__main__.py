"""python -m envs [--config FILE] env=calculator [key=value ...]"""
import sys


def main(argv=None) -> int:
    from brorl.service_main import run_service
    from envs.config import EnvServiceConfig
    from envs.server import serve
    return run_service("env", EnvServiceConfig, serve, argv, prog="python -m envs")


if __name__ == "__main__":
    sys.exit(main())
