//! Consistent reads for the audit: the reads the worker makes before it
//! writes, so that what the audit expects of an item is what the worker
//! would compute for it now.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use super::check::{partition_query, value_holders};
use super::ctx::Ctx;
use super::reads::{read_markers, read_sources};
use super::writes::read_recompute_sources;
use super::Applier;
use crate::dynamo::retry::WriteError;
use crate::invariant::unique_value;
use crate::plan::Sources;
use crate::record::{Item, ItemKey};
use crate::spec::{EntityId, InvariantKind, ProjectionId};

/// Reads for one page of an audit. Short-lived: what a read remembers
/// for the worker's invariant check goes with it.
pub(crate) struct Reader<'a> {
    ctx: Ctx<'a>,
}

impl Applier {
    /// A reader with the worker's retries and concurrency.
    pub(crate) fn reader(&self) -> Reader<'_> {
        let mut ctx = Ctx::new(
            &self.client,
            &self.table,
            &self.spec,
            &self.config,
            &*self.control,
        );
        // What a page's checks read is compared, then dropped.
        ctx.keep_reads = false;
        Reader { ctx }
    }
}

impl Reader<'_> {
    /// The items of `keys` that exist (`BatchGetItem`, consistent).
    pub(crate) async fn items(
        &self,
        keys: Vec<&ItemKey>,
    ) -> Result<HashMap<ItemKey, Item>, WriteError> {
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        read_markers(&self.ctx, keys).await
    }

    /// What a recompute of `target` computes from (see
    /// [`read_recompute_sources`]).
    pub(crate) async fn recompute_sources(
        &self,
        projection: ProjectionId,
        target: &ItemKey,
        sources: &Sources,
    ) -> Result<Vec<Item>, WriteError> {
        read_recompute_sources(&self.ctx, projection, target, sources).await
    }

    /// The items of `entity` in partition `pk` (a consistent query).
    pub(crate) async fn partition(
        &self,
        entity: EntityId,
        pk: &str,
    ) -> Result<Vec<Item>, WriteError> {
        read_sources(&self.ctx, &partition_query(self.ctx.spec, entity, pk)).await
    }

    /// The items that hold `value` for the `unique` invariant `invariant`:
    /// the index's holders and `also`, each confirmed by a consistent read
    /// when more than one partition holds it (the index lags the table),
    /// sorted; and whether the index holds `also` (an item whose index key
    /// drifted is out of it).
    pub(crate) async fn unique_holders(
        &self,
        invariant: usize,
        value: &str,
        also: Option<&ItemKey>,
    ) -> Result<(Vec<ItemKey>, bool), WriteError> {
        let spec = self.ctx.spec;
        let checked = &spec.invariants[invariant];
        let InvariantKind::Unique {
            index, attribute, ..
        } = &checked.kind
        else {
            return Ok((Vec::new(), false));
        };
        let mut holders = value_holders(&self.ctx, index, attribute, value).await?;
        let indexed = also.is_none_or(|also| !holders.insert(also.clone()));
        let owners: HashSet<&str> = holders.iter().map(|k| k.pk.as_str()).collect();
        if owners.len() < 2 {
            return Ok((holders.into_iter().collect(), indexed));
        }
        let mut confirmed: Vec<ItemKey> = read_markers(&self.ctx, holders.iter().collect())
            .await?
            .into_iter()
            .filter(|(_, item)| unique_value(spec, checked, item).as_deref() == Some(value))
            .map(|(key, _)| key)
            .collect();
        confirmed.sort();
        Ok((confirmed, indexed))
    }

    /// Read capacity units consumed so far.
    pub(crate) fn read_units(&self) -> f64 {
        self.ctx.read_micro_units.load(Ordering::Relaxed) as f64 / 1e6
    }
}
