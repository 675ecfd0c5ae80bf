"""One family of errors for everything the engine refuses or fails at.

Every class says what kind of thing went wrong; the routes put any of them into their family's
envelope in one place (handlers/http/errors.py `engine_error`) and the command line prints the
message. Each carries:

- `status`: the HTTP status that kind of failure answers with (the class decides; DecisionError,
  whose refusals and failures share one type, takes it per instance);
- `code`: a short machine-readable reason (`model_not_found`, `rate_limit_exceeded`, ...);
- `param`: the request field at fault, where there is one;
- `headers`: what a client should know beside the message (Retry-After on capacity refusals).

    EngineError
    ├── BadInput             400  a request the engine cannot serve as asked
    │   ├── ContextTooLong        the prompt or the asked-for output does not fit the context window
    │   └── WrongModel            the model is installed but is not the kind the work needs
    ├── NotFound             404  no installed model by that name
    │   └── ModelNotInstalled     ... worded for the command line, which can install it
    ├── Busy                 429  past the queue limits; retry after a second
    ├── Unavailable          503  a wait that timed out, a model being unloaded, no memory to load
    ├── Cancelled            499  the client went away; the work was stopped
    ├── LoadFailed           500  a model whose files do not load
    ├── Failed               500  the model or its library failed while working
    ├── MissingDependency    500  a library or program the model needs is not installed
    ├── OutOfMemory          507  not enough memory to finish the work
    ├── DecisionError        400/500  a refusal of a whole decision request, or an answer the
    │                             model could not give
    ├── SettingsError        400  an option out of its bounds (engine/settings.py)
    └── ModelFileError       400  installing, converting or reading model files
        ├── StoreError            the model store (a bad id, a missing model)
        ├── PullError             fetching a model from where it is published
        ├── GGUFImportError       a GGUF file that cannot be converted
        ├── PyPISourceError       a wheel that cannot be fetched or lacks the files
        └── WhisperConversionError a CTranslate2 Whisper model that cannot be converted
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

RETRY_AFTER_SECONDS = 1
MODEL_NOT_FOUND = "The model is not available locally."
CLIENT_CLOSED = "The client closed the request."


class EngineError(Exception):
    status: ClassVar[int] = 500
    code: str = "server_error"

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.param = param
        self.headers = headers

    @property
    def type(self) -> str:
        """The error type of the OpenAI-shaped envelopes: the client's fault or the server's."""
        return "invalid_request_error" if self.status < 500 else "server_error"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status}, {self.message!r}, code={self.code!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its state, whatever its class's constructor takes: errors cross from the
        # engine process to the server process whole.
        return _rebuild, (type(self), self.args, self.__dict__)


def _rebuild(kind: type[EngineError], args: tuple[Any, ...], state: dict[str, Any]) -> EngineError:
    error = kind.__new__(kind)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class BadInput(EngineError):
    status = 400
    code = "invalid_request"


class ContextTooLong(BadInput):
    code = "context_length_exceeded"


class WrongModel(BadInput):
    pass


class NotFound(EngineError):
    status = 404
    code = "model_not_found"

    def __init__(self, message: str = MODEL_NOT_FOUND, *, param: str | None = "model", **kwargs: Any) -> None:
        super().__init__(message, param=param, **kwargs)


def _retry_after() -> dict[str, str]:
    return {"Retry-After": str(RETRY_AFTER_SECONDS)}


class Busy(EngineError):
    status = 429
    code = "rate_limit_exceeded"

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, headers=_retry_after(), **kwargs)


class Unavailable(EngineError):
    status = 503
    code = "unavailable"

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, headers=_retry_after(), **kwargs)


class Cancelled(EngineError):
    """The client went away; the work was stopped (and nobody is left to read this)."""

    status = 499
    code = "cancelled"

    def __init__(self, message: str = CLIENT_CLOSED) -> None:
        super().__init__(message)


class LoadFailed(EngineError):
    code = "model_load_failed"


class Failed(EngineError):
    pass


class MissingDependency(EngineError):
    code = "missing_dependency"


class OutOfMemory(EngineError):
    status = 507
    code = "insufficient_memory"


class DecisionError(EngineError):
    """A refusal of the whole decision request (4xx), or an answer the model could not give (5xx)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message, code="invalid_request" if status < 500 else "server_error")
        self.status = status  # type: ignore[misc]


class ModelFileError(EngineError):
    status = 400
    code = "invalid_request"


class StoreError(ModelFileError):
    pass


class ModelNotInstalled(StoreError, NotFound):
    """No installed model by that name, worded for someone who can install it."""

    status = 404
    code = "model_not_found"

    def __init__(self, name: str) -> None:
        super().__init__(f"The model '{name}' is not installed. Install it with: swama pull {name}")
        self.name = name


class PullError(StoreError):
    pass


class GGUFImportError(ModelFileError, ValueError):
    """The GGUF file cannot be converted (unsupported content or a damaged file)."""


class PyPISourceError(ModelFileError, RuntimeError):
    """A wheel could not be fetched, or it does not hold the wanted files."""


class WhisperConversionError(ModelFileError):
    """A CTranslate2 Whisper model that cannot be converted."""


# How MemoryError aside the libraries word running out: NumPy ("Unable to allocate 8.00 PiB"), MLX's
# allocators ("[malloc] Unable to allocate", "[cuda::malloc] Failed to allocate"), CUDA ("out of memory").
_OUT_OF_MEMORY = ("out of memory", "unable to allocate", "failed to allocate", "bad_alloc")


def out_of_memory(exc: BaseException) -> Unavailable | None:
    """The 503 a request that ran the host or the device out of memory gets (the work is lost, the
    server goes on serving); None for any other failure. A failure from the engine process arrives as
    the Failed that names it."""
    text = str(exc).strip()
    if not (isinstance(exc, MemoryError)
            or isinstance(exc, RuntimeError | Failed) and any(m in text.lower() for m in _OUT_OF_MEMORY)):
        return None
    what = text.splitlines()[0][:200] if text else type(exc).__name__
    return Unavailable(f"The server ran out of memory for this request ({what}); it goes on serving. Retry "
                       "later, or send a smaller request.", code="insufficient_memory")


_FOLDERS = re.compile(r"(?:[A-Za-z]:)?(?:[/\\][^\s'\"/\\:]+)+[/\\]([^\s'\"/\\:]+)")


def without_folders(text: str) -> str:
    """`text` with every absolute path cut to its last part: what a client is told names no folder of
    the server's disk."""
    return _FOLDERS.sub(r"\1", text)

