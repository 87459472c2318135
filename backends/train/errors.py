"""The trainer's expected failures: each carries the exit code the CLI returns."""

from __future__ import annotations


class TrainError(Exception):
    """Bad arguments, missing files or data we refuse: exit code 2, one line."""

    exit_code = 2


class TrainingFailed(TrainError):
    """A run that started and could not go on (non-finite loss, out of memory): exit code 1."""

    exit_code = 1
