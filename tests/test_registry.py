"""The one registry idiom (student/registry.py): names resolve lazily, unknown names list the
choices under the config key, out-of-tree code registers its own, and every registry the configs
name uses it."""
import os
import subprocess
import sys

import pytest

from conftest import CHILD_PYTHONPATH, ROOT
from student.registry import Registry, UnknownName


def test_unknown_name_states_the_key_and_the_choices_and_is_a_key_and_value_error():
    reg = Registry("thing.kind", {"b": "json:dumps", "a": "json:loads"})
    with pytest.raises(UnknownName) as err:
        reg["c"]
    assert str(err.value) == "thing.kind='c' is unknown; choose one of ['a', 'b']"
    assert isinstance(err.value, KeyError) and isinstance(err.value, ValueError)
    assert list(reg) == ["a", "b"] and "a" in reg and "c" not in reg and len(reg) == 2


def test_entries_import_on_first_use_and_out_of_tree_registration():
    import json
    reg = Registry("thing.kind", {"dumps": "json:dumps"})
    reg.register("mine", len)                                  # an object itself
    assert reg["dumps"] is json.dumps and reg["mine"] is len
    reg.register("broken", "json:no_such_thing")
    with pytest.raises(ImportError, match="thing.kind='broken' is registered at 'json:no_such_thing'"):
        reg["broken"]
    with pytest.raises(ValueError, match="package.module:attribute"):
        reg.register("bad", "json.dumps")


def test_checking_a_name_imports_no_implementation():
    """Validating `method.name`, `task.environment`, `eval.suites` and `teacher.kind` names
    imports none of the implementations (a fresh interpreter, so nothing is imported already)."""
    code = """
import sys
from rl.methods import METHODS
from rl.environments import ENVIRONMENTS
from rl.evals import SUITES
from teacher import TEACHERS
for reg, name in [(METHODS, "corrected_replay"), (ENVIRONMENTS, "calculator"), (SUITES, "reference_logprob"),
                  (TEACHERS, "openai")]:
    reg.check(name)
lazy = ["rl.methods.corrected_replay", "rl.environments.calculator", "rl.evals.reference_logprob", "teacher.openai_api"]
print(sorted(m for m in lazy if m in sys.modules))
from rl.methods import get_method
assert get_method("corrected_replay").name == "corrected_replay"
print("rl.methods.corrected_replay" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=CHILD_PYTHONPATH))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["[]", "True"]


def test_every_registered_name_builds_and_names_itself():
    """Each entry imports, and a method or suite's own `name` is the name it is registered under."""
    from rl.environments import ENVIRONMENTS
    from rl.evals import SUITES
    from rl.methods import METHODS
    from student.model import STUDENT_FAMILIES
    from student.rollout_engine import ROLLOUT_ENGINES
    from teacher import TEACHERS
    for reg in (METHODS, SUITES):
        assert all(impl.name == name for name, impl in reg.items())
    for reg in (ENVIRONMENTS, TEACHERS, ROLLOUT_ENGINES):
        assert all(callable(impl) for _, impl in reg.items())
    assert all(callable(family.transformers_config) for _, family in STUDENT_FAMILIES.items())
