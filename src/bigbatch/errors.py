"""Errors a user can act on: the CLI prints their message on one line and exits with code 2."""


class UserError(Exception):
    """Base class: bad input the user can fix. The message says what to change."""


class ConfigError(UserError):
    """An invalid configuration value, recipe name or command-line option."""


class DataError(UserError):
    """Missing, corrupt or badly laid out data (the message names the file or folder)."""


class CheckpointError(UserError):
    """A checkpoint that is missing, truncated or does not match the run."""
