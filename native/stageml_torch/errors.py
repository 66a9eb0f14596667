"""Coded errors of the torch worker (codes match the TS side's `RT_*` codes)."""


class WorkerError(Exception):
    """An error with a code the TypeScript executor maps to a `RuntimeError`."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


PROTOCOL = "RT_WORKER_FAILED"
UNSUPPORTED = "RT_UNSUPPORTED_OP"
BAD_VALUE = "RT_BAD_VALUE"
MISSING_INPUT = "RT_MISSING_INPUT"
UNKNOWN_INPUT = "RT_UNKNOWN_INPUT"
MISSING_WEIGHT = "RT_MISSING_WEIGHT"
EVAL = "RT_EVAL_FAILED"
BAD_BUNDLE = "RT_BAD_BUNDLE"
DISPOSED = "RT_DISPOSED"
CACHE_LOST = "RT_CACHE_LOST"
