//! What the audit judges: each projection by the definition whose derived
//! data readers read.
//!
//! A projection whose data is not its definition's yet is not judged: a
//! *changed* one (another definition's data may be in the table; a changed
//! counter is built in a generation readers do not read yet) and one being
//! *backfilled*. Judging those by the spec's definition would call the
//! lifecycle's own gap drift, and a repair would write one definition's
//! values where another's are. They are reported apart, with the backfill
//! to run. A counter's old version (`<name>~<generation>`), which readers
//! read while the changed counter is rebuilt, is judged by its own
//! definition, as it is served.
//!
//! A *new* projection is judged (no other definition wrote where it
//! writes, so a repair writes its own values), and reported as new with
//! its backfill: what it finds on items written before it was deployed is
//! what that backfill writes.

use serde::{Deserialize, Serialize};

use super::Finding;
use crate::apply::{Applier, ApplyError};
use crate::control::{states, Commands, Registry, State};

/// A projection that is not live, as the audit read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotLive {
    /// The projection.
    pub projection: String,
    /// Its lifecycle state (`new`, `changed`, `backfilling`).
    pub state: String,
    /// Whether the audit judged it (a new one) or left it out.
    pub judged: bool,
    /// What makes it live, as `status` says it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// The projections an audit leaves out, read from the registry once per
/// audit (or per slice of one).
#[derive(Debug, Clone, Default)]
pub(crate) struct Judged {
    not_live: Vec<NotLive>,
}

impl Judged {
    /// Reads the lifecycle of `applier`'s spec.
    pub(crate) async fn read(applier: &Applier) -> Result<Judged, ApplyError> {
        let spec = applier.spec();
        let registry = Registry::new(applier.client().clone(), applier.table(), &spec.table)
            .with_skew(applier.config().clock_skew.as_millis() as u64);
        let snapshot = match registry.snapshot(spec).await {
            Ok(snapshot) => snapshot,
            // No table, no registry: the scan says so.
            Err(error) if error.to_string().contains("ResourceNotFound") => {
                return Ok(Judged::default())
            }
            Err(error) => return Err(error),
        };
        let commands = Commands {
            consumer: applier.config().consumer.clone(),
            ..Commands::default()
        };
        let rows = states(
            spec,
            &snapshot,
            crate::dynamo::time::now_ms(),
            registry.skew_ms(),
            &Default::default(),
            &commands,
        );
        let not_live = rows
            .into_iter()
            .filter(|row| spec.projection_id(&row.name).is_some())
            .filter(|row| matches!(row.state, State::New | State::Changed | State::Backfilling))
            .map(|row| NotLive {
                projection: row.name,
                state: row.state.as_str().to_string(),
                judged: row.state == State::New,
                next: row.next.map(|next| next.replace("  ", " ")),
            })
            .collect();
        Ok(Judged { not_live })
    }

    /// Whether the audit judges projection or invariant `rule`.
    pub(crate) fn judges(&self, rule: &str) -> bool {
        !self
            .not_live
            .iter()
            .any(|n| !n.judged && n.projection == rule)
    }

    /// Keeps the findings of what is judged: a finding of a projection
    /// left out stays when it changes the members of a counter that is
    /// judged (a reverse item of a changed edge that a live counter rides
    /// on: without its repair, recounting the counter would count it
    /// short). The fix a dropped finding carried for one marker moves to a
    /// kept finding of the same marker (only the first carries it).
    pub(crate) fn retain(&self, findings: &mut Vec<Finding>) {
        if !self.not_live.iter().any(|n| !n.judged) {
            return;
        }
        let kept = |finding: &Finding| {
            self.judges(&finding.rule) || finding.counters.iter().any(|c| self.judges(c))
        };
        let mut fixes: Vec<(String, super::Fix, Vec<String>)> = Vec::new();
        for finding in findings.iter_mut() {
            if !kept(finding) {
                if let Some(fix) = finding.fix.take() {
                    fixes.push((
                        finding.key.clone(),
                        fix,
                        std::mem::take(&mut finding.shards),
                    ));
                }
            }
        }
        findings.retain(|finding| kept(finding));
        for (key, fix, shards) in fixes {
            if let Some(finding) = findings
                .iter_mut()
                .find(|f| f.key == key && f.fix.is_none())
            {
                finding.fix = Some(fix);
                if finding.shards.is_empty() {
                    finding.shards = shards;
                }
            }
        }
    }

    /// What is not live, for the report.
    pub(crate) fn not_live(&self) -> Vec<NotLive> {
        self.not_live.clone()
    }
}
