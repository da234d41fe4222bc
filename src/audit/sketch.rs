//! Counters checked in constant memory.
//!
//! A counter is right when each shard holds the number of records naming
//! it, and each counter's shards add up to its counted source items. Both
//! are group-bys over the whole table: a shard, its records and its
//! sources lie in different partitions, and so in different segments. The
//! audit keeps a *sketch* instead of the groups: every fact adds a signed
//! amount to the group it belongs to (a shard's count `+n` to its shard
//! and its counter, a record `-1` to its shard, a counted source `-1` to
//! its counter). A group that is right sums to zero.
//!
//! The sketch keeps, per bucket of groups, the sum of `amount × r(group)`
//! modulo 2^64, with `r` an odd 64-bit hash of the group's name. A group
//! that does not sum to zero makes its bucket non-zero: `r` is odd, so
//! `amount × r` is zero only when the amount is. Two wrong groups cancel
//! only when their hashes satisfy one linear equation modulo 2^64: about
//! one chance in 2^64. Sketches add up, so segments audited apart (on
//! other machines) merge. The buckets that are not zero name the groups a
//! second scan counts exactly.

use serde::{Deserialize, Serialize};

use crate::spec::ProjectionId;

/// Buckets per sketch: 8 KB, and a second scan that keeps 1/1024 of the
/// groups per wrong bucket.
pub const BUCKETS: usize = 1024;

/// Sums of `amount × r(group)` per bucket of groups.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sketch {
    buckets: Vec<u64>,
}

impl Default for Sketch {
    fn default() -> Self {
        Sketch {
            buckets: vec![0; BUCKETS],
        }
    }
}

/// A group of counter facts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Group {
    /// One shard, by its partition key: its count against its records.
    Shard(String),
    /// One counter instance (counter, its values joined by `#`): its
    /// shards' sum against its counted sources.
    Instance(ProjectionId, String),
}

impl Group {
    fn name(&self) -> String {
        match self {
            Group::Shard(pk) => format!("s\u{0}{pk}"),
            Group::Instance(id, joined) => format!("i\u{0}{id}\u{0}{joined}"),
        }
    }

    /// Its bucket and its odd multiplier.
    fn hash(&self) -> (usize, u64) {
        let name = self.name();
        let bucket = (hash64(name.as_bytes(), 0x9e37_79b9_7f4a_7c15) % BUCKETS as u64) as usize;
        (bucket, hash64(name.as_bytes(), 0xd1b5_4a32_d192_ed03) | 1)
    }
}

/// FNV-1a with a seed, finished with splitmix64's mixer: stable across
/// builds and machines (segments merge), well spread.
fn hash64(bytes: &[u8], seed: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

impl Sketch {
    /// Adds `amount` to `group`.
    pub fn add(&mut self, group: &Group, amount: i64) {
        let (bucket, r) = group.hash();
        self.buckets[bucket] = self.buckets[bucket].wrapping_add((amount as u64).wrapping_mul(r));
    }

    /// Adds another sketch (another segment's).
    pub fn merge(&mut self, other: &Sketch) {
        for (mine, theirs) in self.buckets.iter_mut().zip(&other.buckets) {
            *mine = mine.wrapping_add(*theirs);
        }
    }

    /// Whether every group summed to zero (as far as the sketch can tell:
    /// see the module docs).
    pub fn is_zero(&self) -> bool {
        self.buckets.iter().all(|&b| b == 0)
    }

    /// The buckets that are not zero.
    pub fn wrong_buckets(&self) -> Vec<usize> {
        (0..self.buckets.len())
            .filter(|&b| self.buckets[b] != 0)
            .collect()
    }

    /// Whether `group` is in a bucket that is not zero.
    pub fn suspects(&self, group: &Group) -> bool {
        self.buckets[group.hash().0] != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(pk: &str) -> Group {
        Group::Shard(pk.to_string())
    }

    #[test]
    fn groups_that_balance_leave_it_zero_in_any_order_and_split() {
        let mut one = Sketch::default();
        let mut other = Sketch::default();
        one.add(&shard("COUNTER#followers#b#3"), 2);
        other.add(&shard("COUNTER#followers#b#3"), -1);
        one.add(&Group::Instance(1, "b".into()), -1);
        other.add(&Group::Instance(1, "b".into()), 1);
        assert!(!one.is_zero());
        one.add(&shard("COUNTER#followers#b#3"), -1);
        one.merge(&other);
        assert!(one.is_zero(), "{:?}", one.wrong_buckets());
    }

    #[test]
    fn any_one_wrong_group_shows_in_its_bucket() {
        for amount in [1i64, -1, 2, 1 << 40, i64::MIN, -(1 << 62)] {
            for name in ["COUNTER#a#x#0", "COUNTER#b#y#7", ""] {
                let mut sketch = Sketch::default();
                sketch.add(&shard(name), amount);
                assert!(sketch.suspects(&shard(name)), "{name} {amount}");
                assert_eq!(sketch.wrong_buckets().len(), 1);
            }
        }
    }

    /// Two groups off by opposite amounts (a record moved to the wrong
    /// shard) do not cancel, whether they share a bucket or not.
    #[test]
    fn opposite_errors_in_two_groups_do_not_cancel() {
        let mut shared = 0;
        for i in 0..20_000 {
            let (a, b) = (shard(&format!("S#{i}#0")), shard(&format!("S#{i}#1")));
            let mut sketch = Sketch::default();
            sketch.add(&a, 1);
            sketch.add(&b, -1);
            assert!(!sketch.is_zero(), "{i}");
            assert!(sketch.suspects(&a) && sketch.suspects(&b));
            shared += usize::from(sketch.wrong_buckets().len() == 1);
        }
        assert!(shared > 0, "some pairs share a bucket");
    }
}
