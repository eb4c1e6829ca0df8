"""Errors a user can act on. Each names what was wrong and what is allowed."""


class SpecgateError(ValueError):
    """Base class: bad input that specgate refuses with a specific message."""


class ModelLoadError(SpecgateError):
    """A model folder, its config.json or its weights are missing or malformed."""


class RequestError(SpecgateError):
    """A request (prompt or sampling parameters) is invalid; it was not admitted."""
