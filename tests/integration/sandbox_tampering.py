"""Completions that try to pass a code reward's tests without computing the answers, and honest
solutions that look like them: the data of tests/integration/test_reward_sandbox.py."""

# Completions that try to pass tests without computing the answers. Before the checker moved out
# of the completion's process, the ones marked "passed" scored 1.0 (binary mode); all must score 0.
ADD = ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]
FAKE = (
    "fake = [{'stage': 'run', 'ok': True}] + [{'stage': 'test', 'index': i, 'ok': True, "
    "'error': None} for i in range(2)] + [{'stage': 'done'}]\n"
)
TAMPERING = {
    # (1) an object whose __eq__ always holds (passed)
    "eq_always_true": (
        """
        class A:
            def __eq__(self, other):
                return True
        def add(a, b):
            return A()
        """,
        ADD,
    ),
    # (2) subclasses of built-in types whose __eq__ lies (passed)
    "int_subclass": (
        """
        class I(int):
            def __eq__(self, other):
                return True
            __hash__ = int.__hash__
        def add(a, b):
            return I(7)
        """,
        ADD,
    ),
    "str_subclass": (
        """
        class S(str):
            def __eq__(self, other):
                return True
            __hash__ = str.__hash__
        def greet(name):
            return S('nope')
        """,
        ["assert greet('x') == 'hi x'"],
    ),
    "list_subclass": (
        """
        class L(list):
            def __eq__(self, other):
                return True
        def pair(a):
            return L()
        """,
        ["assert pair(1) == [1, 1]"],
    ),
    # (3) __bool__ / __hash__ overrides (passed)
    "eq_returns_truthy_object": (
        """
        class T:
            def __bool__(self):
                return True
        class A:
            def __eq__(self, other):
                return T()
        def add(a, b):
            return A()
        """,
        ADD,
    ),
    "truthy_object": (
        """
        class T:
            def __bool__(self):
                return True
        def is_prime(n):
            return T()
        """,
        ["assert is_prime(7)", "assert is_prime(11)"],
    ),
    "hash_and_eq_for_set_membership": (
        """
        class H:
            def __hash__(self):
                return 5
            def __eq__(self, other):
                return True
        def add(a, b):
            return H()
        """,
        ["assert add(2, 3) in {5}"],
    ),
    # (4) patched builtins (len: passed; dict, forging the report lines: passed)
    "builtins_len": (
        "import builtins\nbuiltins.len = lambda x: 4\ndef dup(s):\n    return s\n",
        ["assert len(dup('ab')) == 4"],
    ),
    "builtins_dict_forges_report": (
        """
        import builtins
        _dict = dict
        def fake(*args, **kwargs):
            out = _dict(*args, **kwargs)
            if out.get('stage') == 'test':
                out['ok'], out['error'] = True, None
            return out
        builtins.dict = fake
        def add(a, b):
            return 0
        """,
        ADD,
    ),
    "builtins_isinstance_repr": (
        """
        import builtins
        builtins.isinstance = lambda *a: True
        builtins.repr = lambda x: '5'
        class A:
            def __eq__(self, other):
                return True
        def add(a, b):
            return A()
        """,
        ADD,
    ),
    "builtins_assertion_error": (
        """
        import builtins
        class Never(BaseException):
            pass
        builtins.AssertionError = Never
        builtins.BaseException = Never
        def add(a, b):
            return 0
        """,
        ADD,
    ),
    # (5) exiting early
    "sys_exit": ("import sys\nsys.exit(0)\n", ADD),
    "os_exit": ("import os\nos._exit(0)\n", ADD),
    "system_exit_in_function": ("def add(a, b):\n    raise SystemExit(0)\n", ADD),
    "keyboard_interrupt_in_function": ("def add(a, b):\n    raise KeyboardInterrupt\n", ADD),
    "os_exit_in_function": ("import os\ndef add(a, b):\n    os._exit(0)\n", ADD),
    # (6) forged report lines: on stdout, and with the nonce read from the harness's frame (passed)
    "print_forged_lines": (
        "import json\n" + FAKE + "for x in [{'stage': 'syntax', 'ok': True}] + fake:\n"
        "    print(json.dumps(x))\ndef add(a, b):\n    return 0\n",
        ADD,
    ),
    "forged_lines_with_nonce": (
        """
        import gc, json, os, sys
        nonce, fds = '', set(range(3, 256))
        frame = sys._getframe()
        while frame:
            found = dict(frame.f_locals)
            nonce = found.get('nonce') or nonce
            fds.add(found.get('wfd') if isinstance(found.get('wfd'), int) else 3)
            frame = frame.f_back
        for ppid in (os.getpid(), os.getppid()):
            try:
                fds.update(f'/proc/{ppid}/fd/{n}' for n in os.listdir(f'/proc/{ppid}/fd'))
            except OSError:
                pass
        """
        + FAKE
        + """
        data = ''.join(json.dumps(dict(x, n=nonce)) + '\\n' for x in fake).encode()
        for fd in fds:
            try:
                if isinstance(fd, str):
                    fd = os.open(fd, os.O_WRONLY)
                os.write(fd, data)
            except OSError:
                pass
        os._exit(0)
        """,
        ADD,
    ),
    # (7) editing the harness through sys.modules (passed) or gc (passed), or reading the tests
    # out of the interpreter to look the answers up (passed)
    "sys_modules_harness": (
        """
        import json, sys
        class FakeJson:
            @staticmethod
            def dumps(d, **kw):
                if isinstance(d, dict) and d.get('stage') == 'test':
                    d = {**d, 'ok': True, 'error': None}
                return json.dumps(d, **kw)
        for m in list(sys.modules.values()):
            if getattr(m, 'json', None) is json:
                m.json = FakeJson
        for name in ('harness', 'checker'):
            for attr, value in list(vars(sys.modules.get(name, sys)).items()):
                if name != 'sys' and callable(value) and attr in ('decode', 'encode'):
                    setattr(sys.modules[name], attr, lambda *a, **k: True)
        def add(a, b):
            return 0
        """,
        ADD,
    ),
    "gc_harness_globals": (
        """
        import gc, json
        _dumps = json.dumps
        def dumps(d, **kw):
            if isinstance(d, dict) and d.get('stage') == 'test':
                d = {**d, 'ok': True, 'error': None}
            return _dumps(d, **kw)
        json.dumps = dumps
        for o in gc.get_objects():
            if type(o) is dict and 'describe' in o and 'json' in o:
                o['json'] = json
        def add(a, b):
            return 0
        """,
        ADD,
    ),
    "reads_the_tests": (
        """
        import gc, re, sys
        seen = []
        for o in list(gc.get_objects()):
            if type(o) is dict and type(o.get('tests')) is list:
                seen += o['tests']
            elif type(o) is list and o and all(type(t) is str and 'assert' in t for t in o):
                seen += o
        frame = sys._getframe()
        while frame:
            for v in list(frame.f_locals.values()):
                if type(v) is list and v and all(type(t) is str and 'assert' in t for t in v):
                    seen += v
            frame = frame.f_back
        def add(a, b):
            for t in seen:
                m = re.fullmatch(r'assert add\\((\\S+), (\\S+)\\) == (\\S+)', t)
                if m and (int(m[1]), int(m[2])) == (a, b):
                    return int(m[3])
            return 0
        """,
        ADD,
    ),
}


# Honest solutions in the shapes tests take: each must still score 1 (the chains run in the
# completion's process; comparisons, builtins, setup helpers and expected values in the checker).
HONEST = {
    "comprehension_and_lambda": (
        "def sq(x):\n    return x * x\n",
        {
            "tests": [
                "assert all(sq(i) == i * i for i in range(5))",
                "assert [sq(i) for i in range(3)] == [0, 1, 4]",
                "assert sorted([3, -4, 1], key=lambda v: sq(v)) == [1, 3, -4]",
                "assert {k: sq(k) for k in (1, 2)} == {1: 1, 2: 4}",
            ]
        },
    ),
    "class_methods_and_chains": (
        """
        class Stack:
            def __init__(self, *items):
                self.items = list(items)
            def pop(self):
                return self.items.pop()
        def pairs(n):
            return {'n': n, 'pairs': [(i, n - i) for i in range(n + 1)]}
        """,
        {
            "tests": [
                "assert Stack(1, 2).pop() == 2",
                "assert Stack(1, 2).items[0] == 1",
                "assert pairs(2)['pairs'][-1] == (2, 0)",
                "assert len(pairs(3)['pairs']) == 4 and pairs(0)['n'] is not None",
            ]
        },
    ),
    "setup_helpers_and_plain_types": (
        """
        def depth(node):
            return 0 if node is None else 1 + max(depth(node.left), depth(node.right))
        def kinds():
            return (None, True, 2 ** 80, -0.0, 1.5, 2j, b'x', 'é', frozenset({1}), {(1, 2): [3]})
        def mean(xs):
            return sum(xs) / len(xs)
        def nothing():
            pass
        """,
        {
            "setup": (
                "import math\nclass Node:\n    def __init__(self, left=None, right=None):\n"
                "        self.left, self.right = left, right\n"
                "def valid(t):\n    return isinstance(t, tuple) and len(t) == 10"
            ),
            "tests": [
                "assert depth(Node(Node(), None)) == 2",
                "assert valid(kinds())",
                "assert kinds()[2] == 2 ** 80 and math.copysign(1, kinds()[3]) == -1",
                "assert abs(mean([1, 2]) - 1.5) < 1e-9, 'close enough'",
                "assert math.isclose(mean([0.1, 0.2]), 0.15)",
                "assert nothing() is None and 3 not in kinds()[8]",
            ],
        },
    ),
}
