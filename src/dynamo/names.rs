//! The projector's reserved names, in one list: the partition keys of its
//! own items and the attributes it adds to items of the table.
//!
//! Every key under [`RESERVED_PREFIX`] belongs to the projector: no entity
//! matches it, the planner skips its changes, the audit leaves it out of
//! the table's items, and the Lambda's filters warn when an entity's
//! prefix could match it. The values are stored: changing one orphans the
//! items written under the old one.
//!
//! A consumer's name goes into keys too (`_ddbp#checkpoint@<consumer>`, its
//! leases), so what a consumer may be named is decided here as well
//! ([`parse_consumer`]).

/// Keys starting with this prefix belong to the projector itself (dead
/// letters, checkpoints, counter markers); they never match an entity.
pub const RESERVED_PREFIX: &str = "_ddbp#";

/// The partition key of the lifecycle registry's items.
pub const LIFECYCLE_PK: &str = "_ddbp#lifecycle";

/// The partition key of the table's service registry: one item (sort key
/// `registry`) holding the registry version and the registered services'
/// names, never a spec text (see `control::services`).
pub const REGISTRY_PK: &str = "_ddbp#registry";

/// The partition key prefix of one service's registrations
/// (`_ddbp#svc#<service>`): its versions and texts, under a key a service
/// team's role can be scoped to with `dynamodb:LeadingKeys`.
pub const SERVICE_PK_PREFIX: &str = "_ddbp#svc#";

/// The actual names of the tables specs describe, when they differ
/// (`SPEC_TABLE=ACTUAL_TABLE,...`): read by the CLI, the Lambda and
/// `register`.
pub const TABLE_NAMES_VAR: &str = "PROJECTOR_TABLE_NAMES";

/// The partition key of the stream runner's checkpoint items.
pub const CHECKPOINT_PK: &str = "_ddbp#checkpoint";

/// The partition key of dead letters.
pub const DLQ_PK: &str = "_ddbp#dlq";

/// The partition key of holds: the (projection, item) pairs with letters.
pub const HOLDS_PK: &str = "_ddbp#holds";

/// The partition key of the ledger of deliveries (`apply::Delivery`):
/// where each delivery of records started, and how far it reached.
pub const DELIVERED_PK: &str = "_ddbp#delivered";

/// The partition key of backfill progress items.
pub const BACKFILL_PK: &str = "_ddbp#backfill";

/// The partition key of prune progress items.
pub const PRUNE_PK: &str = "_ddbp#prune";

/// The partition key of the pointers to each long job's last run
/// (`control::runs`): what `--resume` continues.
pub const RUNS_PK: &str = "_ddbp#runs";

/// The partition key of a replay's progress (`replay --run`), per run:
/// `_ddbp#replay#<run>`, laid out as a consumer's checkpoints.
pub const REPLAY_PK_PREFIX: &str = "_ddbp#replay#";

/// The partition key of the audit's items in the table.
pub const AUDIT_PK: &str = "_ddbp#audit";

/// The partition key prefix of recorded invariant violations; see
/// [`violation_pk`].
pub const VIOLATION_PK_PREFIX: &str = "_ddbp#violation#";

/// The partition key prefix under which violations of one invariant are
/// recorded: `_ddbp#violation#<invariant>`.
pub fn violation_pk(invariant: &str) -> String {
    format!("{VIOLATION_PK_PREFIX}{invariant}")
}

/// The partition key prefix of counters' own marker items.
pub const COUNTER_MARKER_PREFIX: &str = "_ddbp#count#";

/// Counter records: on the item that marks a source item's membership, the
/// map attribute `_ddbp#c` maps each counter that counts the source to the
/// partition key of the shard it is counted in.
pub const RECORDS_ATTRIBUTE: &str = "_ddbp#c";

/// The prefix of a recomputed kind's token attribute; see
/// [`token_attribute`].
pub const TOKEN_ATTRIBUTE_PREFIX: &str = "_ddbp#v#";

/// The attribute a recomputed kind's target carries to order its writes:
/// a number that grows by one per write of projection `name`.
pub fn token_attribute(name: &str) -> String {
    format!("{TOKEN_ATTRIBUTE_PREFIX}{name}")
}

/// The attribute that holds a counter shard's value.
pub const COUNT_ATTRIBUTE: &str = "count";

/// The attribute that counts the transactions that moved a shard: the
/// audit compares it before and after recounting a shard's records.
pub const CHANGES_ATTRIBUTE: &str = "changes";

/// A consumer name: 1 to 64 letters, digits, `.`, `_` or `-`.
pub fn parse_consumer(text: &str) -> Result<String, String> {
    let ok = !text.is_empty()
        && text.len() <= 64
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(text.to_string())
    } else {
        Err(format!(
            "`{text}` is not a consumer name: use 1 to 64 letters, digits, `.`, `_` or `-`"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_and_reserved_attribute_is_under_the_reserved_prefix() {
        for name in [
            LIFECYCLE_PK,
            CHECKPOINT_PK,
            DLQ_PK,
            HOLDS_PK,
            BACKFILL_PK,
            PRUNE_PK,
            RUNS_PK,
            REPLAY_PK_PREFIX,
            AUDIT_PK,
            VIOLATION_PK_PREFIX,
            COUNTER_MARKER_PREFIX,
            RECORDS_ATTRIBUTE,
            TOKEN_ATTRIBUTE_PREFIX,
        ] {
            assert!(name.starts_with(RESERVED_PREFIX), "{name}");
        }
        assert_eq!(violation_pk("one-email"), "_ddbp#violation#one-email");
        assert_eq!(token_attribute("totals"), "_ddbp#v#totals");
    }

    #[test]
    fn consumer_names_are_short_and_plain() {
        assert_eq!(parse_consumer("blue-1.a_b"), Ok("blue-1.a_b".to_string()));
        assert_eq!(parse_consumer(&"c".repeat(64)).map(|n| n.len()), Ok(64));
        for bad in ["", "a b", "a#b", "a@b", &"c".repeat(65)] {
            assert!(parse_consumer(bad).is_err(), "{bad:?}");
        }
    }
}
