"""python -m services.rollout [--config FILE] [key=value ...]"""
import sys


def main(argv=None) -> int:
    from brorl.service_main import run_service
    from services.rollout.config import RolloutServiceConfig
    from services.rollout.server import serve
    return run_service("rollout", RolloutServiceConfig, serve, argv)


if __name__ == "__main__":
    sys.exit(main())
