//! OpenAI-style error responses: `{"error": {"message", "type", "param", "code"}}` with the
//! matching HTTP status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// An error answered to the client. Every failure a request can cause ends as one of these;
/// the server keeps serving.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, `not_found_error`,
    /// `server_error`, `unavailable_error`, ...
    pub kind: &'static str,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 about field `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: (!param.is_empty()).then(|| param.to_string()),
            code: None,
        }
    }

    /// A 400 not tied to one field (malformed JSON, ...).
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        Self::invalid("", message)
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub fn with_status(mut self, status: StatusCode) -> ApiError {
        self.status = status;
        self
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "not_found_error",
            param: None,
            code: None,
        }
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "invalid or missing API key (send 'Authorization: Bearer <key>')".into(),
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    /// 503: every slot is busy and the queue is full (or the server is shutting down).
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "unavailable_error",
            param: None,
            code: Some("server_busy"),
        }
    }

    /// 408: the request did not arrive in time (`--timeout`); the connection is closed after
    /// the answer, since the rest of the body may still be on its way.
    pub fn request_timeout(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_timeout"),
        }
    }

    /// 500: the model failed while generating (the request's slot is freed).
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let close = self.status == StatusCode::REQUEST_TIMEOUT;
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if close {
            r.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        r
    }
}
