//! Error classification and retries, in one place.
//!
//! Retry decisions are data ([`ErrorClass`]); every SDK error goes through
//! [`classify`]. Throttling, 5xx, timeouts and transaction conflicts are
//! retried with exponential, jittered, bounded backoff; a failed condition
//! is an answer to interpret, and a validation error marks a poison record.
//!
//! Every wait between two tries of the crate is decided here, by a named
//! policy: [`policy`] for the applier's writes and reads (through
//! [`with_retries`]), [`slow_policy`] for the stream and recovery loops
//! (through a [`Retrier`], or [`UntilStopped`] for loops that only a stop
//! ends), and a [`Schedule`] for the short, bounded loops
//! ([`REGISTRY_CONTENTION`], [`LAYOUT_READS`], [`PROGRESS_WRITES`],
//! [`SCAN_PAGES`], [`PRUNE_TRANSACTIONS`], [`UNPROCESSED_RETRIES`]).
//! [`retry_request`] is the loop of one request retried while its error's
//! class is [`ErrorClass::Retry`].

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use backoff::backoff::Backoff;
use backoff::ExponentialBackoff;
use tokio::sync::watch;

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

/// Whether a request failed on its condition.
pub fn is_condition_failure(error: &impl ProvideErrorMetadata) -> bool {
    error.code() == Some("ConditionalCheckFailedException")
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

/// How long the stream's own requests (listing a stream's shards, reading
/// a failed range again to recover it) are retried before they give up.
pub const STREAM_REQUEST_TIME: Duration = Duration::from_secs(60);

/// How the waits of a [`Schedule`] grow from one retry to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Growth {
    /// `first`, then twice the last wait, up to `max`.
    Doubling,
    /// `first` times the retry's number, up to `max`.
    Linear,
}

/// A short, bounded series of waits without jitter, for loops that try a
/// few times and then give up (or report what is left).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// How many retries the series allows.
    pub retries: u32,
    /// The wait before the first retry.
    pub first: Duration,
    /// The longest wait.
    pub max: Duration,
    /// How the waits grow.
    pub growth: Growth,
}

impl Schedule {
    /// The wait before retry number `retry` (from 1).
    pub fn wait(&self, retry: u32) -> Duration {
        let grown = match self.growth {
            Growth::Doubling => self
                .first
                .saturating_mul(1u32 << retry.saturating_sub(1).min(20)),
            Growth::Linear => self.first.saturating_mul(retry),
        };
        grown.min(self.max)
    }
}

/// The registry's contention: a backfill's completion fenced by the leases
/// (a lease taken, or a renewal conflicting with the transaction) reads the
/// registry again and retries, up to 50 times, from 10 ms doubling to 320 ms.
pub const REGISTRY_CONTENTION: Schedule = Schedule {
    retries: 50,
    first: Duration::from_millis(10),
    max: Duration::from_millis(320),
    growth: Growth::Doubling,
};

/// A long-running process's read of the counters' layout, whose errors are
/// not classified: 4 retries, 25 ms doubling to 200 ms.
pub const LAYOUT_READS: Schedule = Schedule {
    retries: 4,
    first: Duration::from_millis(25),
    max: Duration::from_millis(200),
    growth: Growth::Doubling,
};

/// A backfill's progress write, whatever its error: 8 retries, 100 ms
/// doubling to 12.8 s.
pub const PROGRESS_WRITES: Schedule = Schedule {
    retries: 8,
    first: Duration::from_millis(100),
    max: Duration::from_millis(12_800),
    growth: Growth::Doubling,
};

/// A backfill's scan page, while its error's class is
/// [`ErrorClass::Retry`]: 10 retries, 50 ms doubling to 1.6 s.
pub const SCAN_PAGES: Schedule = Schedule {
    retries: 10,
    first: Duration::from_millis(50),
    max: Duration::from_millis(1_600),
    growth: Growth::Doubling,
};

/// A prune's transaction cancelled for a reason other than its own
/// condition (a conflict with a worker moving the same shards,
/// throttling): 9 retries, 100 ms doubling to 3.2 s.
pub const PRUNE_TRANSACTIONS: Schedule = Schedule {
    retries: 9,
    first: Duration::from_millis(100),
    max: Duration::from_millis(3_200),
    growth: Growth::Doubling,
};

/// The pause before asking again for what a batch request
/// (`BatchGetItem`, `BatchWriteItem`) left unprocessed.
pub const UNPROCESSED_PAUSE: Duration = Duration::from_millis(50);

/// A bounded read of keys that DynamoDB keeps leaving unprocessed (a
/// counter's shards, the holds of a batch): 10 retries, 50 ms more each
/// time.
pub const UNPROCESSED_RETRIES: Schedule = Schedule {
    retries: 10,
    first: UNPROCESSED_PAUSE,
    max: Duration::from_millis(500),
    growth: Growth::Linear,
};

/// Waits [`UNPROCESSED_PAUSE`] before a batch request asks again for its
/// unprocessed keys or items (its loop has no limit: each answer makes
/// progress).
pub async fn wait_for_unprocessed() {
    tokio::time::sleep(UNPROCESSED_PAUSE).await;
}

/// The waits of one retry loop: how long before the next try, and when to
/// stop trying.
#[derive(Debug)]
pub struct Retrier {
    waits: Waits,
    deadline: Option<tokio::time::Instant>,
}

#[derive(Debug)]
enum Waits {
    /// An exponential, jittered policy ([`policy`], [`slow_policy`]).
    Policy(ExponentialBackoff),
    /// A [`Schedule`] and the retries taken from it.
    Schedule { schedule: Schedule, taken: u32 },
}

impl Retrier {
    /// Waits as `policy` says.
    pub fn new(policy: ExponentialBackoff) -> Retrier {
        Retrier {
            waits: Waits::Policy(policy),
            deadline: None,
        }
    }

    /// Waits of a slow loop ([`slow_policy`]), `max_elapsed` in all.
    pub fn slow(max_elapsed: Option<Duration>) -> Retrier {
        Retrier::new(slow_policy(max_elapsed))
    }

    /// Waits as `schedule` says.
    pub fn scheduled(schedule: Schedule) -> Retrier {
        Retrier {
            waits: Waits::Schedule { schedule, taken: 0 },
            deadline: None,
        }
    }

    /// Also gives up on a wait that would end at or after `deadline`.
    pub fn until(mut self, deadline: tokio::time::Instant) -> Retrier {
        self.deadline = Some(deadline);
        self
    }

    /// The wait before the next try, or `None` when the loop should give up.
    pub fn next_wait(&mut self) -> Option<Duration> {
        let wait = match &mut self.waits {
            Waits::Policy(policy) => policy.next_backoff()?,
            Waits::Schedule { schedule, taken } => {
                if *taken >= schedule.retries {
                    return None;
                }
                *taken += 1;
                schedule.wait(*taken)
            }
        };
        match self.deadline {
            Some(deadline) if tokio::time::Instant::now() + wait >= deadline => None,
            _ => Some(wait),
        }
    }

    /// Whether a schedule's retries are all taken (a policy's never are:
    /// only its [`Retrier::next_wait`] can tell).
    pub fn is_spent(&self) -> bool {
        match &self.waits {
            Waits::Policy(_) => false,
            Waits::Schedule { schedule, taken } => *taken >= schedule.retries,
        }
    }

    /// Waits before the next try, telling `notify` the wait first (to log
    /// and count the retry); `false`, at once, when the loop should give up.
    pub async fn wait(&mut self, notify: impl FnOnce(Duration)) -> bool {
        match self.next_wait() {
            Some(wait) => {
                notify(wait);
                tokio::time::sleep(wait).await;
                true
            }
            None => false,
        }
    }

    /// Starts over: the next wait is the first again, with the whole time
    /// allowed.
    pub fn reset(&mut self) {
        match &mut self.waits {
            Waits::Policy(policy) => policy.reset(),
            Waits::Schedule { taken, .. } => *taken = 0,
        }
    }
}

/// The waits of a loop that retries until it succeeds or is stopped (a
/// stream shard's reads and applies, its iterators): [`slow_policy`]
/// without a limit, never more than [`SLOW_MAX_WAIT`].
#[derive(Debug)]
pub struct UntilStopped(ExponentialBackoff);

impl Default for UntilStopped {
    fn default() -> UntilStopped {
        UntilStopped(slow_policy(None))
    }
}

impl UntilStopped {
    /// Waits from the first.
    pub fn new() -> UntilStopped {
        UntilStopped::default()
    }

    /// The wait before the next try.
    pub fn next_wait(&mut self) -> Duration {
        self.0.next_backoff().unwrap_or(SLOW_MAX_WAIT)
    }

    /// Waits before the next try unless asked to stop, telling `notify`
    /// the wait first; returns whether it was asked to stop.
    pub async fn wait_or_stop(
        &mut self,
        stop: &mut watch::Receiver<bool>,
        notify: impl FnOnce(Duration),
    ) -> bool {
        let wait = self.next_wait();
        notify(wait);
        sleep_or_stop(stop, wait).await
    }

    /// Starts over from the first wait (after a success).
    pub fn reset(&mut self) {
        self.0.reset();
    }
}

/// Sleeps unless asked to stop; returns whether it was.
pub async fn sleep_or_stop(stop: &mut watch::Receiver<bool>, wait: Duration) -> bool {
    if *stop.borrow() {
        return true;
    }
    tokio::select! {
        () = tokio::time::sleep(wait) => false,
        changed = stop.changed() => changed.is_err() || *stop.borrow(),
    }
}

/// Sends a request until it succeeds, again while its error's class is
/// [`ErrorClass::Retry`] and `retrier` has a wait left; `notify` hears of
/// each retry (its reason, the error and the wait) before the wait. The
/// last error comes back with its class.
pub async fn retry_request<T, E, R, F, Fut>(
    retrier: &mut Retrier,
    send: F,
    notify: impl FnMut(&'static str, &SdkError<E, R>, Duration),
) -> Result<T, (ErrorClass, SdkError<E, R>)>
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, SdkError<E, R>>>,
{
    retry_request_unless(retrier, |_| false, send, notify).await
}

/// [`retry_request`], except that an error `answered` picks out is never
/// retried: the caller answers it itself (a trimmed stream range, whose
/// records are gone, is an answer however the SDK classifies it).
pub async fn retry_request_unless<T, E, R, F, Fut>(
    retrier: &mut Retrier,
    answered: impl Fn(&SdkError<E, R>) -> bool,
    mut send: F,
    mut notify: impl FnMut(&'static str, &SdkError<E, R>, Duration),
) -> Result<T, (ErrorClass, SdkError<E, R>)>
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, SdkError<E, R>>>,
{
    loop {
        let error = match send().await {
            Ok(value) => return Ok(value),
            Err(error) => error,
        };
        let class = classify(&error);
        if let ErrorClass::Retry(reason) = class {
            if !answered(&error) && retrier.wait(|wait| notify(reason, &error, wait)).await {
                continue;
            }
        }
        return Err((class, error));
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

    /// The schedules wait exactly what the loops they replaced waited.
    #[test]
    fn schedules_wait_as_the_loops_they_name() {
        let waits = |schedule: Schedule| -> Vec<u64> {
            let mut retrier = Retrier::scheduled(schedule);
            std::iter::from_fn(|| retrier.next_wait())
                .map(|wait| wait.as_millis() as u64)
                .collect()
        };
        let contention: Vec<u64> = (1..=50u64).map(|n| 5 << n.min(6)).collect();
        assert_eq!(waits(REGISTRY_CONTENTION), contention);
        assert_eq!(
            waits(LAYOUT_READS),
            (0..4u64).map(|n| 25 << n).collect::<Vec<_>>()
        );
        assert_eq!(
            waits(PROGRESS_WRITES),
            (1..=8u64).map(|n| 50 << n).collect::<Vec<_>>()
        );
        assert_eq!(
            waits(SCAN_PAGES),
            (1..=10u64).map(|n| 25 << n.min(6)).collect::<Vec<_>>()
        );
        assert_eq!(
            waits(PRUNE_TRANSACTIONS),
            (1..=9u64).map(|n| 50 << n.min(6)).collect::<Vec<_>>()
        );
        assert_eq!(
            waits(UNPROCESSED_RETRIES),
            (1..=10u64).map(|n| 50 * n).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_spent_schedule_starts_over_when_reset() {
        let mut retrier = Retrier::scheduled(LAYOUT_READS);
        while retrier.next_wait().is_some() {}
        assert!(retrier.is_spent());
        retrier.reset();
        assert!(!retrier.is_spent());
        assert_eq!(retrier.next_wait(), Some(Duration::from_millis(25)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_ends_the_waits() {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(100);
        let mut retrier = Retrier::scheduled(SCAN_PAGES).until(deadline);
        assert_eq!(retrier.next_wait(), Some(Duration::from_millis(50)));
        // 100 ms from now ends at the deadline: too late.
        assert_eq!(retrier.next_wait(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn requests_are_retried_while_their_class_is_retry() {
        type Error = SdkError<aws_sdk_dynamodb::operation::get_item::GetItemError, ()>;
        let throttled = || -> Error { SdkError::timeout_error("slow") };
        let mut sent = 0;
        let mut heard = Vec::new();
        let mut retrier = Retrier::scheduled(LAYOUT_READS);
        let result: Result<(), _> = retry_request(
            &mut retrier,
            || {
                sent += 1;
                async { Err(throttled()) }
            },
            |reason, _, wait| heard.push((reason, wait.as_millis())),
        )
        .await;
        assert!(matches!(result, Err((ErrorClass::Retry("timeout"), _))));
        assert_eq!(sent, 5);
        assert_eq!(
            heard,
            vec![
                ("timeout", 25),
                ("timeout", 50),
                ("timeout", 100),
                ("timeout", 200)
            ]
        );

        let mut sent = 0;
        let mut retrier = Retrier::scheduled(LAYOUT_READS);
        let result: Result<(), _> = retry_request_unless(
            &mut retrier,
            |_| true,
            || {
                sent += 1;
                async { Err(throttled()) }
            },
            |_, _, _| {},
        )
        .await;
        assert!(matches!(result, Err((ErrorClass::Retry(_), _))));
        assert_eq!(sent, 1, "an answered error is not retried");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_a_wait_until_stopped() {
        let (stop, mut stopped) = watch::channel(false);
        let mut waits = UntilStopped::new();
        assert!(!waits.wait_or_stop(&mut stopped, |_| {}).await);
        stop.send(true).expect("a receiver");
        let mut heard = None;
        assert!(
            waits
                .wait_or_stop(&mut stopped, |wait| heard = Some(wait))
                .await
        );
        assert!(heard.is_some_and(|wait| wait <= SLOW_MAX_WAIT));
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
