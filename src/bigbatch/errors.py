"""Errors a user can act on, and the exit codes of the command line.

A UserError's message is printed on one line and the command exits with EXIT_USER_ERROR.
"""

EXIT_USER_ERROR = 2  # bad input: one line on stderr says what to change
EXIT_NONFINITE = 3  # training stopped on a non-finite loss or gradient
EXIT_PEER_LOST = 76  # a peer stopped answering; an elastic launcher restarts from a checkpoint
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: preempted after writing a checkpoint; resume with --resume auto


class UserError(Exception):
    """Base class: bad input the user can fix. The message says what to change."""


class ConfigError(UserError):
    """An invalid configuration value, recipe name or command-line option."""


class DataError(UserError):
    """Missing, corrupt or badly laid out data (the message names the file or folder)."""


class CheckpointError(UserError):
    """A checkpoint that is missing, truncated or does not match the run."""
