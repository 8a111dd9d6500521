"""The pure packages import without Django, so the agent and the CLI never need it."""

import subprocess
import sys

import pytest

PURE = ["ingest.parsers", "analysis.classify", "agents"]


@pytest.mark.parametrize("module", PURE)
def test_pure_package_imports_without_django(module):
    code = (
        "import sys\n"
        f"import {module}\n"
        "leaked = sorted(m for m in sys.modules if m == 'django' or m.startswith('django.'))\n"
        "assert not leaked, leaked\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": "."})


def test_the_core_and_the_agent_do_not_import_django_even_indirectly():
    code = (
        "import sys, importlib, pkgutil\n"
        "import ingest.parsers, analysis.classify, agents\n"
        "for pkg in (ingest.parsers, analysis.classify, agents):\n"
        "    for m in pkgutil.iter_modules(pkg.__path__):\n"
        "        importlib.import_module(pkg.__name__ + '.' + m.name)\n"
        "assert 'django' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": "."})
