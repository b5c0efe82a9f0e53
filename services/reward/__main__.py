"""python -m services.reward [--config FILE] [key=value ...]"""
import sys


def main(argv=None) -> int:
    from brorl.service_main import run_service
    from services.reward.config import RewardServiceConfig
    from services.reward.server import serve
    return run_service("reward", RewardServiceConfig, serve, argv)


if __name__ == "__main__":
    sys.exit(main())
