"""The one error type users see: a clear, one-line message and a non-zero exit."""


class DynatuneError(Exception):
    """A problem with the user's input or environment, reported as one line.

    ``hint`` says what to do about it; the CLI prints ``error: <message> (<hint>)``.
    """

    def __init__(self, message: str, hint: str | None = None):
        self.message = message.strip().splitlines()[0] if message.strip() else "unknown error"
        self.hint = hint
        super().__init__(self.one_line())

    def one_line(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message
