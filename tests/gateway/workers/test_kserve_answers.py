"""How a ``kserve.Model``'s exception is answered, as KServe's model server answers it. The
kserve package is not in this environment, so its error classes are stand-ins of the same
names; the end-to-end file (tests/e2e/test_kserve_model_e2e.py) runs the real ones."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gateway.worker.processors.kserve_model import _as_kserve_answers


class InvalidInput(ValueError):
    pass


class ModelNotFound(Exception):
    pass


class ModelNotReady(Exception):
    pass


class InferenceError(RuntimeError):
    pass


class UnsupportedProtocol(Exception):
    pass


ERRORS = SimpleNamespace(
    InvalidInput=InvalidInput,
    ModelNotFound=ModelNotFound,
    ModelNotReady=ModelNotReady,
    InferenceError=InferenceError,
    UnsupportedProtocol=UnsupportedProtocol,
)


class HTTPException(Exception):
    """The shape of FastAPI's: a status and a detail."""

    def __init__(self, status_code: int, detail: str | None = None) -> None:
        super().__init__(f"{status_code}")
        self.status_code = status_code
        self.detail = detail


@pytest.mark.parametrize(
    ("exc", "status", "message"),
    [
        (InvalidInput("bad x"), 400, "bad x"),
        (ModelNotFound("no m"), 404, "no m"),
        (NotImplementedError("later"), 501, "later"),
        (ModelNotReady("loading"), 503, "loading"),
        (InferenceError("it broke"), 500, "it broke"),
        (HTTPException(418, "a teapot"), 418, "a teapot"),
        (HTTPException(422), 422, "422"),
        (HTTPException(200, "not an error status"), 500, "HTTPException : 200"),
        (KeyError("x"), 500, "KeyError : 'x'"),
    ],
)
def test_each_exception_answers_as_kserve_answers_it(exc: Exception, status: int, message: str) -> None:
    answer = _as_kserve_answers(ERRORS, exc)
    assert (answer.status, answer.message) == (status, message)
