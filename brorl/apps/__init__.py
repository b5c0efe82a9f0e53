"""The applications built on the core: the ``brorl`` command line (``cli``), the local cluster
launcher (``launcher``), the demo and sweep commands (``demo_cmd``, ``sweep_cmd``), the one
recipe both of those follow (``recipe``), the run-progress display (``progress``) and the checks
every command makes of its inputs before it starts anything (``checks``).

The core (``brorl/*.py`` outside this package) never imports ``brorl.apps``; like the core,
the apps import no torch and no ``services`` / ``demo`` module — they start those as
subprocesses (``python -m ...``). tests/unit/test_dependency_rules.py checks both rules and
that the imports inside ``brorl/`` form no cycle.
"""
