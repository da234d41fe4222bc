//! An item's current state as a record: what `replay`, `failover`'s replay,
//! `recover` and a redrive apply in place of the records that named it.
//!
//! A record that is not the last change of its item describes a past
//! state; applied again after newer ones (a replay, a range Lambda went
//! past), it would show readers that past until the newer record is
//! applied again. So such sources treat a record as a hint that its item
//! changed: the item is read consistently and derived like a scanned item
//! (an `INSERT` of its image, or a `REMOVE` when it is gone), every write
//! guarded by the state read, and markers read before they are written.
//! A superseded record then changes nothing, and an exact table is not
//! written at all.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use aws_sdk_dynamodb::types::AttributeValue as Av;

use super::{ctx, dlq, Applier};
use crate::decode::DecodeProblem;
use crate::dynamo::retry::{sdk, with_retries, WriteError};
use crate::record::{ChangeKind, ChangeRecord, ItemKey, Origin, SequenceNumber, ViewType};
use crate::spec::{ProjectionId, Spec};

/// Records turned into their items' current states by
/// [`Applier::current_states`].
#[derive(Debug, Clone, Default)]
pub struct CurrentStates {
    /// What to apply, in stream order: for each item read, one record of
    /// its current state, where its last record stood; every other record
    /// as it was.
    pub records: Vec<Result<ChangeRecord, DecodeProblem>>,
    /// For each record given, the index in `records` of the record that
    /// stands for it: it is handled when that one is.
    pub stands_for: Vec<usize>,
    /// Items read (consistently, 100 to a `BatchGetItem`).
    pub items_read: usize,
    /// Read capacity units DynamoDB reported for them.
    pub read_units: f64,
    /// Requests retried.
    pub retries: u64,
}

impl Applier {
    /// Turns `records` (in stream order) into the current states of the
    /// items they touched: each item a record (or a record that could not
    /// be decoded) names, and some projection of `selection` plans on, is
    /// read once, consistently, with the others (`BatchGetItem`s of 100
    /// keys, as many in flight as the applier's concurrency allows), and
    /// stands, as a record derived like a scanned item, at the place of the
    /// item's last record, with its event id and sequence number. The
    /// records whose item cannot be told (keys that are not strings, a
    /// record that could not be decoded without readable keys) stay as they
    /// are, to be dead-lettered; so do the records of items nothing plans
    /// on (the projector's own items, reverse edges, counter shards), which
    /// plan nothing whatever their state.
    ///
    /// An item whose current state cannot be decoded (a value of a type
    /// this build does not know) becomes a [`DecodeProblem`] naming it,
    /// with its last record.
    pub async fn current_states(
        &self,
        records: Vec<Result<ChangeRecord, DecodeProblem>>,
        selection: Option<&[ProjectionId]>,
    ) -> Result<CurrentStates, WriteError> {
        let spec = &*self.spec;
        let selected = selection.map(|ids| crate::kinds::with_dependencies(spec, ids));
        let n = records.len();
        // The item of each record read for, and each such item's last record.
        let mut keys: Vec<Option<ItemKey>> = Vec::with_capacity(n);
        let mut last: HashMap<ItemKey, usize> = HashMap::new();
        for (index, decoded) in records.iter().enumerate() {
            let key = match decoded {
                Ok(record) => spec
                    .table
                    .item_key(&record.keys)
                    .filter(|key| plans_on(spec, key, selected.as_deref())),
                // An item whose record could not be decoded may read now.
                Err(problem) => dlq::problem_key(problem, &spec.table),
            };
            if let Some(key) = &key {
                last.insert(key.clone(), index);
            }
            keys.push(key);
        }
        let ctx = ctx::Ctx::new(
            &self.client,
            &self.table,
            spec,
            &self.config,
            &*self.control,
        );
        let mut found = if last.is_empty() {
            HashMap::new()
        } else {
            super::reads::read_items(&ctx, last.keys().collect(), "current_state_read").await?
        };
        let items_read = last.len();
        metrics::counter!("projector_current_state_reads_total").increment(items_read as u64);
        let mut out = CurrentStates {
            records: Vec::with_capacity(n.min(items_read + n / 2)),
            stands_for: vec![0; n],
            items_read,
            read_units: ctx.read_micro_units.load(Ordering::Relaxed) as f64 / 1e6,
            retries: ctx.retries.load(Ordering::Relaxed),
        };
        // Where each item's record will stand, known only at its last record.
        let mut waiting: HashMap<ItemKey, Vec<usize>> = HashMap::new();
        for (index, (decoded, key)) in records.into_iter().zip(keys).enumerate() {
            let Some(key) = key else {
                out.stands_for[index] = out.records.len();
                out.records.push(decoded);
                continue;
            };
            if last.get(&key) != Some(&index) {
                waiting.entry(key).or_default().push(index);
                continue;
            }
            let at = out.records.len();
            out.stands_for[index] = at;
            for earlier in waiting.remove(&key).unwrap_or_default() {
                out.stands_for[earlier] = at;
            }
            let (event_id, sequence_number) = match &decoded {
                Ok(record) => (
                    Some(record.event_id.as_str()),
                    Some(record.sequence_number.0.as_str()),
                ),
                Err(problem) => (
                    problem.event_id.as_deref(),
                    problem.sequence_number.as_deref(),
                ),
            };
            let state = state_record(
                spec,
                at,
                event_id,
                sequence_number,
                || match &decoded {
                    Ok(record) => serde_json::to_value(record).unwrap_or_default(),
                    Err(problem) => problem.raw.clone(),
                },
                &key,
                found.remove(&key),
            );
            out.records.push(state);
        }
        Ok(out)
    }

    /// The item at `key` as it is now, read consistently (one `GetItem`),
    /// as a record that derives it like a scanned item (guarded by the
    /// state it read): an `INSERT` of its image, or a `REMOVE` without
    /// images when it is gone. It takes the event id and sequence number
    /// of the record it stands for; `raw` is that record, for the problem
    /// when the item cannot be decoded.
    pub(crate) async fn current_state_record(
        &self,
        index: usize,
        event_id: Option<&str>,
        sequence_number: Option<&str>,
        raw: &serde_json::Value,
        key: &ItemKey,
    ) -> Result<Result<ChangeRecord, DecodeProblem>, WriteError> {
        let retries = std::sync::atomic::AtomicU64::new(0);
        let item_key: HashMap<String, Av> = self.spec.table.key_item(key).into();
        let output = with_retries(
            "current_state_read",
            std::time::Duration::from_secs(20),
            &retries,
            || {
                let request = self
                    .client
                    .get_item()
                    .table_name(&self.table)
                    .set_key(Some(item_key.clone()))
                    .consistent_read(true);
                async move { request.send().await.map_err(sdk) }
            },
        )
        .await?;
        Ok(state_record(
            &self.spec,
            index,
            event_id,
            sequence_number,
            || raw.clone(),
            key,
            output.item,
        ))
    }
}

/// Whether some projection of `selected` (with what it depends on; `None`:
/// all) plans on the item at `key`: records of other items plan nothing,
/// whatever their state.
fn plans_on(spec: &Spec, key: &ItemKey, selected: Option<&[ProjectionId]>) -> bool {
    let mut vars = Vec::new();
    let Some(entity) = spec.match_entity(&key.pk, key.sk.as_deref(), &mut vars) else {
        return false;
    };
    spec.interested(entity)
        .iter()
        .any(|id| selected.is_none_or(|ids| ids.contains(id)))
}

/// The record of `key`'s state as read (`item`; `None`: gone), standing
/// for the record with `event_id` and `sequence_number` (`raw`: that
/// record, for the problem when the item cannot be decoded).
fn state_record(
    spec: &Spec,
    index: usize,
    event_id: Option<&str>,
    sequence_number: Option<&str>,
    raw: impl FnOnce() -> serde_json::Value,
    key: &ItemKey,
    item: Option<HashMap<String, Av>>,
) -> Result<ChangeRecord, DecodeProblem> {
    let (kind, image) = match item.map(crate::decode::item_from_sdk) {
        Some(Err(error)) => {
            return Err(DecodeProblem {
                index,
                event_id: event_id.map(str::to_string),
                sequence_number: sequence_number.map(str::to_string),
                reason: format!("the item's current state {key}: {error}"),
                raw: raw(),
            })
        }
        Some(Ok(item)) => (ChangeKind::Insert, Some(item.into())),
        None => (ChangeKind::Remove, None),
    };
    Ok(ChangeRecord {
        event_id: event_id.unwrap_or_default().to_string(),
        kind,
        keys: spec.table.key_item(key).into(),
        old_image: None,
        new_image: image,
        sequence_number: SequenceNumber(sequence_number.unwrap_or("0").to_string()),
        approximate_creation_ms: None,
        ttl_expiry: false,
        view_type: Some(ViewType::NewImage),
        size_bytes: None,
        origin: Origin::Scan { segment: 0 },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn social() -> Spec {
        Spec::from_file(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("projections/social-service.toml"),
        )
        .expect("the shipped spec compiles")
    }

    fn key(pk: &str, sk: &str) -> ItemKey {
        ItemKey {
            pk: pk.to_string(),
            sk: Some(sk.to_string()),
        }
    }

    #[test]
    fn only_items_a_selected_projection_plans_on_are_read() {
        let spec = social();
        let follow = key("USER#a", "FOLLOWS#b");
        let edge = key("USER#b", "FOLLOWED_BY#a");
        let profile = key("USER#b", "PROFILE");
        let shard = key("COUNTER#followers#b#3", "COUNTER");
        let own = key("_ddbp#checkpoint", "arn#shard");
        for (item, read) in [
            (&follow, true),
            (&profile, true),
            (&edge, false),
            (&shard, false),
            (&own, false),
        ] {
            assert_eq!(plans_on(&spec, item, None), read, "{item}");
        }
        let leaderboard = vec![spec
            .projection_id("achievement-leaderboard-keys")
            .expect("in the spec")];
        assert!(!plans_on(&spec, &follow, Some(&leaderboard)));
        assert!(plans_on(
            &spec,
            &key("USER#a", "ACHIEVEMENT#b1"),
            Some(&leaderboard)
        ));
        // A counter comes with its rollup: the profile is read for it.
        let followers = crate::kinds::with_dependencies(
            &spec,
            &[spec.projection_id("followers").expect("in the spec")],
        );
        assert!(plans_on(&spec, &profile, Some(&followers)));
        assert!(plans_on(&spec, &follow, Some(&followers)));
    }

    #[test]
    fn a_state_read_is_an_insert_or_a_remove_derived_like_a_scan() {
        let spec = social();
        let follow = key("USER#a", "FOLLOWS#b");
        let gone = state_record(
            &spec,
            3,
            Some("e1"),
            Some("42"),
            || serde_json::Value::Null,
            &follow,
            None,
        )
        .expect("decodes");
        assert_eq!(gone.kind, ChangeKind::Remove);
        assert_eq!(gone.new_image, None);
        assert_eq!(gone.sequence_number.0, "42");
        assert_eq!(gone.event_id, "e1");
        assert!(matches!(gone.origin, Origin::Scan { .. }));
        let item: HashMap<String, Av> = [
            ("PK", Av::S("USER#a".into())),
            ("SK", Av::S("FOLLOWS#b".into())),
            ("followedAt", Av::S("t1".into())),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let now = state_record(
            &spec,
            3,
            None,
            None,
            || serde_json::Value::Null,
            &follow,
            Some(item),
        )
        .expect("decodes");
        assert_eq!(now.kind, ChangeKind::Insert);
        assert_eq!(
            now.new_image
                .as_ref()
                .and_then(|image| image.get("followedAt"))
                .and_then(|v| v.as_str().map(str::to_string))
                .as_deref(),
            Some("t1")
        );
        assert_eq!(now.sequence_number.0, "0");
    }
}
