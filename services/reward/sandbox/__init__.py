"""The code sandbox: ``pool`` (service side) starts ``runner.py`` as a separate ``python -I -S``
process by file path; the runner loads ``harness.py`` from its own directory. ``runner`` and
``harness`` use only the standard library and import nothing of brorl or the service.
"""
