"""Errors the CLI turns into one line on stderr and an exit code."""


class MrcError(Exception):
    """A failure the user can act on. exit_code 2 = bad input, 1 = the system said no."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class InputError(MrcError):
    exit_code = 2


class StepError(MrcError):
    """A step of `up` failed; everything before it was rolled back."""

    def __init__(self, step: str, cause: str):
        super().__init__(f"{step}: {cause}")
        self.step = step
        self.cause = cause
