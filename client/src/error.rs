//! The error a call can end in, in the crate's own terms: what kind of failure it is
//! ([`ErrorKind`], which decides whether the [`FailurePolicy`](crate::FailurePolicy) covers it),
//! the gRPC status Sluice answered with ([`GrpcCode`] and its message), and the deadline that
//! passed.
//!
//! tonic's types stay inside the crate: a caller matches on [`Error::kind`] and
//! [`Error::code`], never on `tonic::Status` or `tonic::transport::Error`, so a tonic upgrade
//! does not change this crate's API. The tonic error, where there is one, is still there for
//! the details, as [`std::error::Error::source`].

use std::fmt;
use std::time::Duration;

/// What kind of failure an [`Error`] is.
///
/// [`Unavailable`](ErrorKind::Unavailable), [`Deadline`](ErrorKind::Deadline) and
/// [`Internal`](ErrorKind::Internal) say nothing about the limit: those are the failures the
/// [`FailurePolicy`](crate::FailurePolicy) covers ([`Error::is_unanswered`]). The others are
/// about the request or the setup, and come back as errors under either policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The client was given something it cannot use: an endpoint that is not a URI
    /// (`http://host:port`), a bearer token that cannot be a header value.
    InvalidSetting,
    /// The request was refused before it was sent (an empty domain, no descriptor, a
    /// descriptor without entries); the message says which part is wrong.
    InvalidRequest,
    /// Sluice could not be reached or is not serving: no connection (down, refused, reset),
    /// `UNAVAILABLE` (its store is down, its circuit breaker open, no config loaded), or
    /// `CANCELLED` before the call's deadline.
    Unavailable,
    /// No answer within the call's deadline ([`Error::deadline`]): it passed on this side, or
    /// Sluice answered `DEADLINE_EXCEEDED` or `CANCELLED` for it.
    Deadline,
    /// Sluice failed while deciding: `INTERNAL`, `UNKNOWN`, `DATA_LOSS`.
    Internal,
    /// Sluice answered that the request is wrong or not allowed: `INVALID_ARGUMENT`,
    /// `NOT_FOUND`, `UNAUTHENTICATED`, `PERMISSION_DENIED`, `RESOURCE_EXHAUSTED`,
    /// `ALREADY_EXISTS`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`, `ABORTED`.
    Refused,
    /// What answered does not serve this call (`UNIMPLEMENTED`): not a Sluice, or a Sluice
    /// without the native API (`LIMITER_API_ENABLED`); or it failed a call with `OK`.
    Protocol,
}

/// A gRPC status code (the numbers are gRPC's), as Sluice or the transport answered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(missing_docs)] // Each variant is gRPC's code of that name.
pub enum GrpcCode {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

impl GrpcCode {
    /// Every code, in numeric order.
    const ALL: [GrpcCode; 17] = [
        GrpcCode::Ok,
        GrpcCode::Cancelled,
        GrpcCode::Unknown,
        GrpcCode::InvalidArgument,
        GrpcCode::DeadlineExceeded,
        GrpcCode::NotFound,
        GrpcCode::AlreadyExists,
        GrpcCode::PermissionDenied,
        GrpcCode::ResourceExhausted,
        GrpcCode::FailedPrecondition,
        GrpcCode::Aborted,
        GrpcCode::OutOfRange,
        GrpcCode::Unimplemented,
        GrpcCode::Internal,
        GrpcCode::Unavailable,
        GrpcCode::DataLoss,
        GrpcCode::Unauthenticated,
    ];

    /// The code's number, as `grpc-status` carries it.
    pub fn as_i32(self) -> i32 {
        self as i32
    }

    /// The code of a number; one gRPC does not define is `UNKNOWN`, as gRPC reads it.
    pub fn from_i32(code: i32) -> GrpcCode {
        usize::try_from(code)
            .ok()
            .and_then(|i| GrpcCode::ALL.get(i).copied())
            .unwrap_or(GrpcCode::Unknown)
    }

    /// The code's name in gRPC's spelling (`RESOURCE_EXHAUSTED`).
    pub fn as_str(self) -> &'static str {
        match self {
            GrpcCode::Ok => "OK",
            GrpcCode::Cancelled => "CANCELLED",
            GrpcCode::Unknown => "UNKNOWN",
            GrpcCode::InvalidArgument => "INVALID_ARGUMENT",
            GrpcCode::DeadlineExceeded => "DEADLINE_EXCEEDED",
            GrpcCode::NotFound => "NOT_FOUND",
            GrpcCode::AlreadyExists => "ALREADY_EXISTS",
            GrpcCode::PermissionDenied => "PERMISSION_DENIED",
            GrpcCode::ResourceExhausted => "RESOURCE_EXHAUSTED",
            GrpcCode::FailedPrecondition => "FAILED_PRECONDITION",
            GrpcCode::Aborted => "ABORTED",
            GrpcCode::OutOfRange => "OUT_OF_RANGE",
            GrpcCode::Unimplemented => "UNIMPLEMENTED",
            GrpcCode::Internal => "INTERNAL",
            GrpcCode::Unavailable => "UNAVAILABLE",
            GrpcCode::DataLoss => "DATA_LOSS",
            GrpcCode::Unauthenticated => "UNAUTHENTICATED",
        }
    }

    /// The kind of failure a status with this code is (`CANCELLED` is
    /// [`ErrorKind::Unavailable`] here; [`crate::Client`] makes it a deadline when the call's
    /// deadline had passed).
    fn kind(self) -> ErrorKind {
        match self {
            GrpcCode::Cancelled | GrpcCode::Unavailable => ErrorKind::Unavailable,
            GrpcCode::DeadlineExceeded => ErrorKind::Deadline,
            GrpcCode::Unknown | GrpcCode::Internal | GrpcCode::DataLoss => ErrorKind::Internal,
            // `OK` is no failure: an error that carries it broke the protocol.
            GrpcCode::Ok | GrpcCode::Unimplemented => ErrorKind::Protocol,
            GrpcCode::InvalidArgument
            | GrpcCode::NotFound
            | GrpcCode::AlreadyExists
            | GrpcCode::PermissionDenied
            | GrpcCode::ResourceExhausted
            | GrpcCode::FailedPrecondition
            | GrpcCode::Aborted
            | GrpcCode::OutOfRange
            | GrpcCode::Unauthenticated => ErrorKind::Refused,
        }
    }
}

impl fmt::Display for GrpcCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a call failed: its [`kind`](Error::kind), the gRPC [`code`](Error::code) and
/// [`message`](Error::message) when Sluice (or the transport) answered one, the
/// [`deadline`](Error::deadline) when that is what passed.
///
/// ```
/// use sluice_client::{Error, ErrorKind, GrpcCode};
///
/// fn explain(error: &Error) -> String {
///     match (error.kind(), error.code()) {
///         (ErrorKind::Deadline, _) => format!("no answer within {:?}", error.deadline()),
///         (ErrorKind::Refused, Some(GrpcCode::Unauthenticated)) => "check the token".into(),
///         (kind, code) => format!("{kind:?} ({code:?}): {}", error.message()),
///     }
/// }
/// ```
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    code: Option<GrpcCode>,
    message: String,
    deadline: Option<Duration>,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl Error {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The gRPC status code Sluice or the transport answered; `None` when the call got no
    /// status (refused before sending, no connection, this side's deadline).
    pub fn code(&self) -> Option<GrpcCode> {
        self.code
    }

    /// What went wrong, in words: the status message Sluice sent, or this crate's account.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The call's deadline, when it is what passed ([`ErrorKind::Deadline`]).
    pub fn deadline(&self) -> Option<Duration> {
        self.deadline
    }

    /// True when the failure says nothing about the limit: Sluice could not be reached or could
    /// not decide in time ([`ErrorKind::Unavailable`], [`ErrorKind::Deadline`],
    /// [`ErrorKind::Internal`]). These are the failures [`FailurePolicy`](crate::FailurePolicy)
    /// covers.
    pub fn is_unanswered(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::Unavailable | ErrorKind::Deadline | ErrorKind::Internal
        )
    }

    fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            code: None,
            message: message.into(),
            deadline: None,
            source: None,
        }
    }

    fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// An endpoint tonic does not take as a URI.
    pub(crate) fn invalid_endpoint(endpoint: &str, source: tonic::transport::Error) -> Self {
        let message = format!("{endpoint:?} is not a Sluice endpoint (http://host:port)");
        Error::new(ErrorKind::InvalidSetting, message).with_source(source)
    }

    /// A bearer token that cannot be a header value.
    pub(crate) fn invalid_token() -> Self {
        let message = "the bearer token is not a valid header value";
        Error::new(ErrorKind::InvalidSetting, message)
    }

    /// A request refused before sending, for the reason `message`.
    pub(crate) fn invalid_request(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidRequest, message)
    }

    /// The connection could not be opened. The message carries the whole chain of causes,
    /// since tonic's own text is only "transport error".
    pub(crate) fn connect(source: tonic::transport::Error) -> Self {
        let mut message = String::from("could not connect to Sluice");
        let mut cause: Option<&dyn std::error::Error> = Some(&source);
        while let Some(error) = cause {
            message.push_str(&format!(": {error}"));
            cause = error.source();
        }
        Error::new(ErrorKind::Unavailable, message).with_source(source)
    }

    /// No answer within `deadline`, measured here.
    pub(crate) fn deadline_passed(deadline: Duration) -> Self {
        let message = format!("Sluice did not answer within {deadline:?}");
        Error {
            deadline: Some(deadline),
            ..Error::new(ErrorKind::Deadline, message)
        }
    }

    /// Sluice's (or the transport's) error status for a call whose deadline was `deadline`.
    pub(crate) fn status(status: tonic::Status, deadline: Duration) -> Self {
        let code = GrpcCode::from_i32(status.code() as i32);
        let kind = code.kind();
        Error {
            code: Some(code),
            deadline: (kind == ErrorKind::Deadline).then_some(deadline),
            ..Error::new(kind, status.message())
        }
        .with_source(status)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.kind, self.code) {
            (_, Some(code)) => write!(f, "Sluice answered {code}: {}", self.message),
            (ErrorKind::InvalidRequest, None) => write!(f, "invalid request: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn grpc_codes_keep_grpcs_numbers() {
        for (i, code) in GrpcCode::ALL.iter().enumerate() {
            assert_eq!(code.as_i32(), i32::try_from(i).unwrap());
            assert_eq!(GrpcCode::from_i32(code.as_i32()), *code);
            // tonic numbers them the same.
            assert_eq!(Code::from_i32(code.as_i32()) as i32, code.as_i32());
        }
        assert_eq!(GrpcCode::from_i32(17), GrpcCode::Unknown);
        assert_eq!(GrpcCode::from_i32(-1), GrpcCode::Unknown);
        assert_eq!(
            GrpcCode::ResourceExhausted.to_string(),
            "RESOURCE_EXHAUSTED"
        );
    }

    /// Which statuses the failure policy covers: the same five as before the error had kinds
    /// (`UNAVAILABLE`, `DEADLINE_EXCEEDED`, `CANCELLED`, `INTERNAL`, `UNKNOWN`), and
    /// `DATA_LOSS`, Sluice failing like `INTERNAL`.
    #[test]
    fn statuses_are_unanswered_only_when_they_say_nothing_of_the_request() {
        let deadline = Duration::from_millis(300);
        let unanswered = [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::Cancelled,
            Code::Internal,
            Code::Unknown,
            Code::DataLoss,
        ];
        for code in GrpcCode::ALL {
            let status = tonic::Status::new(Code::from_i32(code.as_i32()), "why");
            let error = Error::status(status, deadline);
            assert_eq!(error.code(), Some(code));
            assert_eq!(error.message(), "why");
            let covered = unanswered.iter().any(|c| *c as i32 == code.as_i32());
            assert_eq!(error.is_unanswered(), covered, "{code}");
            let source = std::error::Error::source(&error).unwrap();
            assert!(source.downcast_ref::<tonic::Status>().is_some());
        }
        let exceeded = Error::status(tonic::Status::deadline_exceeded("late"), deadline);
        assert_eq!(exceeded.kind(), ErrorKind::Deadline);
        assert_eq!(exceeded.deadline(), Some(deadline));
        assert_eq!(
            exceeded.to_string(),
            "Sluice answered DEADLINE_EXCEEDED: late"
        );
        let refused = Error::status(tonic::Status::not_found("no l"), deadline);
        assert_eq!(
            (refused.kind(), refused.deadline()),
            (ErrorKind::Refused, None)
        );
    }

    #[test]
    fn local_failures_have_no_code() {
        let passed = Error::deadline_passed(Duration::from_millis(5));
        assert_eq!(passed.kind(), ErrorKind::Deadline);
        assert_eq!(passed.code(), None);
        assert!(passed.is_unanswered());
        let invalid = Error::invalid_request("the domain is empty");
        assert_eq!(invalid.to_string(), "invalid request: the domain is empty");
        assert!(!invalid.is_unanswered());
        assert!(!Error::invalid_token().is_unanswered());
    }
}
