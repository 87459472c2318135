"""A mutation score for the modules that keep a run's fate and send signals (issue 27), with mutmut 3.

    bash benchmarks/mutation.sh [MODULE ...] [--sample N] [--without-kill-tests] [--workdir DIR] [--max-children 2]
    bash benchmarks/mutation.sh [MODULE ...] --again     # the last run's survivors, against the kill tests since
    bash benchmarks/mutation.sh MODULE --resume          # the rest of a run that was stopped (a session's end)
    bash benchmarks/mutation.sh --table [--again]        # the last table

Run by hand, never in CI: on 2 cores a full run takes long (the sh wrapper runs it under `nice -n 19` and
`ionice -c3`). Each module is mutated on its own, in a copy of the committed tree (HEAD, plus any
tests/test_mutation_kills_*.py being written) under --workdir (default /tmp/eagle3-mutation/MODULE: the checkout
is never touched), against the test files that exercise it (its unit
tests, not the tmux or sshd end-to-end ones), each mutant run against the tests that reach the mutated function.

The tests start real processes (`python -m backends.runs.supervise`, the agent, `python -m console`): they run the
mutated copy too (its folder is first on their PYTHONPATH and they inherit MUTANT_UNDER_TEST), and
`mutation_site/sitecustomize.py` tells mutmut which test reached a function only in such a child, so that a mutant
there is run against that test rather than called "no tests". A test that starts a child with an environment of
its own (not the inherited one) runs the real code in that child.

`--sample N` runs one mutant in N, the same ones every run (a hash of the name): on a loaded 2-core machine a
whole run of the slow modules (store: 1005 mutants, control: 746) takes hours. The console's kill/relaunch path is
its functions in console/actions.py (kill, kill_job, relaunch, relaunch_nodes, job_nodes, free_gpus ...) and the
job gathering they use in console/fleet/jobs.py, not the launch code beside them. `--without-kill-tests` leaves
tests/test_mutation_kills_*.py out, for the score before them; `--again` runs the survivors of the last run again
with them (killed mutants stay killed: adding tests cannot revive one). `--resume` runs the mutants a stopped run
left undecided, in its copy of the code as it was, every result kept (mutmut itself goes on where it stopped); the
table's `run` column counts the decided ones.

Two runs of different modules may go side by side (on 2 cores, `--max-children 1` each): mutmut's passes over
all of a module's tests before its first mutant (stats, then clean) run one test at a time and leave a core idle
for minutes, which the other run takes; each run adds its rows to the table as it ends.

Prints a table per module: mutants, killed, survived (no test failed), no tests (no test reached it), timeout,
other (mutmut's suspicious or segfault) and score = (killed + timeout) / mutants. Each module's survivors, with
their diffs, are written to WORKDIR/MODULE/survivors.txt, the table to WORKDIR/results.json (a run of some modules
keeps the others' rows). `cd WORKDIR/MODULE && PYTHONPATH=REPO/benchmarks/mutation_site REPO/.venv/bin/python -c
'import sitecustomize as s; s.main()' show NAME` shows one mutant.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._common import print_table

REPO = Path(__file__).resolve().parent.parent
SITE = REPO / "benchmarks" / "mutation_site"
TAG_ENV = "MUTATION_RUN_TAG"


@dataclass(frozen=True)
class Target:
    files: tuple[str, ...]
    tests: tuple[str, ...]
    deselect: tuple[str, ...] = ()
    # Only these functions' mutants (as mutmut names them: x_NAME, xǁCLASSǁNAME), where a file holds more than
    # the path measured; () for all.
    functions: tuple[str, ...] = ()

    def measures(self, mutant: str) -> bool:
        return not self.functions or mutant.rpartition(".")[2].split("__mutmut_")[0] in self.functions

    def test_args(self, root: Path) -> list[str]:
        name = Path(self.files[0]).stem
        kills = f"tests/test_mutation_kills_{name}.py"
        tests = [*self.tests, *([kills] if (root / kills).is_file() else [])]
        return [*tests, *(f"--deselect={test}" for test in self.deselect)]


RUNS = "tests/test_runstore.py"
FAULTS = "tests/test_faults_processes.py"
TARGETS: dict[str, Target] = {
    # Each against the tests of that module, not every test that passes through it: on 2 cores, a test file that
    # starts supervisors costs minutes a pass, and mutmut passes twice (stats, clean) before the first mutant.
    "fileio": Target(("backends/fileio.py",), (RUNS,)),
    "store": Target(("backends/runs/store.py",), (RUNS, "tests/test_lost_runs.py")),
    "control": Target(
        ("backends/runs/control.py",),
        (
            *(FAULTS, "tests/test_run_identity.py", "tests/test_jobs.py", "tests/test_launch_shapes.py"),
            # the pre-launch gate (doctor on the draft, SGLang's parser on a serve's flags) as launch and relaunch
            # meet it: of the serve-flags tests, those through the agent; the others ask the parser alone
            "tests/test_prelaunch_gate.py",
            *(
                f"tests/test_serve_flags.py::test_{name}"
                for name in (
                    "a_serve_launch_with_a_python_lacking_sglang_starts_nothing_and_says_what_to_do",
                    "a_launch_with_a_flag_sglang_refuses_starts_nothing_unless_forced",
                    "a_relaunch_onto_a_flag_sglang_refuses_is_refused_and_a_valid_one_goes_ahead",
                    "a_dry_run_relaunch_shows_the_new_command_and_its_checks_and_stops_nothing",
                    "a_launch_and_a_relaunch_with_a_deprecated_flag_show_sglangs_warning",
                )
            ),
            "tests/test_stages.py::test_a_python_without_torch_is_refused_before_anything_starts",
            "tests/test_cli.py::test_relaunch_sets_and_unsets_flags_and_links_parent",
        ),
        (
            # doctor and convert alone: no launch
            "tests/test_prelaunch_gate.py::test_doctor_and_convert_commands",
            "tests/test_prelaunch_gate.py::test_doctor_command_over_the_agent_names_the_serving_python",
            "tests/test_run_identity.py::test_an_agent_over_ssh_whose_login_hands_it_a_runs_marker_sheds_it",
            # over the test sshd: its agent starts from a login environment, without mutmut
            "tests/test_run_identity.py::test_kill_ends_schedulers_that_renamed_themselves_after_their_launcher_exited[gpu-test]",
        ),
    ),
    "supervise": Target(
        ("backends/runs/supervise.py",),
        (
            FAULTS,
            "tests/test_failure_reasons.py",
            # the one of the metrics tests with a real supervisor (the others drive the follower alone)
            "tests/test_metrics_sources.py::test_supervisor_turns_specforge_output_into_rows",
            # the GPU sampler the supervisor hands its watch: a silent process on a busy GPU is not stalled
            "tests/test_watch.py::test_a_silent_process_on_a_busy_gpu_is_not_stalled_until_the_gpu_goes_idle",
        ),
    ),
    "procinfo": Target(("backends/host/procinfo.py",), ("tests/test_procinfo.py", "tests/test_faults_records.py")),
    "freegpus": Target(
        ("backends/host/freegpus.py",),
        ("tests/test_freegpus.py",),
        (
            "tests/test_freegpus.py::"
            "test_the_plan_says_whose_each_process_is_and_a_run_of_another_workdir_ends_killed_there[gpu-test]",
        ),
    ),
    "protocol": Target(
        ("backends/protocol.py",), ("tests/test_protocol.py", "tests/test_client_ops.py", "tests/test_metric_names.py")
    ),
    # The console's kill and relaunch: actions.py and the job grouping it kills and relaunches jobs by, through the
    # CLI's own processes.
    "actions": Target(
        ("console/actions.py", "console/fleet/jobs.py"),
        functions=(
            *("x_live", "x_kill", "x_job_runs", "x_kill_job", "x_preview", "x_relaunch", "x_relaunch_nodes"),
            *("x_job_nodes", "x_settled", "x_free_gpus_plan", "x_to_kill", "x_free_gpus", "x_survivors"),
            *("x_gather", "xǁJobǁmissing", "xǁNodeǁrank"),
        ),
        tests=(
            "tests/test_jobs.py",
            "tests/test_cli.py::test_kill_stops_the_whole_process_group",
            "tests/test_cli.py::test_kill_escalates_to_sigkill_after_grace",
            "tests/test_cli.py::test_kill_of_an_ended_run_says_so",
            "tests/test_cli.py::test_relaunch_sets_and_unsets_flags_and_links_parent",
            "tests/test_cli.py::test_free_gpus_dry_run_then_for_real",
            "tests/test_cli.py::test_gpu_processes_are_attributed_to_their_run_and_freeing_them_kills_it",
            "tests/test_faults_inputs.py::test_relaunch_dry_run_would_stop_only_a_run_that_is_alive",
        ),
    ),
}

# mutmut's exit codes (mutmut.stats.status_by_exit_code), grouped as the table counts them.
KILLED = {1, 3}
SURVIVED = {0}
NO_TESTS = {5, 33}
TIMEOUT = {36, -24, 24, 152, 255}
LEFT = SURVIVED | NO_TESTS
KILL_TESTS = True  # --without-kill-tests: the score before they were written


def mutmut_config(target: Target, root: Path) -> str:
    def toml_list(items: list[str]) -> str:
        return "[" + ", ".join(json.dumps(i) for i in items) + "]"

    return (
        "\n[tool.mutmut]\n"
        'source_paths = ["backends", "console"]\n'
        'also_copy = ["themes"]\n'
        f"only_mutate = {toml_list(list(target.files))}\n"
        f"pytest_add_cli_args_test_selection = {toml_list(target.test_args(root))}\n"
        # a mutant that hangs a test is killed by its test's timeout rather than the suite's 120 s
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "--timeout=90"]\n'
        "use_git_change_detection = false\n"
    )


def prepare(work: Path, target: Target) -> None:
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    # The committed code and tests (another's edit under way is not measured), and the kill tests being written.
    archive = subprocess.run(
        ["git", "archive", "HEAD", "backends", "console", "themes", "tests", "pyproject.toml"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
    if KILL_TESTS:
        for kills in (REPO / "tests").glob("test_mutation_kills_*.py"):
            shutil.copy2(kills, work / "tests" / kills.name)
    # there before any interpreter starts: one that found it missing on its PYTHONPATH would never look again
    (work / "mutants").mkdir()
    with (work / "pyproject.toml").open("a") as pyproject:
        pyproject.write(mutmut_config(target, work))


def ours(tag: str) -> list[int]:
    """Every process still running that this run started, however deep: they carry its tag in their environment."""
    marker = f"{TAG_ENV}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def kill_leftovers(tag: str) -> int:
    """SIGKILL what the tests of this run left behind (a mutant that broke `kill` leaves its runs going)."""
    killed = 0
    for _ in range(10):
        pids = ours(tag)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.5)
    return killed


def mutmut(work: Path, args: list[str], env: dict[str, str], log: Path | None = None) -> int:
    argv = [sys.executable, "-c", "import sitecustomize as s; s.main()", *args]
    if log is None:
        return subprocess.run(argv, cwd=work, env=env, check=False).returncode
    with log.open("ab") as out:
        return subprocess.run(argv, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, check=False).returncode


def results_of(work: Path, target: Target) -> dict[str, dict[str, int | None]]:
    """Each mutated file's mutants and their exit codes, as mutmut left them."""
    found = {}
    for file in target.files:
        meta = json.loads((work / "mutants" / f"{file}.meta").read_text())
        found[file] = {name: code for name, code in meta["exit_code_by_key"].items() if target.measures(name)}
    return found


def row(module: str, codes: dict[str, int | None], seconds: float) -> dict[str, Any]:
    values = [code for code in codes.values() if code is not None]  # not run: left out by --sample
    count = {
        "generated": len(codes),
        "mutants": len(values),
        "killed": sum(v in KILLED for v in values),
        "survived": sum(v in SURVIVED for v in values),
        "no_tests": sum(v in NO_TESTS for v in values),
        "timeout": sum(v in TIMEOUT for v in values),
    }
    count["other"] = count["mutants"] - sum(count[k] for k in ("killed", "survived", "no_tests", "timeout"))
    score = (count["killed"] + count["timeout"]) / count["mutants"] if count["mutants"] else float("nan")
    return {"module": module, **count, "score": round(100 * score, 1), "seconds": round(seconds)}


def write_survivors(work: Path, codes: dict[str, int | None], env: dict[str, str]) -> list[str]:
    names = sorted(name for name, code in codes.items() if code in LEFT)
    out = work / "survivors.txt"
    out.write_text("")
    if names:
        mutmut(work, ["show-all", *names], env, out)
    return names


def again(work: Path, target: Target) -> list[str]:
    """Ready the last run's folder for its survivors to be run again, against the kill tests written since; their
    names."""
    for kills in (REPO / "tests").glob("test_mutation_kills_*.py"):
        shutil.copy2(kills, work / "tests" / kills.name)
    pyproject = work / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().split("\n[tool.mutmut]\n")[0] + mutmut_config(target, work))
    return [name for codes in results_of(work, target).values() for name, code in codes.items() if code in LEFT]


def run_module(
    name: str, root: Path, max_children: int, rerun: bool, sample: int, resume: bool = False
) -> list[dict[str, Any]]:
    target = TARGETS[name]
    work = root / name
    names = again(work, target) if rerun or resume else []
    if resume:
        names = []  # mutmut run with no names runs the undecided ones
    elif not rerun:
        prepare(work, target)
    elif not names:
        print(f"== {name}: no survivors to run again", flush=True)
    tag = uuid.uuid4().hex
    hits = work / "child-hits.jsonl"
    hits.touch()
    hits.chmod(0o666)  # the permission tests run some children as nobody
    env = {
        **os.environ,
        TAG_ENV: tag,
        "MUTATION_CHILD_HITS": str(hits),
        # the mutated copy first, for every process the tests start; sitecustomize for the hits of each
        "PYTHONPATH": os.pathsep.join([str(SITE), str(work / "mutants")]),
    }
    env.pop("MUTANT_UNDER_TEST", None)
    if rerun or resume:
        env["MUTATION_KEEP_RESULTS"] = "1"  # the killed stay killed: only the new tests' stats are gathered
    print(f"== {name}: {', '.join(target.files)} against {' '.join(target.test_args(work))}", flush=True)
    started = time.monotonic()
    log = work / "mutmut.log"
    if (sample > 1 or target.functions) and not rerun and not resume:
        mutmut(work, ["generate"], env, log)
        names = [
            n for codes in results_of(work, target).values() for n in codes if zlib.crc32(n.encode()) % sample == 0
        ]
    try:
        rc = (
            0
            if rerun and not resume and not names
            else mutmut(work, ["run", f"--max-children={max_children}", *names], env, log)
        )
    finally:
        left = kill_leftovers(tag)
    seconds = time.monotonic() - started
    if left:
        print(f"   killed {left} processes its tests left running", flush=True)
    if rc != 0:
        tail = log.read_bytes()[-3000:].decode(errors="replace").replace("\r", "\n").splitlines()[-15:]
        print(f"   mutmut exited {rc}; the end of {log}:", *tail, sep="\n   ", flush=True)
    results = results_of(work, target)
    rows = [row(f"{name}:{file}" if len(target.files) > 1 else name, codes, seconds) for file, codes in results.items()]
    # one file for all of the module's files: written per file, the last would leave the others' out
    survivors = write_survivors(work, {k: v for codes in results.values() for k, v in codes.items()}, env)
    print(f"   {len(survivors)} survivors (diffs in {work / 'survivors.txt'})", flush=True)
    kill_leftovers(tag)
    return rows


HEADERS = ("module", "generated", "run", "killed", "survived", "no tests", "timeout", "other", "score %", "wall s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modules", nargs="*", metavar="MODULE", help=f"of {', '.join(TARGETS)} (default: all)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/eagle3-mutation"))
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument(
        "--sample",
        type=int,
        default=1,
        metavar="N",
        help="run one mutant in N, picked by a hash of its name (the same ones every run); default: every one",
    )
    parser.add_argument(
        "--without-kill-tests", action="store_true", help="leave tests/test_mutation_kills_*.py out: the score before"
    )
    parser.add_argument("--resume", action="store_true", help="run what a stopped run left undecided, its results kept")
    parser.add_argument("--table", action="store_true", help="print the last run's table (with --again: its again)")
    parser.add_argument(
        "--again",
        action="store_true",
        help="run the last run's survivors again, with the kill tests written since (results-again.json)",
    )
    args = parser.parse_args()
    modules = args.modules or list(TARGETS)
    global KILL_TESTS
    KILL_TESTS = not args.without_kill_tests
    if unknown := [m for m in modules if m not in TARGETS]:
        parser.error(f"no module {', '.join(unknown)}: choose of {', '.join(TARGETS)}")
    root: Path = args.workdir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    table_file = root / ("results-again.json" if args.again else "results.json")

    def table() -> dict[str, dict[str, Any]]:
        return json.loads(table_file.read_text()) if table_file.exists() else {}

    started = time.monotonic()
    for name in [] if args.table else modules:
        rows = run_module(name, root, args.max_children, args.again, args.sample, args.resume)
        # read again as it is written: a run of other modules beside this one writes its rows meanwhile
        table_file.write_text(json.dumps({**table(), **{each["module"]: each for each in rows}}, indent=1))
    if not args.table:
        print(f"\nmutation run of {', '.join(modules)}: {time.monotonic() - started:.0f} s wall\n")
    keys = ("module", "generated", "mutants", "killed", "survived", "no_tests", "timeout", "other", "score", "seconds")
    print_table([[str(r.get(k, r["mutants"])) for k in keys] for r in table().values()], HEADERS)


if __name__ == "__main__":
    main()
