//! `rollup`: a counter's total kept on an item, so an application reads
//! one item instead of summing shards.
//!
//! ```toml
//! [[projections]]
//! name = "followers-count"
//! kind = "rollup"
//! counter = "followers"          # a counter projection of the same spec
//! target = "profile"             # USER#{userId} / PROFILE
//! attribute = "followersCount"
//! ```
//!
//! The target's key variables are exactly the counter's `of` variables:
//! one target item per counted instance. The planner never plans a total:
//! every effect that can move a shard of the counter (a membership that
//! changes, a record dropped) is followed by a recompute of the instance's
//! target, which reads the shards consistently after the shard moved and
//! writes their sum on condition of the target's token. The token is the
//! version of the shards read ([`version`]): a total equal to the
//! target's, read from shards that moved since, still writes the version,
//! so that no recompute that read before the move can pass after it.
//! Records of the target (it appears, a writer overwrote the total)
//! recompute it too; the MODIFY of the projector's own write finds the
//! version current and writes nothing. A target that does not exist is
//! never created.
//!
//! A rollup is a projection of its counter's definition: its fingerprint
//! covers the counter's, so when the counter changes (and is rebuilt in a
//! new generation) the rollup is changed too, and a backfill of either
//! claims both ([`with_counters`]). While the counter is rebuilt, the
//! rollup totals the version `counter get` reads (the registry names it;
//! the shards of that version, kept current beside the new one, are
//! followed like the counter's own); the backfill completes the counter
//! first and then scans again for the rollup, whose recomputes by then
//! read the rebuilt version.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::{
    Expectation, Kind, Planning, Projection, ProjectionKind, Pruning, RawProjection, Recompute,
    Rules, TargetState, Writes,
};
use crate::dynamo::names::{token_attribute, CHANGES_ATTRIBUTE, COUNT_ATTRIBUTE};
use crate::effect::{Effect, Op, PlanProblem, Sources, Subject};
use crate::record::{AttributeValue, Item, ItemKey};
use crate::schema::{fingerprint, Compiler, Entity, EntityId, ProjectionId, TableSpec};

/// The `[[projections]]` section of `kind = "rollup"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRollup {
    /// Projection name.
    pub name: String,
    /// A counter projection of the same spec.
    pub counter: String,
    /// The entity whose items carry the total; its key variables are the
    /// counter's `of` variables.
    pub target: String,
    /// The attribute that holds the total.
    pub attribute: String,
}

/// A compiled `rollup`.
#[derive(Debug, Clone)]
pub struct Rollup {
    /// The counter it totals.
    pub counter: ProjectionId,
    /// The entity written on.
    pub target: EntityId,
    /// The attribute written.
    pub attribute: String,
}

/// Compiles a raw `rollup`; `all` are the spec's raw projections (the
/// counter's id is its position there).
pub(crate) fn compile(
    raw: &RawRollup,
    cx: &mut Compiler,
    context: &str,
    table: &TableSpec,
    entities: &[Entity],
    all: &[RawProjection],
) -> Option<Rollup> {
    let target = cx.entity(context, "target", &raw.target, entities);
    let counters: Vec<&str> = all
        .iter()
        .filter(|p| matches!(p, RawProjection::Counter(_)) && !p.name().contains('~'))
        .map(RawProjection::name)
        .collect();
    let counter = all.iter().position(|p| p.name() == raw.counter);
    let of_names = match counter.map(|id| &all[id]) {
        Some(RawProjection::Counter(counted)) => {
            let names: BTreeSet<&str> = counted.of.keys().map(String::as_str).collect();
            if target.is_some_and(|t| entities[t].name == counted.source) {
                cx.error(
                    context,
                    format!("target `{}` is the entity counter `{}` counts: writing the total on the counted items would feed the counter its own output", raw.target, raw.counter),
                );
                return None;
            }
            Some(names)
        }
        Some(other) => {
            cx.error(
                context,
                format!(
                    "`counter = \"{}\"` names a {} projection; a rollup totals a counter (counters here: {})",
                    raw.counter,
                    other.kind(),
                    if counters.is_empty() { "none".to_string() } else { counters.join(", ") }
                ),
            );
            None
        }
        None => {
            cx.error(
                context,
                format!(
                    "unknown counter `{}` (counters here: {})",
                    raw.counter,
                    if counters.is_empty() {
                        "none".to_string()
                    } else {
                        counters.join(", ")
                    }
                ),
            );
            None
        }
    };
    let writable = cx.writable(context, "attribute", &raw.attribute, table);
    let (target, of_names, counter) = (target?, of_names?, counter?);
    let target_vars: BTreeSet<&str> = entities[target].vars().collect();
    if target_vars != of_names {
        cx.error(
            context,
            format!(
                "target `{}` has key variables {{{}}} but counter `{}` counts per {{{}}}: the target's key variables must be exactly the counter's `of` variables, one target item per counted instance",
                entities[target].name,
                target_vars.iter().copied().collect::<Vec<_>>().join(", "),
                raw.counter,
                of_names.iter().copied().collect::<Vec<_>>().join(", "),
            ),
        );
        return None;
    }
    if !writable {
        return None;
    }
    Some(Rollup {
        counter,
        target,
        attribute: raw.attribute.clone(),
    })
}

/// Mixes each rollup's counter's definition into the rollup's
/// fingerprint, once the counters' are final (where the counter is stored
/// is not part of it, as it is not of the counter's).
pub(crate) fn settle(projections: &mut [Projection]) {
    let counters: Vec<Option<u64>> = projections
        .iter()
        .map(|p| matches!(p.kind, ProjectionKind::Counter(_)).then_some(p.fingerprint))
        .collect();
    for projection in projections.iter_mut() {
        let ProjectionKind::Rollup(rollup) = &projection.kind else {
            continue;
        };
        // Past a projection that did not compile, positions move: the
        // spec is refused then anyway, and nothing is mixed in.
        if let Some(counter) = counters.get(rollup.counter).copied().flatten() {
            projection.fingerprint = fingerprint(&format!(
                "{:016x};counter {counter:016x}",
                projection.fingerprint
            ));
        }
    }
}

/// Records of the target: it appears (the total appears with it), or its
/// total or token changed or went (a writer overwrote them).
pub(crate) fn plan(
    rules: &Rules,
    id: ProjectionId,
    p: &Rollup,
    subject: &Subject<'_>,
    effects: &mut Vec<Effect>,
) -> Result<(), PlanProblem> {
    let record = subject.record;
    let token = token_attribute(&rules.projections[id].name);
    let relevant = super::target_needs_recompute(record, [&p.attribute], &token);
    if let (true, Some(op)) = (relevant, recompute_op(rules, p, &subject.key)) {
        effects.push(Effect { projection: id, op });
    }
    Ok(())
}

/// The recompute of target `target`: a consistent read of the shards of
/// the instance its key names.
pub(crate) fn recompute_op(rules: &Rules, p: &Rollup, target: &ItemKey) -> Option<Op> {
    let ProjectionKind::Counter(counter) = &rules.projections[p.counter].kind else {
        return None;
    };
    let vars = super::key_vars(&rules.entities[p.target], target)?;
    let values: Vec<String> = counter
        .of
        .iter()
        .map(|(name, _)| crate::schema::template::lookup(&vars, name).map(str::to_string))
        .collect::<Option<_>>()?;
    // While the counter is rebuilt, the total is the one readers read:
    // which version that is changes when the rebuild's backfill completes,
    // so the applier asks the registry.
    if rules.rebuilding(p.counter) {
        return Some(Op::Recompute {
            target: target.clone(),
            sources: Sources::Counter {
                counter: p.counter,
                values,
            },
        });
    }
    let shards = (0..counter.shards)
        .map(|shard| rules.counter_shard_key(&counter.storage, &values, shard))
        .collect();
    Some(Op::Recompute {
        target: target.clone(),
        sources: Sources::Items(shards),
    })
}

/// After every effect that may move a shard of a counter some rollup
/// reads, the recompute of that instance's target (once per target).
/// "May": the planner's guess of a marker's state comes from the record's
/// images, while the applier moves shards by the state it finds (a
/// stream read from mid-history, a counter added over live edges), and
/// a recompute that finds the total equal writes nothing.
pub(crate) fn follow_counters(rules: &Rules, effects: &mut Vec<Effect>) {
    if !rules
        .projections
        .iter()
        .any(|p| matches!(p.kind, ProjectionKind::Rollup(_)))
    {
        return;
    }
    let mut moved: Vec<(ProjectionId, String)> = Vec::new();
    for effect in effects.iter() {
        match &effect.op {
            Op::Membership { counters, .. } => {
                moved.extend(counters.iter().map(|c| (c.counter, c.key.pk.clone())));
            }
            Op::DropRecord { counter, shard, .. } => moved.push((*counter, shard.clone())),
            _ => {}
        }
    }
    for effect in following(rules, &moved) {
        if !effects.contains(&effect) {
            effects.push(effect);
        }
    }
}

/// The recomputes of the rollups of the counter instances whose shards
/// (`(counter, shard partition key)`) moved, once per target.
pub(crate) fn following(rules: &Rules, moved: &[(ProjectionId, String)]) -> Vec<Effect> {
    let mut out: Vec<Effect> = Vec::new();
    for (counter, shard) in moved {
        for (id, projection) in rules.projections.iter().enumerate() {
            let ProjectionKind::Rollup(rollup) = &projection.kind else {
                continue;
            };
            // The counter, or the version of it readers read while it is
            // rebuilt (what the rollup totals then).
            if rollup.counter != *counter && rules.old_version(rollup.counter) != Some(*counter) {
                continue;
            }
            let ProjectionKind::Counter(c) = &rules.projections[*counter].kind else {
                continue;
            };
            let Some(values) = instance(&c.storage, c.of.len(), shard) else {
                tracing::warn!(rollup = %projection.name, shard = %shard, "cannot tell the counted instance from the shard key (a value holds `#`); the rollup is recomputed by its target's next change or a backfill");
                continue;
            };
            let bindings: Vec<(&str, &str)> =
                c.of.iter()
                    .map(|(name, _)| name.as_str())
                    .zip(values.iter().map(String::as_str))
                    .collect();
            let Some(target) = rules.entities[rollup.target].render_key(&bindings) else {
                continue;
            };
            if let Some(op) = recompute_op(rules, rollup, &target) {
                let effect = Effect { projection: id, op };
                if !out.contains(&effect) {
                    out.push(effect);
                }
            }
        }
    }
    out
}

/// `ids` with, for each counter among them, its rollups, and for each
/// rollup, its counter: a rollup is claimed, planned and backfilled with
/// the counter whose definition it totals. With `apart`, a counter
/// rebuilt in this layout is not completed with its rollups: readers
/// switch to the rebuilt version when its backfill completes, and only
/// then can a backfill bring the rollups to it (see
/// [`crate::backfill::backfill`]).
pub fn with_counters(rules: &Rules, ids: &[ProjectionId], apart: bool) -> Vec<ProjectionId> {
    // A closure, not one pass: a rollup brings its counter, which brings
    // the counter's other rollups. One pass would pair a paired set anew,
    // and a backfill would complete more than it claimed.
    let mut out: Vec<ProjectionId> = ids.to_vec();
    loop {
        let before = out.len();
        for (id, projection) in rules.projections.iter().enumerate() {
            if let ProjectionKind::Rollup(rollup) = &projection.kind {
                if apart && rules.rebuilding(rollup.counter) {
                    continue;
                }
                if out.contains(&rollup.counter) && !out.contains(&id) {
                    out.push(id);
                }
                if out.contains(&id) && !out.contains(&rollup.counter) {
                    out.push(rollup.counter);
                }
            }
        }
        if out.len() == before {
            break;
        }
    }
    out.sort_unstable();
    out
}

/// The rollups among `ids` whose counter is rebuilt in this layout, with
/// that counter.
pub fn after_rebuilds(rules: &Rules, ids: &[ProjectionId]) -> Vec<(ProjectionId, ProjectionId)> {
    ids.iter()
        .filter_map(|&id| match &rules.projections[id].kind {
            ProjectionKind::Rollup(r) if rules.rebuilding(r.counter) => Some((id, r.counter)),
            _ => None,
        })
        .collect()
}

/// The `of` values a shard's partition key `COUNTER#storage#v1#..#shard`
/// names; `None` when a value's own `#` makes it ambiguous.
fn instance(storage: &str, n: usize, shard_pk: &str) -> Option<Vec<String>> {
    let rest = shard_pk
        .strip_prefix("COUNTER#")?
        .strip_prefix(storage)?
        .strip_prefix('#')?;
    let (values, _shard) = match rest.rsplit_once('#') {
        Some(split) => split,
        None if n == 0 => return Some(Vec::new()),
        None => return None,
    };
    match n {
        0 => None,
        1 => Some(vec![values.to_string()]),
        _ => {
            let parts: Vec<String> = values.split('#').map(str::to_string).collect();
            (parts.len() == n).then_some(parts)
        }
    }
}

/// The total of the shards a recompute read.
pub fn compute(_rules: &Rules, p: &Rollup, shards: &[Item]) -> Result<TargetState, String> {
    let mut total: i64 = 0;
    for shard in shards {
        match shard.get(COUNT_ATTRIBUTE) {
            None => {}
            Some(AttributeValue::N(n)) => {
                total += n
                    .parse::<i64>()
                    .map_err(|_| format!("counter shard holds count {n:?}, not an integer"))?;
            }
            Some(other) => {
                return Err(format!(
                    "counter shard holds a count that is {}, not a number",
                    crate::schema::template::type_name(other)
                ))
            }
        }
    }
    Ok(vec![(
        p.attribute.clone(),
        Some(AttributeValue::N(total.to_string())),
    )])
}

/// The version of the shards a recompute read: which shards, and how many
/// transactions moved each (`changes`, which only grows), hashed to a
/// number. Two reads of one instance's shards have the same version
/// exactly when no shard moved between them, so a total equal to the
/// target's but read from moved shards still moves the token (turning
/// back a recompute that read before the move), and the target's own
/// record, finding the version current, writes nothing. A number, so that
/// a build from before versions, which adds one to a token it can parse
/// and starts again at 1 over one it cannot, never brings back a token a
/// recompute may still hold while both builds run.
pub fn version(rules: &Rules, shards: &[Item]) -> AttributeValue {
    let mut read: Vec<(ItemKey, u64)> = shards
        .iter()
        .filter_map(|shard| {
            let changes = match shard.get(CHANGES_ATTRIBUTE) {
                Some(AttributeValue::N(n)) => n.parse().unwrap_or(0),
                _ => 0,
            };
            Some((rules.table.item_key(shard)?, changes))
        })
        .collect();
    read.sort_unstable();
    let text: String = read
        .iter()
        .map(|(key, changes)| {
            format!(
                "{}\u{0}{}\u{0}{changes}\n",
                key.pk,
                key.sk.as_deref().unwrap_or("")
            )
        })
        .collect();
    AttributeValue::N(fingerprint(&text).to_string())
}

/// One line for `plan --describe` and `status`.
pub(crate) fn describe(rules: &Rules, p: &Rollup) -> String {
    format!(
        "{}.{} = counter `{}`",
        rules.entities[p.target].name, p.attribute, rules.projections[p.counter].name,
    )
}

/// What `filters` tells a person about the records this kind makes pass.
pub(crate) fn filter_note(rules: &Rules, name: &str, p: &Rollup) -> String {
    format!(
        "rollup `{name}`: records of its target `{}` pass (an INSERT brings the total, a writer that overwrites it is corrected), including the MODIFY of the projector's own write, which reads the shards again and writes nothing; the counted items' records already pass for counter `{}`",
        rules.entities[p.target].name, rules.projections[p.counter].name
    )
}

/// The attributes it writes on its target entity, the token included.
pub(crate) fn written(name: &str, p: &Rollup) -> Vec<String> {
    vec![p.attribute.clone(), token_attribute(name)]
}

/// A rollup is recomputed from its counter's shards.
impl Kind for Rollup {
    fn kind_name(&self) -> &'static str {
        "rollup"
    }

    fn planned_on(&self, _entities: &[Entity]) -> Vec<EntityId> {
        // The counted items' records reach it through its counter.
        vec![self.target]
    }

    fn fingerprint_parts(
        &self,
        _projections: &[Projection],
        pattern: &dyn Fn(EntityId) -> String,
    ) -> Vec<String> {
        vec![pattern(self.target)]
    }

    fn plan(&self, at: &Planning<'_>, effects: &mut Vec<Effect>) -> Result<(), PlanProblem> {
        plan(at.rules, at.id, self, at.subject, effects)
    }

    fn describe(&self, rules: &Rules) -> String {
        describe(rules, self)
    }

    fn filter_note(&self, rules: &Rules, name: &str) -> Option<String> {
        Some(filter_note(rules, name, self))
    }

    fn writes(&self, name: &str) -> Writes {
        Writes::Attributes {
            entity: self.target,
            set: vec![self.attribute.clone()],
            own: vec![token_attribute(name)],
        }
    }

    fn carries(&self, projections: &[Projection]) -> Option<(EntityId, EntityId)> {
        match projections.get(self.counter).map(|c| &c.kind) {
            Some(ProjectionKind::Counter(c)) => Some((c.source, self.target)),
            _ => None,
        }
    }

    fn recompute(&self) -> Option<&dyn Recompute> {
        Some(self)
    }

    fn expectation(&self) -> Expectation {
        Expectation::Recomputed {
            absent_is_missing: true,
        }
    }

    fn pruning(&self, name: &str) -> Pruning {
        Pruning::Strip {
            entity: self.target,
            attributes: written(name, self),
        }
    }

    fn transactional(&self) -> bool {
        false
    }
}

/// The target reads the shards of its counter's instance.
impl Recompute for Rollup {
    fn target(&self) -> EntityId {
        self.target
    }

    fn queried(&self) -> Option<EntityId> {
        None
    }

    fn compute(&self, rules: &Rules, reads: &[Item]) -> Result<TargetState, String> {
        compute(rules, self, reads)
    }

    fn op(&self, rules: &Rules, target: &ItemKey) -> Option<Op> {
        recompute_op(rules, self, target)
    }

    fn uses_token(&self) -> bool {
        true
    }

    fn version(&self, rules: &Rules, reads: &[Item]) -> Option<AttributeValue> {
        Some(version(rules, reads))
    }
}

#[cfg(test)]
mod tests {
    use super::{instance, with_counters};
    use crate::spec::Spec;

    /// Two rollups of one counter: pairing either brings the counter and
    /// the other, and pairing a paired set adds nothing (a backfill
    /// completes what it claimed).
    #[test]
    fn pairing_is_a_closure() {
        let text = include_str!("../../../projections/social-service.toml").to_string()
            + "\n[[projections]]\nname = \"followers-again\"\nkind = \"rollup\"\ncounter = \"followers\"\ntarget = \"profile\"\nattribute = \"followersAgain\"\n";
        let spec = Spec::from_toml(&text, "two-rollups.toml").expect("compiles");
        let id = |name: &str| spec.projection_id(name).expect(name);
        let (counter, first, second) = (
            id("followers"),
            id("followers-count"),
            id("followers-again"),
        );
        let mut expected = vec![counter, first, second];
        expected.sort_unstable();
        for apart in [false, true] {
            let paired = with_counters(&spec, &[first], apart);
            assert_eq!(paired, expected, "apart: {apart}");
            assert_eq!(with_counters(&spec, &paired, apart), paired);
        }
    }

    /// The version names the shards and their moves, in any order, and is
    /// a number an earlier build (which counts its tokens up) reads as
    /// one, so it never starts such a token over at 1.
    #[test]
    fn the_version_follows_every_move_and_is_a_counted_number() {
        use crate::record::{AttributeValue, Item};
        let spec = Spec::from_toml(
            include_str!("../../../projections/social-service.toml"),
            "social-service.toml",
        )
        .expect("compiles");
        let shard = |pk: &str, count: i64, changes: Option<u64>| {
            let mut item = Item::default();
            item.insert("PK".into(), AttributeValue::S(pk.into()));
            item.insert("SK".into(), AttributeValue::S("COUNTER".into()));
            item.insert("count".into(), AttributeValue::N(count.to_string()));
            if let Some(changes) = changes {
                item.insert("changes".into(), AttributeValue::N(changes.to_string()));
            }
            item
        };
        let version = |shards: &[Item]| super::version(&spec, shards);
        let (a, b) = ("COUNTER#followers#b#0", "COUNTER#followers#b#1");
        let base = version(&[shard(a, 1, Some(1)), shard(b, 1, Some(1))]);
        assert_eq!(
            base,
            version(&[shard(b, 1, Some(1)), shard(a, 1, Some(1))]),
            "order"
        );
        // A move that leaves the total where it was is still a move.
        let moved = version(&[shard(a, 0, Some(2)), shard(b, 2, Some(2))]);
        assert_ne!(base, moved);
        // A shard that appears, even without a stamp, is another version.
        assert_ne!(base, version(&[shard(a, 1, Some(1))]));
        assert_ne!(
            version(&[shard(a, 1, Some(1))]),
            version(&[shard(a, 1, Some(1)), shard(b, 0, None)])
        );
        for v in [base, moved] {
            let AttributeValue::N(n) = v else {
                panic!("not a number: {v:?}")
            };
            assert!(n.parse::<u64>().is_ok(), "{n}");
        }
    }

    #[test]
    fn reads_the_instance_back_from_a_shard_key() {
        assert_eq!(
            instance("followers", 1, "COUNTER#followers#b#3"),
            Some(vec!["b".to_string()])
        );
        assert_eq!(
            instance("followers", 1, "COUNTER#followers#a#b#3"),
            Some(vec!["a#b".to_string()])
        );
        assert_eq!(instance("total", 0, "COUNTER#total#0"), Some(Vec::new()));
        assert_eq!(
            instance("pair", 2, "COUNTER#pair#x#y#7"),
            Some(vec!["x".to_string(), "y".to_string()])
        );
        assert_eq!(instance("pair", 2, "COUNTER#pair#x#y#z#7"), None);
        assert_eq!(instance("followers", 1, "COUNTER#following#b#3"), None);
    }
}
