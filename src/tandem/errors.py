"""User-facing errors: one clear message, exit code 2, no traceback."""


class TandemError(Exception):
    """An error the user can act on: say what was wrong, with which value, and what is accepted."""

    exit_code = 2


class ModelFileError(TandemError):
    """A model file that is missing, unreadable, truncated or unsupported."""


class IncompatibleDraftError(TandemError):
    """A target/draft pair that fails a compatibility rule."""

    exit_code = 1
