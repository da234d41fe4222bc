//! Error classification and retries, in one place.
//!
//! Retry decisions are data ([`ErrorClass`]); every SDK error goes through
//! [`classify`]. Throttling, 5xx, timeouts and transaction conflicts are
//! retried with exponential, jittered, bounded backoff; a failed condition
//! is an answer to interpret, and a validation error marks a poison record.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use backoff::ExponentialBackoff;

/// What to do about an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorClass {
    /// Try again later; the reason labels the retry metric.
    Retry(&'static str),
    /// A condition expression failed: an expected outcome.
    Conditional,
    /// The request can never succeed for this data (a poison record).
    Poison(String),
    /// The configuration is wrong (no table, no access, no credentials).
    Fatal(String),
}

/// Codes that mean "slow down and try again".
const THROTTLING: &[&str] = &[
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "Throttling",
];

/// Classifies an SDK error.
pub fn classify<E, R>(error: &SdkError<E, R>) -> ErrorClass
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    match error {
        SdkError::TimeoutError(_) => ErrorClass::Retry("timeout"),
        SdkError::DispatchFailure(failure) => {
            if failure.is_timeout() {
                ErrorClass::Retry("timeout")
            } else if failure.is_io()
                || failure.as_other() == Some(aws_smithy_types::retry::ErrorKind::TransientError)
            {
                // `TransientError`: the connection closed before the answer
                // came (hyper's "incomplete message").
                ErrorClass::Retry("network")
            } else {
                ErrorClass::Fatal(format!("cannot send the request: {}", describe(error)))
            }
        }
        SdkError::ResponseError(_) => ErrorClass::Retry("bad response"),
        SdkError::ConstructionFailure(_) => ErrorClass::Fatal(describe(error)),
        SdkError::ServiceError(service) => {
            classify_code(service.err().code(), service.err().message())
        }
        _ => ErrorClass::Retry("unknown"),
    }
}

/// Classifies a DynamoDB error code (also used for cancellation reasons).
pub fn classify_code(code: Option<&str>, message: Option<&str>) -> ErrorClass {
    let text = || {
        format!(
            "{}: {}",
            code.unwrap_or("error"),
            message.unwrap_or("(no message)")
        )
    };
    match code {
        Some(code) if THROTTLING.contains(&code) => ErrorClass::Retry("throttled"),
        Some(
            "TransactionConflictException"
            | "TransactionConflict"
            | "TransactionInProgressException",
        ) => ErrorClass::Retry("transaction conflict"),
        Some(
            "InternalServerError"
            | "InternalFailure"
            | "ServiceUnavailable"
            | "InternalServerErrorException",
        ) => ErrorClass::Retry("server error"),
        Some("ConditionalCheckFailedException" | "ConditionalCheckFailed") => {
            ErrorClass::Conditional
        }
        Some(
            "ValidationException"
            | "ValidationError"
            | "ItemCollectionSizeLimitExceededException"
            | "ItemCollectionSizeLimitExceeded"
            | "SerializationException",
        ) => ErrorClass::Poison(text()),
        Some(
            "ResourceNotFoundException"
            | "AccessDeniedException"
            | "UnrecognizedClientException"
            | "MissingAuthenticationToken"
            | "MissingAuthenticationTokenException"
            | "InvalidSignatureException"
            | "ExpiredTokenException",
        ) => ErrorClass::Fatal(text()),
        _ => ErrorClass::Retry("server error"),
    }
}

/// The error with its sources, on one line.
pub fn describe(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        let inner_text = inner.to_string();
        if !text.contains(&inner_text) {
            text.push_str(": ");
            text.push_str(&inner_text);
        }
        source = inner.source();
    }
    text
}

/// An operation's final failure after retries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// Retries ran out or the deadline came; the records must be redelivered.
    #[error("{0}")]
    Transient(String),
    /// Poison: dead-letter the record.
    #[error("{0}")]
    Poison(String),
    /// Configuration: fail the whole batch.
    #[error("{0}")]
    Fatal(String),
}

/// The backoff policy: exponential from 25 ms, doubling, ±50% jitter,
/// at most 2 s between tries, `max_elapsed` in all.
pub fn policy(max_elapsed: Duration) -> ExponentialBackoff {
    ExponentialBackoff {
        initial_interval: Duration::from_millis(25),
        randomization_factor: 0.5,
        multiplier: 2.0,
        max_interval: Duration::from_secs(2),
        max_elapsed_time: Some(max_elapsed),
        ..ExponentialBackoff::default()
    }
}

/// The longest pause between retries of a stream shard or a recovery.
pub const SLOW_MAX_WAIT: Duration = Duration::from_secs(10);

/// The backoff of slow loops (a stream shard's reads and applies, a
/// recovery): exponential from 100 ms, doubling, ±50% jitter, at most 10 s
/// between tries; `max_elapsed` `None` retries forever.
pub fn slow_policy(max_elapsed: Option<Duration>) -> ExponentialBackoff {
    ExponentialBackoff {
        initial_interval: Duration::from_millis(100),
        randomization_factor: 0.5,
        multiplier: 2.0,
        max_interval: SLOW_MAX_WAIT,
        max_elapsed_time: max_elapsed,
        ..ExponentialBackoff::default()
    }
}

/// Runs `op` with retries. `op` returns `Err(class)` for a failure; retryable
/// classes are retried until `max_elapsed`, then become [`WriteError::Transient`].
pub async fn with_retries<T, F, Fut>(
    what: &'static str,
    max_elapsed: Duration,
    retries: &AtomicU64,
    mut op: F,
) -> Result<T, WriteError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, (ErrorClass, String)>>,
{
    let result = backoff::future::retry_notify(
        policy(max_elapsed),
        || {
            let attempt = op();
            async move {
                match attempt.await {
                    Ok(value) => Ok(value),
                    Err((ErrorClass::Retry(reason), message)) => {
                        Err(backoff::Error::transient((reason, message)))
                    }
                    Err((ErrorClass::Poison(message), _)) => Err(backoff::Error::permanent(("poison", message))),
                    Err((ErrorClass::Fatal(message), _)) => Err(backoff::Error::permanent(("fatal", message))),
                    Err((ErrorClass::Conditional, message)) => {
                        Err(backoff::Error::permanent(("conditional", message)))
                    }
                }
            }
        },
        |(reason, message): (&'static str, String), wait: Duration| {
            retries.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("projector_retries_total", "operation" => what, "reason" => reason).increment(1);
            tracing::debug!(operation = what, reason, wait_ms = wait.as_millis() as u64, %message, "retrying");
        },
    )
    .await;
    result.map_err(|(kind, message)| match kind {
        "poison" => WriteError::Poison(message),
        "fatal" => WriteError::Fatal(message),
        "conditional" => WriteError::Poison(format!("unexpected condition failure: {message}")),
        reason => WriteError::Transient(format!("gave up after retries ({reason}): {message}")),
    })
}

/// Classifies an SDK error and keeps its text, for [`with_retries`].
pub fn sdk<E, R>(error: SdkError<E, R>) -> (ErrorClass, String)
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    let class = classify(&error);
    let text = match &error {
        SdkError::ServiceError(service) => format!(
            "{}: {}",
            service.err().code().unwrap_or("error"),
            service.err().message().unwrap_or("(no message)")
        ),
        other => describe(other),
    };
    (class, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_classified() {
        assert_eq!(
            classify_code(Some("ThrottlingException"), None),
            ErrorClass::Retry("throttled")
        );
        assert_eq!(
            classify_code(Some("ProvisionedThroughputExceededException"), None),
            ErrorClass::Retry("throttled")
        );
        assert_eq!(
            classify_code(Some("RequestLimitExceeded"), None),
            ErrorClass::Retry("throttled")
        );
        assert_eq!(
            classify_code(Some("TransactionConflict"), None),
            ErrorClass::Retry("transaction conflict")
        );
        assert_eq!(
            classify_code(Some("ConditionalCheckFailedException"), None),
            ErrorClass::Conditional
        );
        assert!(
            matches!(classify_code(Some("ValidationException"), Some("too big")), ErrorClass::Poison(m) if m.contains("too big"))
        );
        assert!(matches!(
            classify_code(Some("ResourceNotFoundException"), None),
            ErrorClass::Fatal(_)
        ));
        assert_eq!(
            classify_code(Some("InternalServerError"), None),
            ErrorClass::Retry("server error")
        );
    }

    #[test]
    fn a_connection_closed_mid_request_is_retried() {
        use aws_smithy_runtime_api::client::result::ConnectorError;
        use aws_smithy_types::retry::ErrorKind;
        let closed: SdkError<aws_sdk_dynamodb::operation::get_item::GetItemError, ()> =
            SdkError::dispatch_failure(ConnectorError::other(
                "connection closed before message completed".into(),
                Some(ErrorKind::TransientError),
            ));
        assert_eq!(classify(&closed), ErrorClass::Retry("network"));
        let other: SdkError<aws_sdk_dynamodb::operation::get_item::GetItemError, ()> =
            SdkError::dispatch_failure(ConnectorError::other("bad TLS setup".into(), None));
        assert!(matches!(classify(&other), ErrorClass::Fatal(_)));
    }

    // Real time: the backoff crate measures elapsed time with the system
    // clock, which a paused tokio clock does not move.
    #[tokio::test]
    async fn retries_are_bounded_and_counted() {
        let retries = AtomicU64::new(0);
        let result: Result<(), WriteError> =
            with_retries("test", Duration::from_millis(1500), &retries, || async {
                Err((ErrorClass::Retry("throttled"), "slow down".to_string()))
            })
            .await;
        assert!(matches!(result, Err(WriteError::Transient(m)) if m.contains("throttled")));
        let n = retries.load(Ordering::Relaxed);
        assert!((3..40).contains(&n), "{n} retries");
    }

    #[tokio::test(start_paused = true)]
    async fn poison_is_not_retried() {
        let retries = AtomicU64::new(0);
        let result: Result<(), WriteError> =
            with_retries("test", Duration::from_secs(5), &retries, || async {
                Err((ErrorClass::Poison("bad".into()), "bad".to_string()))
            })
            .await;
        assert_eq!(result, Err(WriteError::Poison("bad".into())));
        assert_eq!(retries.load(Ordering::Relaxed), 0);
    }
}
