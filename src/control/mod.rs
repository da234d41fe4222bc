//! The control plane: the projection lifecycle (which definitions of each
//! projection wrote the derived data in the table, whether a backfill
//! brought all of it to the spec's definition, and what a deploy needs
//! next), the leases every writer holds, and where counters are laid out.
//!
//! It sits above the applier, which asks it for leases through
//! [`crate::apply::Control`] ([`applier`] builds both). Its rooms, each
//! using only those before it:
//!
//! - `status`: the pure state machine, the records and [`states`] (no I/O);
//! - `registry`: the [`Registry`]'s reads and writes of its items;
//! - `layout`: counter generations ([`Registry::layout`],
//!   [`current_layout`]) and `leases`: [`Leases`], [`ApplierControl`];
//! - `runs`: the pointer to each long job's last run, which `--resume`
//!   continues ([`Runs`]);
//! - this face, and `backfill`: the lifecycle backfill's choice of what to
//!   backfill under which run ([`choose_projections`], [`claim_run`]).
//!
//! Everything is kept in the table, under the reserved partition
//! `_ddbp#lifecycle` (tables without a sort key: `_ddbp#lifecycle#<sk>`):
//!
//! - **Leases** (sort key `leases`, one item). Every process that writes
//!   derived data (the Lambda, the runner, `backfill`, `replay`, `dlq
//!   redrive`, `recover`) first takes a lease for each projection it writes
//!   and the fingerprint of the definition it writes it with:
//!   `w#<fingerprint>#<projection>` holds the time (ms) until which it may
//!   write. A stream consumer (the Lambda, the runner) also writes
//!   `c#…` (the same time), `s#…` (when one first ran it), and for its
//!   spec `C#<fp>`, `S#<fp>` and `N#<fp>` (its lease, first run and
//!   projection names; `<fp>@<consumer>` for a named consumer): a
//!   consumer without a projection leaves that projection's changes
//!   unprojected, which [`states`] reads as a definition `-` of it. A
//!   writer renews its lease before a batch that could
//!   outlast it, so a batch needs no request of its own
//!   ([`Leases::ensure`]); it never writes past its lease.
//! - **Projection records** (sort key `p#<projection>`): the backfill under
//!   way (`claimRun`, `claimFp`, `claimFromMs`) and the last complete one
//!   (`doneRun`, `doneFp`, `doneFromMs`, `doneAtMs`).
//! - **Spec texts** (sort key `spec#<fingerprint of the spec>`): the spec a
//!   lease's definition came from (`d#…` names it), so that `prune` can
//!   remove what a projection that no spec file has any more derived.
//!
//! **Architecture Invariant:** a projection is *live* only when a backfill
//! of its definition `f` completed, a stream consumer runs `f`, and no
//! lease of any other definition (nor of a consumer without it) lasted
//! past the instant the backfill started. Every item's derived data was
//! then written by `f`: the backfill brought each item to `f` after every
//! other writer had stopped, and only writers of `f` wrote since. `status`
//! computes this from the leases at every call ([`states`]), so a writer of
//! another definition that runs later (a rollback, a stale environment, a
//! redrive with an old spec file) turns the projection back from live at
//! once; nothing has to remember to clear a flag.

mod backfill;
mod layout;
mod leases;
mod register;
mod registry;
mod runs;
mod services;
mod status;

use std::sync::Arc;

pub use crate::dynamo::time::iso;
pub use backfill::{
    choose_projections, claim_run, open_letters, BackfillChoice, BackfillError, LettersError,
};
pub use layout::{current_layout, layout_refusals, relaid, CounterLayout, OldVersion};
pub use leases::{ApplierControl, GaveBack, Leases};
pub use register::{
    admit, empty_spec, register, Change, Planned, PlannedProjection, RegisterError, Stored,
};
pub use registry::{ClaimOutcome, Completion, Registry, LEASES_VERSION};
pub use runs::{check_run_name, Chosen, Job, JobRun, LastRun, Runs};
pub use services::{
    check_service_name, compose_texts, Registered, Registration, Registrations, Stamp, Written,
    MAX_SPEC_BYTES,
};
pub use status::{
    hex, states, Applied, BackfillRun, Commands, ConsumerSpec, Definition, ProjectionStatus,
    ReadVersion, Record, Snapshot, State, WITHOUT,
};

use crate::apply::{Applier, ApplyConfig};
use crate::spec::Spec;

/// A command's compiled spec, laid out on its table, and its AWS clients.
#[derive(Clone)]
pub struct Connection {
    /// The compiled spec, laid out: changed counters built beside the
    /// version readers read ([`Registry::layout`]).
    pub spec: Arc<Spec>,
    /// The spec as the file has it.
    pub file_spec: Arc<Spec>,
    /// The table name (`--table` or the spec's).
    pub table: String,
    /// The SDK configuration.
    pub config: aws_config::SdkConfig,
    /// DynamoDB.
    pub dynamodb: aws_sdk_dynamodb::Client,
    /// `--consumer`.
    pub consumer: Option<String>,
    /// The table's registry version the spec was composed from, when it
    /// is what the table has registered (no spec file): workers watch it
    /// and serve each new registration.
    pub registered: Option<Stamp>,
}

impl Connection {
    /// The applier settings of a command: the defaults, for its consumer.
    pub fn apply_config(&self) -> ApplyConfig {
        ApplyConfig {
            consumer: self.consumer.clone(),
            ..ApplyConfig::default()
        }
    }

    /// An applier of the laid-out spec with [`Connection::apply_config`].
    pub fn applier(&self) -> Applier {
        applier(
            self.dynamodb.clone(),
            self.spec.clone(),
            &self.table,
            self.apply_config(),
        )
    }

    /// The lifecycle registry of the table.
    pub fn registry(&self) -> Registry {
        Registry::new(self.dynamodb.clone(), &self.table, &self.spec.table)
    }

    /// The same connection with the spec laid out again (a counter's
    /// versions may have moved since).
    pub async fn laid_out_again(&self) -> anyhow::Result<Connection> {
        let (laid, _) = self
            .registry()
            .layout(&self.file_spec)
            .await
            .map_err(|error| anyhow::anyhow!("{error}"))?;
        Ok(Connection {
            spec: Arc::new(laid),
            ..self.clone()
        })
    }

    /// The region the SDK configuration names (empty when none).
    pub fn region(&self) -> String {
        self.config
            .region()
            .map(|r| r.to_string())
            .unwrap_or_default()
    }
}

/// Loads the AWS configuration and lays `spec` out on `table`: a changed
/// counter is built beside the version readers read, which every writer
/// keeps current meanwhile (see [`Registry::layout`]).
pub async fn connect(
    spec: Spec,
    table: String,
    consumer: Option<String>,
) -> anyhow::Result<Connection> {
    let config = crate::dynamo::client::load_config().await?;
    let dynamodb = crate::dynamo::client::dynamodb(&config);
    connect_with(spec, table, consumer, config, dynamodb).await
}

/// [`connect`], with an SDK configuration of the caller's.
pub async fn connect_with(
    spec: Spec,
    table: String,
    consumer: Option<String>,
    config: aws_config::SdkConfig,
    dynamodb: aws_sdk_dynamodb::Client,
) -> anyhow::Result<Connection> {
    let registry = Registry::new(dynamodb.clone(), &table, &spec.table);
    let (laid, _) = registry
        .layout(&spec)
        .await
        .map_err(|error| anyhow::anyhow!("{error}"))?;
    Ok(Connection {
        spec: Arc::new(laid),
        file_spec: Arc::new(spec),
        table,
        config,
        dynamodb,
        consumer,
        registered: None,
    })
}

/// Connects to `table` with the specs registered for it composed into one
/// (see [`Registrations`]; a table nothing is registered for gets a spec
/// of its keys alone, projecting nothing), laid out as [`connect`] does.
pub async fn connect_registered(
    table: String,
    consumer: Option<String>,
) -> anyhow::Result<Connection> {
    if let Some(consumer) = &consumer {
        anyhow::bail!(
            "registrations are served by the table's unnamed consumer; consumer `{consumer}` runs a spec file (--spec)"
        );
    }
    let config = crate::dynamo::client::load_config().await?;
    let dynamodb = crate::dynamo::client::dynamodb(&config);
    connect_registered_with(table, config, dynamodb).await
}

/// [`connect_registered`] for the unnamed consumer, with an SDK
/// configuration and a DynamoDB client of the caller's.
pub async fn connect_registered_with(
    table: String,
    config: aws_config::SdkConfig,
    dynamodb: aws_sdk_dynamodb::Client,
) -> anyhow::Result<Connection> {
    let (spec, stamp) = registered_spec(&dynamodb, &table).await?;
    let mut c = connect_with(spec, table, None, config, dynamodb).await?;
    c.registered = Some(stamp);
    Ok(c)
}

/// How often a worker serving the registry reads its version
/// (`PROJECTOR_REGISTRY_POLL_SECONDS`, default 10): a registration is
/// served within this, well within one lease period.
pub fn registry_poll() -> std::time::Duration {
    std::env::var("PROJECTOR_REGISTRY_POLL_SECONDS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0 && s.is_finite())
        .map_or(
            std::time::Duration::from_secs(10),
            std::time::Duration::from_secs_f64,
        )
}

/// Waits until what `table` has registered moves past `served`, then
/// returns the new registration composed and laid out: (laid out, (its
/// stamp, composed)). A registration that cannot be read whole now is
/// read again at the next poll; one that does not compose (a newer
/// binary's rules, say) or that conflicts with another consumer's spec
/// is logged and waited past: the worker keeps serving the last one.
pub async fn next_registration(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    served: &Stamp,
) -> (Spec, Option<(Stamp, Spec)>) {
    let mut refused: Option<Stamp> = None;
    let mut registrations: Option<Registrations> = None;
    loop {
        tokio::time::sleep(registry_poll()).await;
        if registrations.is_none() {
            match Registrations::of_table(client, table).await {
                Ok(found) => registrations = Some(found),
                Err(error) => {
                    tracing::warn!(
                        error = format!("{error:#}"),
                        table,
                        "describing the table failed: serving the last registration"
                    );
                    continue;
                }
            }
        }
        let r = registrations.as_ref().expect("set above");
        match r.stamp().await {
            Ok(stamp) if &stamp != served && Some(&stamp) != refused.as_ref() => {}
            Ok(_) => continue,
            Err(error) => {
                tracing::warn!(%error, table, "reading the registry failed: serving the last registration");
                continue;
            }
        }
        let registered = match r.read().await {
            Ok(registered) => registered,
            Err(error) => {
                tracing::warn!(%error, table, "reading the registrations failed: serving the last one, reading again at the next poll");
                continue;
            }
        };
        let spec = match registered.spec(table, r.keys()) {
            Ok(spec) => spec,
            Err(errors) => {
                tracing::error!(
                    %errors,
                    table,
                    registry_version = registered.version,
                    "the registered specs do not compose: serving the last ones that did"
                );
                refused = Some(registered.stamp);
                continue;
            }
        };
        let registry = Registry::new(client.clone(), table, &spec.table);
        let laid = match registry.layout(&spec).await {
            Ok((laid, _)) => laid,
            Err(error) => {
                tracing::warn!(%error, table, "laying the new registration out failed: trying again");
                continue;
            }
        };
        match registry.consumer_conflicts(&laid, None).await {
            Ok(conflicts) if conflicts.is_empty() => {}
            Ok(conflicts) => {
                tracing::error!(
                    table,
                    registry_version = registered.version,
                    "the registered specs conflict with another consumer's: serving the last ones\n{}",
                    conflicts.join("\n")
                );
                refused = Some(registered.stamp);
                continue;
            }
            Err(error) => {
                tracing::warn!(%error, table, "reading the other consumers' specs failed: trying again");
                continue;
            }
        }
        return (laid, Some((registered.stamp, spec)));
    }
}

/// The spec registered for `table` now, composed, and the stamp of what
/// it was composed from.
pub async fn registered_spec(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
) -> anyhow::Result<(Spec, Stamp)> {
    let registrations = Registrations::of_table(client, table).await?;
    let registered = registrations.read().await?;
    match registered.spec(table, registrations.keys()) {
        Ok(spec) => Ok((spec, registered.stamp)),
        Err(errors) => anyhow::bail!(
            "the specs registered for table `{table}` (registry version {}) do not compose:\n{errors}",
            registered.version
        ),
    }
}

/// An applier writing to `table` with the rules of `spec`, under this
/// process's leases for its table, spec and role ([`ApplierControl`]).
pub fn applier(
    client: aws_sdk_dynamodb::Client,
    spec: Arc<Spec>,
    table: &str,
    config: ApplyConfig,
) -> Applier {
    let control = ApplierControl::new(&client, table, &spec, &config);
    Applier::new(client, spec, table, config, Arc::new(control))
}

/// An applier consuming `table`'s stream for the whole spec (see
/// [`ApplyConfig::stream_consumer`]): its leases also say that it runs
/// the definitions.
pub fn stream_consumer(
    client: aws_sdk_dynamodb::Client,
    spec: Arc<Spec>,
    table: &str,
    config: ApplyConfig,
) -> Applier {
    let config = ApplyConfig {
        stream_consumer: true,
        ..config
    };
    applier(client, spec, table, config)
}

/// What `status` reports of a table: each projection's state, the open
/// dead letters and the recorded violations.
#[derive(Debug)]
pub struct StatusReport {
    /// Each projection of the spec, and the retired ones the registry
    /// knows, with its dead letters and last change applied.
    pub rows: Vec<ProjectionStatus>,
    /// Open dead letters of whole records (undecodable).
    pub whole_record_letters: usize,
    /// The recorded violations of each invariant of the spec.
    pub violations: std::collections::BTreeMap<String, usize>,
}

impl StatusReport {
    /// How many projections are live.
    pub fn live(&self) -> usize {
        self.rows.iter().filter(|r| r.state == State::Live).count()
    }

    /// Whether every projection is live.
    pub fn all_live(&self) -> bool {
        self.live() == self.rows.len()
    }
}

/// Where each projection of `c`'s spec is in its life (see [`states`]),
/// `commands` saying how to write what it needs next.
pub async fn status(c: &Connection, commands: &Commands) -> anyhow::Result<StatusReport> {
    crate::dynamo::client::describe_table(&c.dynamodb, &c.table).await?;
    let registry = c.registry();
    let snapshot = registry.snapshot(&c.spec).await?;
    let applier = c.applier();
    let by_projection = open_letters(&applier).await?;
    let mut rows = states(
        &c.spec,
        &snapshot,
        crate::dynamo::time::now_ms(),
        registry.skew_ms(),
        &by_projection,
        commands,
    );
    let applied = registry.applied().await?;
    for row in &mut rows {
        row.dead_letters = by_projection.get(&row.name).copied().unwrap_or(0);
        row.applied = applied.get(&row.name).copied();
    }
    let whole_record_letters = by_projection
        .get(&applier.whole_record())
        .copied()
        .unwrap_or(0);
    let mut violations: std::collections::BTreeMap<String, usize> = c
        .spec
        .invariants
        .iter()
        .map(|i| (i.name.clone(), 0))
        .collect();
    for v in &applier.recorded_violations().await? {
        *violations.entry(v.invariant.clone()).or_default() += 1;
    }
    Ok(StatusReport {
        rows,
        whole_record_letters,
        violations,
    })
}
