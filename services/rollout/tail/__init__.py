"""An engine call's tail: what it does (finish.py: select, score, publish), when it runs
(runners.py: inline, or beside the next call's sampling) and where (process.py: in a process of
the worker's own)."""
