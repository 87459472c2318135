"""Imported by every Python process that benchmarks/mutation.py starts (its folder is on their PYTHONPATH).

mutmut (3.x) learns which tests reach a function by counting the calls its trampolines see in the pytest process.
Much of the run engine runs in processes the tests start (`python -m backends.runs.supervise`, `python -m console`,
the agent): those inherit MUTANT_UNDER_TEST, so they run the mutant under test, but the calls they make while the
stats are gathered would be lost with them, and a mutant reached only through a child would be "no tests". In such
a child this module writes each function it reaches to a file, with the test that started the child
(PYTEST_CURRENT_TEST, inherited too); `main`, mutmut's own entry in the process that runs it, adds them to mutmut's
stats before it saves them.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

HITS_ENV = "MUTATION_CHILD_HITS"


def _test_of_this_process() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]


def _main_module() -> str | None:
    """The module this process runs as __main__ (`python -m NAME`), as it is named when imported."""
    argv = sys.orig_argv
    if "-m" not in argv[1:-1]:
        return None
    name = argv[argv.index("-m", 1) + 1]
    if not name.startswith(("backends.", "console")):
        return None
    from importlib.util import find_spec

    spec = find_spec(name)
    return f"{name}.__main__" if spec is not None and spec.submodule_search_locations is not None else name


def _mutants_of_main_by_name() -> None:
    """mutmut tells a mutant by the module its function was defined in, and a module run with `python -m` defines
    its functions in __main__ (`python -m backends.runs.supervise`, the supervisor of every run): they would never
    run a mutant, nor be counted. They are given their module's own name before mutmut wraps them (and their hits
    are recorded under it)."""
    name = _main_module()
    if name is None:
        return
    import mutmut.mutation.trampoline as trampoline

    wrap = trampoline.wrap_in_trampoline

    def wrap_named(mutants: dict[str, Any], is_classmethod: bool = False) -> Callable[[Any], Any]:
        inner = wrap(mutants, is_classmethod)

        def decorate(func: Any) -> Any:
            if func.__module__ == "__main__":  # what the trampoline tells the mutant under test by
                func.__module__ = name
            return inner(func)

        return decorate

    setattr(trampoline, "wrap_in_trampoline", wrap_named)  # noqa: B010 (imported by name, not exported)


def _record_hits_of_a_child() -> None:
    path = os.environ.get(HITS_ENV)
    if not path or os.environ.get("MUTANT_UNDER_TEST") != "stats" or not _test_of_this_process():
        return
    import mutmut.mutation.trampoline as trampoline

    seen: set[str] = set()
    main = _main_module()

    def record(name: str, caller: str | None = None) -> None:
        if main is not None and name.startswith("__main__."):  # as _mutants_of_main_by_name
            name = main + name[len("__main__") :]
        if name in seen:
            return
        seen.add(name)
        try:  # a child running as nobody may not write it: its hits are lost, never its test
            with open(path, "a") as out:
                out.write(json.dumps([_test_of_this_process(), name]) + "\n")
        except OSError:
            pass

    setattr(trampoline, "record_trampoline_hit", record)  # noqa: B010 (it is imported by name, not exported)


def _add_child_hits() -> None:
    from mutmut.state import state

    known = state().duration_by_test
    try:
        with open(os.environ[HITS_ENV]) as hits:
            lines = hits.read().splitlines()
    except FileNotFoundError:
        return
    for line in lines:
        try:
            test, name = json.loads(line)
        except ValueError:  # a line a killed child left half written
            continue
        if test in known:
            state().tests_by_mangled_function_name[name].add(test)


def main() -> None:
    """mutmut's command line, its stats completed with what the tests' children reached."""
    import mutmut.__main__ as mutmut_main
    import mutmut.runners.harness as harness
    import mutmut.stats as stats

    save_stats = stats.save_stats

    def save_with_child_hits() -> None:
        _add_child_hits()
        save_stats()

    for module in (mutmut_main, harness, stats):
        setattr(module, "save_stats", save_with_child_hits)  # noqa: B010 (each imported it by name, unexported)
    run_stats = harness.PytestRunner.run_stats

    def run_stats_with_child_hits(self: harness.PytestRunner, *, tests: Iterable[str]) -> int:
        code = run_stats(self, tests=tests)
        _add_child_hits()  # before mutmut looks whether any test reached a mutant
        return code

    setattr(harness.PytestRunner, "run_stats", run_stats_with_child_hits)  # noqa: B010
    if sys.argv[1:] == ["generate"]:  # the mutants alone, no test run: --sample picks among them
        from mutmut.__main__ import create_mutants
        from mutmut.mutation.trampoline import set_mutant_under_test
        from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir

        set_mutant_under_test("mutant_generation")
        copy_src_dir()
        copy_also_copy_files()
        create_mutants(2)
        return
    if sys.argv[1:2] == ["show-all"]:  # mutmut's `show` of each mutant named, in one process
        from mutmut.mutation.diff_apply import find_mutant, get_diff_for_mutant
        from mutmut.stats import status_by_exit_code

        for name in sys.argv[2:]:
            found = find_mutant(name)
            print(f"# {name}: {status_by_exit_code[found.exit_code_by_key[name]]}")
            print(get_diff_for_mutant(name, path=found.path))
        return
    if os.environ.get("MUTATION_KEEP_RESULTS"):
        # mutmut forgets every result when the tests it runs change; --again keeps them, and runs the survivors
        # it names against the new tests, whose stats mutmut gathers as it does for any test it has not seen.
        setattr(mutmut_main, "_apply_config_change_invalidation", lambda *_: False)  # noqa: B010
    mutmut_main.cli()


if os.environ.get("MUTANT_UNDER_TEST"):
    _mutants_of_main_by_name()
_record_hits_of_a_child()
