"""User-facing errors: one line and an exit code, never a traceback (memray's convention)."""


class PyobmemError(Exception):
    """An error the user can act on. ``str(err)`` is the one-line message; ``exit_code`` the status."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class CaptureError(PyobmemError):
    """A capture file that cannot be read: missing, foreign, truncated header, newer version."""

    def __init__(self, message: str):
        super().__init__(message, exit_code=2)
