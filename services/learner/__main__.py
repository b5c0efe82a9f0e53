"""python -m services.learner [--config FILE] [key=value ...]"""
import sys


def main(argv=None) -> int:
    from brorl.service_main import run_service
    from services.learner.config import LearnerServiceConfig
    from services.learner.server import serve
    return run_service("learner", LearnerServiceConfig, serve, argv)


if __name__ == "__main__":
    sys.exit(main())
