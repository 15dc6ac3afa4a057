"""APIError and the handlers that answer every error in OpenAI's error JSON:
{"error": {"message", "type", "param", "code"}}, with the HTTP status the OpenAI API gives it."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

INVALID = "invalid_request_error"


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = INVALID, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(message: str, type: str = INVALID, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def install_handlers(app: FastAPI) -> None:
    """Our APIError, FastAPI's body validation (a 422 by default: 400 here, as OpenAI answers), unknown routes and
    methods, and anything unexpected (500) all answer in the error JSON."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        param = ".".join(loc) or None
        message = first.get("msg", "invalid request body")
        return bad_request(f"{param}: {message}" if param else message, param).response()

    @app.exception_handler(HTTPException)
    async def _http(request: Request, e: HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        return APIError(e.status_code, str(e.detail), code=code, headers=getattr(e, "headers", None)).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception):
        return APIError(500, f"internal error: {type(e).__name__}: {e}", type="server_error").response()
