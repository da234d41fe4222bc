//! Read-your-writes: whether everything the spec derives from one source
//! item's **current** state is in place, and waiting until it is.
//!
//! One check reads, consistently and without writing:
//!
//! - the holds of the item: a record of it that could not be applied
//!   holds its later records back, so what they derive cannot come until
//!   the dead letter is redriven; the check answers [`Status::Held`] with
//!   the letters at once;
//! - the item as it is now: its index keys, and its memberships (inverse
//!   edges and their copies, counter markers and records) as a backfill
//!   plans them, checked as the audit checks them; for a deleted item,
//!   the memberships its key names must be gone;
//! - the targets it may move (`denormalize`, `rollup`, `aggregate`),
//!   whether it counts for them now or did before (a `when` just turned,
//!   a delete): each against what its recompute reads now.
//!
//! What it does not see: a custom projection's effects; records of the
//! item still in flight whose older states the current one equals again
//! (A, B, A: the worker may still apply B's effects, then A's again); a
//! spec other than the worker's. Counter totals are sums over shards that
//! many sources move; an item's part in them is its marker and records.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::apply::DeadLetter;
use crate::apply::{Applier, ApplyError};
use crate::plan::{plan_record, Op};
use crate::record::{ChangeKind, ChangeRecord, Item, ItemKey};
use crate::spec::ProjectionId;

/// An effect of the item's current state not in place yet.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Pending {
    /// The projection.
    pub projection: String,
    /// The item it writes (`PK / SK`).
    pub item: String,
    /// What is missing or stale there.
    pub detail: String,
}

/// What one check found.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Status {
    /// Everything is in place.
    Projected,
    /// These effects are not in place yet.
    Pending {
        /// The effects.
        pending: Vec<Pending>,
    },
    /// A record of the item could not be applied: what follows waits for
    /// a redrive (`ddb-projector dlq redrive`).
    Held {
        /// The item's dead letters: projection and error.
        letters: Vec<(String, String)>,
    },
}

/// How [`wait`] polls.
#[derive(Debug, Clone)]
pub struct WaitOptions {
    /// When to give up.
    pub timeout: Duration,
    /// The first pause between checks; it doubles up to 500 ms.
    pub poll: Duration,
}

impl Default for WaitOptions {
    fn default() -> Self {
        WaitOptions {
            timeout: Duration::from_secs(5),
            poll: Duration::from_millis(20),
        }
    }
}

/// What `wait` ended with, and after how many checks.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Waited {
    /// The last check's answer: [`Status::Projected`], or what was still
    /// pending at the timeout, or the hold.
    #[serde(flatten)]
    pub status: Status,
    /// Checks made.
    pub checks: u32,
    /// Time waited, in milliseconds.
    pub waited_ms: u64,
}

/// Checks once whether everything the spec derives from the item at
/// `key`, as it is now, is in place (see the module docs).
pub async fn check(applier: &Applier, key: &ItemKey) -> Result<Status, ApplyError> {
    let spec = applier.spec();
    let fatal = |what: &str, error: crate::dynamo::retry::WriteError| ApplyError::Fatal {
        table: applier.table().to_string(),
        message: format!("{what}: {error}"),
    };
    // Held: at once, naming the letters.
    let store = applier.dead_letter_store();
    let candidates: HashSet<(String, ItemKey)> = spec
        .projections
        .iter()
        .map(|p| p.name.clone())
        .chain([applier.whole_record()])
        .map(|name| (name, key.clone()))
        .collect();
    let held = store
        .held(&candidates, applier.config().max_retry_time)
        .await
        .map_err(|e| fatal("reading the holds", e))?;
    if !held.is_empty() {
        let letters: Vec<DeadLetter> = store
            .list()
            .await
            .map_err(|e| fatal("reading the dead letters", e))?
            .into_iter()
            .filter(|letter| letter.source_key.as_ref() == Some(key))
            .collect();
        let mut named: Vec<(String, String)> = letters
            .into_iter()
            .map(|l| (l.projection, l.error))
            .collect();
        if named.is_empty() {
            // A hold whose letters a redrive has just removed: released
            // next, and the item projected; asked again.
            return Ok(Status::Pending {
                pending: held
                    .into_iter()
                    .map(|(projection, _)| Pending {
                        projection,
                        item: key.to_string(),
                        detail: "held, its letters redriven: the hold is being released"
                            .to_string(),
                    })
                    .collect(),
            });
        }
        named.sort();
        named.dedup();
        return Ok(Status::Held { letters: named });
    }
    // The current state, as a record deriving it: the item as a scan
    // reads it, or its removal.
    let record = applier
        .current_state_record(0, None, None, &serde_json::Value::Null, key)
        .await
        .map_err(|e| fatal("reading the item", e))?
        .map_err(|problem| ApplyError::Fatal {
            table: applier.table().to_string(),
            message: problem.reason,
        })?;
    let reader = applier.reader();
    let mut findings = Vec::new();
    let image = record.new_image.as_ref().map(|image| image.to_item());

    // Its index keys.
    if let Some(item) = &image {
        if let Some(entity) = spec.match_entity(&key.pk, key.sk.as_deref(), &mut Vec::new()) {
            super::derive::on_items(spec, &[(entity, key.clone(), item.clone())], &mut findings);
        }
    }

    // Its memberships (inverse edges and their copies, counter markers
    // and records): for a deleted item, those its key names, gone.
    let effects: Vec<_> = plan_record(spec, &record, None)
        .effects
        .into_iter()
        .filter(|effect| crate::apply::marker_change(spec, effect).is_some())
        .collect();
    let wanted: Vec<ItemKey> = effects
        .iter()
        .flat_map(|effect| super::derive::marker_reads(spec, effect))
        .collect();
    let mut read = reader
        .items(wanted.iter().collect())
        .await
        .map_err(|e| fatal("reading the memberships", e))?;
    if let Some(item) = &image {
        read.insert(key.clone(), item.clone());
    }
    let by_key: HashMap<&ItemKey, &Item> = read.iter().collect();
    for effect in effects {
        super::derive::check_marker(spec, &by_key, effect, &mut findings);
    }

    // The targets it may move (`denormalize`, `rollup`, `aggregate`),
    // whether it counts for them now or did before: planned as a change
    // from a state unknown, which might have counted. Each against what
    // its recompute reads now; a target that does not exist gets nothing.
    let unknown_before = ChangeRecord {
        kind: if image.is_some() {
            ChangeKind::Modify
        } else {
            ChangeKind::Remove
        },
        old_image: None,
        ..record.clone()
    };
    let mut targets: Vec<(ProjectionId, ItemKey, crate::plan::Sources)> = Vec::new();
    for effect in plan_record(spec, &unknown_before, None).effects {
        if let Op::Recompute { target, sources } = effect.op {
            if !targets
                .iter()
                .any(|(id, t, _)| *id == effect.projection && *t == target)
            {
                targets.push((effect.projection, target, sources));
            }
        }
    }
    let items = reader
        .items(targets.iter().map(|(_, target, _)| target).collect())
        .await
        .map_err(|e| fatal("reading the targets", e))?;
    for (id, target, sources) in &targets {
        let Some(item) = items.get(target) else {
            continue;
        };
        let sources = reader
            .recompute_sources(*id, target, sources)
            .await
            .map_err(|e| fatal("reading a target's sources", e))?;
        findings.extend(super::derive::target(spec, *id, target, item, &sources));
    }
    let pending: Vec<Pending> = findings
        .into_iter()
        .filter(|f| spec.projection_id(&f.rule).is_some())
        .map(|f| Pending {
            projection: f.rule,
            item: f.key,
            detail: if f.detail.is_empty() {
                f.problem.label()
            } else {
                format!("{}: {}", f.problem.label(), f.detail)
            },
        })
        .collect();
    Ok(if pending.is_empty() {
        Status::Projected
    } else {
        Status::Pending { pending }
    })
}

/// Checks until everything is in place, a hold is found, or `options`'
/// timeout passes; answers the last check.
pub async fn wait(
    applier: &Applier,
    key: &ItemKey,
    options: &WaitOptions,
) -> Result<Waited, ApplyError> {
    let started = Instant::now();
    let mut pause = options.poll;
    let mut checks = 0;
    loop {
        checks += 1;
        let status = check(applier, key).await?;
        let done = !matches!(status, Status::Pending { .. });
        if done || started.elapsed() + pause > options.timeout {
            metrics::histogram!("projector_wait_seconds").record(started.elapsed().as_secs_f64());
            return Ok(Waited {
                status,
                checks,
                waited_ms: started.elapsed().as_millis() as u64,
            });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}
