//! Reading the table: segments scanned in parallel with progress, each
//! item classified into the snapshot the checks read.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use aws_sdk_dynamodb::types::{AttributeValue as Av, ReturnConsumedCapacity};

use super::sketch::{Group, Sketch};
use crate::apply::{Applier, ApplyError};
use crate::dynamo::names::{
    AUDIT_PK, CHANGES_ATTRIBUTE, COUNTER_MARKER_PREFIX, COUNT_ATTRIBUTE, RECORDS_ATTRIBUTE,
    RESERVED_PREFIX,
};
use crate::record::{Item, ItemKey};
use crate::spec::{ProjectionId, Spec};

/// The counter a shard partition key belongs to, and its values joined by
/// `#` (`COUNTER#followers#b#3` -> followers, `b`; `COUNTER#total#3` ->
/// total, nothing, for a counter without `of`).
pub(super) fn parse_shard(spec: &Spec, pk: &str) -> Option<(ProjectionId, String)> {
    let rest = pk.strip_prefix("COUNTER#")?;
    spec.counters().find_map(|(id, _, counter)| {
        let rest = rest
            .strip_prefix(counter.storage.as_str())?
            .strip_prefix('#')?;
        // A counter without `of` (one count for the table) has its
        // shard number right after its storage.
        let (values, shard) = match (counter.of.is_empty(), rest.rsplit_once('#')) {
            (true, None) => ("", rest),
            (false, Some(split)) => split,
            _ => return None,
        };
        shard.parse::<u32>().ok()?;
        Some((id, values.to_string()))
    })
}

/// What a scanned item is to the audit.
pub(super) enum Scanned {
    /// An item of a spec entity.
    Entity(usize, ItemKey, Item),
    /// A counter's own marker, or an item of no entity carrying counter
    /// records (of an entity the spec no longer has): derived, checked
    /// against its source.
    Marker(ItemKey, Item),
    /// A counter shard, or an item the spec has nothing to say about.
    Other,
}

/// What a scanned item tells of the counters (see [`super::sketch`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Fact {
    /// A record naming this shard.
    Record(String),
    /// A shard (partition key) of counter instance (counter, values
    /// joined by `#`), holding `count`, moved `changes` times.
    Shard(String, ProjectionId, String, i64, Option<i64>),
    /// A source item counted in this counter instance.
    Counted(ProjectionId, String),
}

impl Fact {
    /// What it adds to each group it belongs to: a group that is right
    /// sums to zero.
    pub(super) fn add_to(&self, sketch: &mut Sketch) {
        match self {
            Fact::Record(pk) => sketch.add(&Group::Shard(pk.clone()), -1),
            Fact::Shard(pk, id, joined, count, _) => {
                sketch.add(&Group::Shard(pk.clone()), *count);
                sketch.add(&Group::Instance(*id, joined.clone()), *count);
            }
            Fact::Counted(id, joined) => sketch.add(&Group::Instance(*id, joined.clone()), -1),
        }
    }
}

/// Sorts a scanned item, and tells `facts` what it says of the counters.
pub(super) fn classify(spec: &Spec, item: Item, facts: &mut impl FnMut(Fact)) -> Scanned {
    let Some(key) = spec.table.item_key(&item) else {
        return Scanned::Other;
    };
    for value in crate::apply::records_of(&item).values() {
        if let crate::record::AttributeValue::S(shard) = value {
            if parse_shard(spec, shard).is_some() {
                facts(Fact::Record(shard.clone()));
            }
        }
    }
    if key.pk.starts_with(RESERVED_PREFIX) {
        // Counters' own markers, also of a counter this spec no longer
        // reads so (its source changed) while they still count.
        if spec.parse_counter_marker(&key).is_some()
            || key.pk.starts_with(COUNTER_MARKER_PREFIX) && item.contains_key(RECORDS_ATTRIBUTE)
        {
            return Scanned::Marker(key, item);
        }
        return Scanned::Other;
    }
    if spec.table.sort_key.is_none() || key.sk.as_deref() == Some("COUNTER") {
        if let Some((id, values)) = parse_shard(spec, &key.pk) {
            let number = |name: &str| match item.get(name) {
                Some(crate::record::AttributeValue::N(n)) => n.parse::<i64>().ok(),
                _ => None,
            };
            let count = number(COUNT_ATTRIBUTE).unwrap_or(0);
            let changes = number(CHANGES_ATTRIBUTE);
            facts(Fact::Shard(key.pk, id, values, count, changes));
            return Scanned::Other;
        }
    }
    let mut vars = Vec::new();
    if let Some(entity) = spec.match_entity(&key.pk, key.sk.as_deref(), &mut vars) {
        for (id, values) in counted_in(spec, entity, &vars, &item) {
            facts(Fact::Counted(id, values));
        }
        Scanned::Entity(entity, key, item)
    } else if item.contains_key(RECORDS_ATTRIBUTE) {
        // An item of an entity the spec no longer has, still counted in.
        Scanned::Marker(key, item)
    } else {
        Scanned::Other
    }
}

/// The counter instances (counter, values joined by `#`) an item of
/// `entity` counts in.
fn counted_in(
    spec: &Spec,
    entity: usize,
    vars: &crate::spec::Bindings<'_>,
    item: &Item,
) -> Vec<(ProjectionId, String)> {
    spec.counters()
        .filter_map(|(id, _, counter)| {
            if counter.source != entity
                || !(counter.when.is_empty() || counter.when.holds(Some(item)))
            {
                return None;
            }
            let values = counter
                .of
                .iter()
                .map(|(_, t)| t.render(vars, None::<&Item>))
                .collect::<Result<Vec<String>, _>>()
                .ok()?;
            Some((id, values.join("#")))
        })
        .collect()
}

/// A segment's pages, one at a time.
pub(super) struct Pages {
    segment: u32,
    total: u32,
    page_size: Option<i32>,
    start: Option<HashMap<String, Av>>,
    done: bool,
    /// Read units of the last page read.
    pub(super) last_units: f64,
}

impl Pages {
    pub(super) fn new(segment: u32, total: u32, page_size: Option<i32>) -> Pages {
        Pages {
            segment,
            total,
            page_size,
            start: None,
            done: false,
            last_units: 0.0,
        }
    }

    /// Resumes after `key`, the last key a page read.
    pub(super) fn resume_at(&mut self, key: HashMap<String, Av>) {
        self.start = Some(key);
    }

    /// Whether the segment's last page was read.
    pub(super) fn is_done(&self) -> bool {
        self.done
    }

    /// Where the scan resumes (`None`: at the start, or at the end once
    /// done).
    pub(super) fn resume_key(&self) -> Option<&HashMap<String, Av>> {
        self.start.as_ref().filter(|_| !self.done)
    }

    /// The next page's items, or `None` at the segment's end.
    pub(super) async fn next(
        &mut self,
        applier: &Applier,
        read_micro: &AtomicU64,
        progress: &Progress,
    ) -> Result<Option<Vec<Item>>, ApplyError> {
        if self.done {
            return Ok(None);
        }
        let segment = self.segment;
        let request = applier
            .client()
            .scan()
            .table_name(applier.table())
            .segment(segment as i32)
            .total_segments(self.total as i32)
            .consistent_read(true)
            .set_limit(self.page_size)
            .set_exclusive_start_key(self.start.clone())
            .return_consumed_capacity(ReturnConsumedCapacity::Total);
        let retries = AtomicU64::new(0);
        let page = crate::dynamo::retry::with_retries(
            "audit_scan",
            std::time::Duration::from_secs(60),
            &retries,
            || {
                let request = request.clone();
                async move { request.send().await.map_err(crate::dynamo::retry::sdk) }
            },
        )
        .await
        .map_err(|e| ApplyError::Fatal {
            table: applier.table().to_string(),
            message: format!("scan of segment {segment} failed: {e}"),
        })?;
        self.last_units = page
            .consumed_capacity()
            .and_then(|c| c.capacity_units())
            .unwrap_or(0.0);
        read_micro.fetch_add((self.last_units * 1e6) as u64, Ordering::Relaxed);
        progress.advance(page.items().len() as u64);
        let mut items = Vec::with_capacity(page.items().len());
        let pk = &applier.spec().table.partition_key;
        for raw in page.items() {
            // The audit's own checkpoint and findings, written while it
            // scans, are neither audited nor counted.
            if let Some(Av::S(value)) = raw.get(pk) {
                if value.starts_with(AUDIT_PK) {
                    continue;
                }
            }
            let item = crate::decode::item_from_sdk(raw.clone()).map_err(|error| {
                let key = applier.spec().table.key_attributes(raw);
                ApplyError::Fatal {
                    table: applier.table().to_string(),
                    message: format!(
                        "cannot audit the item {}: {error}",
                        crate::decode::item_json(&key)
                    ),
                }
            })?;
            items.push(item);
        }
        match page.last_evaluated_key() {
            Some(key) if !key.is_empty() => self.start = Some(key.clone()),
            _ => self.done = true,
        }
        Ok(Some(items))
    }
}

/// A bar on a terminal, log lines every few seconds otherwise.
pub(super) struct Progress {
    bar: indicatif::ProgressBar,
    enabled: bool,
    terminal: bool,
    scanned: AtomicU64,
    last_log: std::sync::Mutex<Instant>,
}

impl Progress {
    pub(super) fn new(enabled: bool, estimate: Option<u64>) -> Progress {
        let terminal = enabled && std::io::stderr().is_terminal();
        let bar = if terminal {
            let bar = indicatif::ProgressBar::new(estimate.unwrap_or(0));
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{prefix} [{elapsed_precise}] {wide_bar} {pos}/~{len} items ({per_sec}, eta {eta})",
                )
                .expect("valid template"),
            );
            bar.set_prefix("audit");
            bar
        } else {
            indicatif::ProgressBar::hidden()
        };
        Progress {
            bar,
            enabled,
            terminal,
            scanned: AtomicU64::new(0),
            last_log: std::sync::Mutex::new(Instant::now()),
        }
    }

    pub(super) fn advance(&self, n: u64) {
        self.bar.inc(n);
        let scanned = self.scanned.fetch_add(n, Ordering::Relaxed) + n;
        if self.enabled && !self.terminal {
            let mut last = self.last_log.lock().expect("not poisoned");
            if last.elapsed().as_secs() >= 5 {
                *last = Instant::now();
                tracing::info!(scanned, "audit progress");
            }
        }
    }

    pub(super) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
