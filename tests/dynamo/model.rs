//! The shared model of the writers and of the spec, for the tests that
//! generate workloads: item builders, a [`History`] of writes and the stream
//! records they produce, a deterministic [`Rng`], the generators of social
//! and user histories, and [`check_derived`], an oracle written apart from
//! the planner that says what the derived items must be given the source
//! items of a scan.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue as Av;
use ddb_projector::apply::Applier;
use ddb_projector::decode::DecodeProblem;
use ddb_projector::record::{
    ChangeKind, ChangeRecord, Image, Item, Origin, SequenceNumber, ViewType,
};
use ddb_projector::spec::Spec;
use futures::stream::{self, StreamExt};

use super::support::{self, s, text};

pub type Attrs = HashMap<String, Av>;
pub type Record = Result<ChangeRecord, DecodeProblem>;

pub fn attrs(pairs: &[(&str, Av)]) -> Attrs {
    support::item(pairs)
}

// ------------------------------------------------------------- randomness ---

/// A small deterministic generator (xorshift64*).
#[derive(Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A seed from the environment variable `var`, or `default`; printed so a
/// failing run can be repeated.
pub fn seed_from_env(var: &str, default: impl FnOnce() -> u64) -> u64 {
    let seed = std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(default);
    eprintln!("seed {seed} (set {var}={seed} to repeat it)");
    seed
}

// --------------------------------------------------------------- history ---

/// A writer's history: the stream records it produces, in order, and the
/// items it leaves.
#[derive(Default)]
pub struct History {
    pub records: Vec<Record>,
    pub items: BTreeMap<(String, String), Attrs>,
}

impl History {
    pub fn key(item: &Attrs) -> (String, String) {
        (text(item, "PK").expect("PK"), text(item, "SK").expect("SK"))
    }

    pub fn put(&mut self, item: Attrs) {
        let old = self.items.insert(History::key(&item), item.clone());
        let kind = if old.is_some() {
            ChangeKind::Modify
        } else {
            ChangeKind::Insert
        };
        self.record(kind, old, Some(item));
    }

    pub fn delete(&mut self, pk: &str, sk: &str) {
        if let Some(old) = self.items.remove(&(pk.to_string(), sk.to_string())) {
            self.record(ChangeKind::Remove, Some(old), None);
        }
    }

    pub fn get(&self, pk: &str, sk: &str) -> Option<&Attrs> {
        self.items.get(&(pk.to_string(), sk.to_string()))
    }

    pub fn record(&mut self, kind: ChangeKind, old: Option<Attrs>, new: Option<Attrs>) {
        let seq = self.records.len() as u64 + 1;
        self.records
            .push(change(seq, kind, old.as_ref(), new.as_ref()));
    }

    /// Writes the final items, as the writers left them.
    pub async fn write_final(&self, client: &aws_sdk_dynamodb::Client, table: &str) {
        stream::iter(self.items.values())
            .map(|item| put_item(client, table, item))
            .buffer_unordered(16)
            .collect::<Vec<_>>()
            .await;
    }
}

/// Puts an item as a plain writer would (on the clean client).
pub async fn put_item(client: &aws_sdk_dynamodb::Client, table: &str, item: &Attrs) {
    with_patience("put item", || {
        client
            .put_item()
            .table_name(table)
            .set_item(Some(item.clone()))
            .send()
    })
    .await;
}

/// Deletes an item as a plain writer would (on the clean client).
pub async fn delete_item(client: &aws_sdk_dynamodb::Client, table: &str, key: Attrs) {
    with_patience("delete item", || {
        client
            .delete_item()
            .table_name(table)
            .set_key(Some(key.clone()))
            .send()
    })
    .await;
}

/// A setup write, tried again a few times: under a full parallel test run
/// DynamoDB Local answers "too long waiting for a lock" (a 500 real
/// DynamoDB never gives) even after the SDK's own retries.
pub async fn with_patience<T, E: std::fmt::Debug, F, Fut>(what: &str, mut send: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    for attempt in 1.. {
        match send().await {
            Ok(_) => return,
            Err(error) if attempt < 6 => {
                eprintln!("{what} failed ({error:?}); trying again");
                tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
            }
            Err(error) => panic!("{what}: {error:?}"),
        }
    }
}

pub fn follow(a: &str, b: &str, at: &str) -> Attrs {
    attrs(&[
        ("PK", s(&format!("USER#{a}"))),
        ("SK", s(&format!("FOLLOWS#{b}"))),
        ("followerId", s(a)),
        ("followeeId", s(b)),
        ("followedAt", s(at)),
    ])
}

pub fn achievement(user: &str, badge: &str, tier: &str, score: Av) -> Attrs {
    attrs(&[
        ("PK", s(&format!("USER#{user}"))),
        ("SK", s(&format!("ACHIEVEMENT#{badge}"))),
        ("userId", s(user)),
        ("badgeId", s(badge)),
        ("tier", s(tier)),
        ("score", score),
    ])
}

pub fn profile(user: &str) -> Attrs {
    attrs(&[
        ("PK", s(&format!("USER#{user}"))),
        ("SK", s("PROFILE")),
        ("userId", s(user)),
        ("firstName", s("Sam")),
    ])
}

pub fn email(user: &str, id: &str, address: &str, primary: bool) -> Attrs {
    email_verified(user, id, address, primary, true)
}

pub fn email_verified(user: &str, id: &str, address: &str, primary: bool, verified: bool) -> Attrs {
    attrs(&[
        ("PK", s(&format!("USER#{user}"))),
        ("SK", s(&format!("EMAIL#{id}"))),
        ("userId", s(user)),
        ("emailId", s(id)),
        ("email", s(address)),
        ("isPrimary", Av::Bool(primary)),
        ("isVerified", Av::Bool(verified)),
    ])
}

/// The stream record a write would produce (sequence number `seq`).
pub fn change(seq: u64, kind: ChangeKind, old: Option<&Attrs>, new: Option<&Attrs>) -> Record {
    let image = |attrs: Option<&Attrs>| attrs.map(|a| Item::from(a.clone()));
    let any = new.or(old).expect("an image");
    let mut keys = Item::default();
    for name in ["PK", "SK"] {
        keys.insert(name.to_string(), any[name].clone().into());
    }
    Ok(ChangeRecord {
        event_id: format!("e{seq}"),
        kind,
        keys: keys.into(),
        old_image: image(old).map(Image::from),
        new_image: image(new).map(Image::from),
        sequence_number: SequenceNumber(format!("{seq:021}")),
        approximate_creation_ms: None,
        ttl_expiry: false,
        view_type: Some(ViewType::NewAndOldImages),
        size_bytes: None,
        origin: Origin::Synthetic,
    })
}

pub fn campaign(id: &str, profile: &str, status: &str) -> Attrs {
    attrs(&[
        ("PK", s(&format!("CAMPAIGN#{id}"))),
        ("SK", s("METADATA")),
        ("campaignId", s(id)),
        ("profileId", s(profile)),
        ("status", s(status)),
        ("name", s(&format!("Campaign {id}"))),
    ])
}

/// A campaign's performance snapshot of day `day` (`2026-11-DD`), spend
/// in cents as an exact decimal.
pub fn performance(campaign: &str, day: u64, cents: u64, clicks: u64) -> Attrs {
    let date = format!("2026-11-{:02}", day + 1);
    attrs(&[
        ("PK", s(&format!("CAMPAIGN#{campaign}"))),
        ("SK", s(&format!("PERF#{date}"))),
        ("campaignId", s(campaign)),
        ("date", s(&date)),
        // As DynamoDB keeps a number: no trailing zero after the point.
        (
            "spend",
            support::n_text(
                format!("{}.{:02}", cents / 100, cents % 100)
                    .trim_end_matches('0')
                    .trim_end_matches('.'),
            ),
        ),
        ("clicks", support::n(clicks as i64)),
        (
            "impressions",
            support::n((clicks * 37 + cents % 1000) as i64),
        ),
    ])
}

/// Campaigns created, paused, deleted and created again, and their daily
/// performance snapshots written, rewritten and deleted: the campaign
/// totals move with every one, including snapshots of a campaign whose
/// METADATA is not there (none are written onto it until it is).
pub fn ads_history(history: &mut History, rng: &mut Rng, campaigns: usize, steps: usize) {
    for step in 0..steps {
        let c = format!("c{}", rng.below(campaigns as u64));
        let pk = format!("CAMPAIGN#{c}");
        match rng.below(10) {
            0 | 1 => {
                if history.get(&pk, "METADATA").is_some() && rng.chance(30) {
                    history.delete(&pk, "METADATA");
                } else {
                    let status = ["ENABLED", "PAUSED", "ARCHIVED"][rng.below(3) as usize];
                    let profile = format!("p{}", rng.below(3));
                    history.put(campaign(&c, &profile, status));
                }
            }
            2 => {
                let day = rng.below(20);
                history.delete(&pk, &format!("PERF#2026-11-{:02}", day + 1));
            }
            _ => {
                let day = rng.below(20);
                let cents = rng.below(100_000) + step as u64 % 7;
                history.put(performance(&c, day, cents, rng.below(500)));
            }
        }
    }
}

/// The users of the social history: `star` is the hot one.
pub fn social_users(n: usize) -> Vec<String> {
    let mut users: Vec<String> = (0..n).map(|i| format!("u{i}")).collect();
    users.push("star".to_string());
    users
}

/// Follows, unfollows, re-follows and `followedAt` changes (a third of
/// them on the hot user), and achievement scores.
pub fn social_history(history: &mut History, rng: &mut Rng, users: &[String], steps: usize) {
    let plain = &users[..users.len() - 1];
    for step in 0..steps {
        let a = &plain[rng.below(plain.len() as u64) as usize];
        if rng.chance(8) {
            // Profiles come, change and go: the rollups' targets (the hot
            // user's too).
            let user = if rng.chance(30) { "star" } else { a.as_str() };
            let pk = format!("USER#{user}");
            if history.get(&pk, "PROFILE").is_some() && rng.chance(35) {
                history.delete(&pk, "PROFILE");
            } else {
                let mut item = profile(user);
                item.insert("firstName".to_string(), s(&format!("Sam{step}")));
                history.put(item);
            }
            continue;
        }
        if rng.chance(25) {
            let badge = format!("b{}", rng.below(3));
            let tier = ["gold", "silver", "bronze"][rng.below(3) as usize];
            let score = support::n(rng.below(10_000) as i64);
            history.put(achievement(a, &badge, tier, score));
            continue;
        }
        let b = if rng.chance(35) {
            "star"
        } else {
            let b = &plain[rng.below(plain.len() as u64) as usize];
            if b == a {
                continue;
            }
            b
        };
        let (pk, sk) = (format!("USER#{a}"), format!("FOLLOWS#{b}"));
        if history.get(&pk, &sk).is_none() {
            history.put(follow(a, b, &format!("t{step}")));
        } else if rng.chance(60) {
            history.delete(&pk, &sk);
        } else {
            history.put(follow(a, b, &format!("t{step}-again")));
        }
    }
}

/// Profiles with three emails each; primaries switch as two plain writes
/// (the old one first), addresses change, non-primary emails go and come
/// back. Every user ends with exactly one primary.
pub fn user_history(history: &mut History, rng: &mut Rng, n_users: usize, steps: usize) {
    let users: Vec<String> = (0..n_users).map(|i| format!("v{i}")).collect();
    let mut primary: HashMap<String, usize> = HashMap::new();
    let address = |user: &str, id: usize, version: usize| {
        format!("  {}.E{id}.v{version}@Example.COM ", user.to_uppercase())
    };
    for user in &users {
        history.put(profile(user));
        for id in 0..3 {
            history.put(email(
                user,
                &format!("e{id}"),
                &address(user, id, 0),
                id == 0,
            ));
        }
        primary.insert(user.clone(), 0);
    }
    for step in 1..=steps {
        let user = &users[rng.below(users.len() as u64) as usize];
        let pk = format!("USER#{user}");
        let current = primary[user];
        let id = rng.below(3) as usize;
        let sk = format!("EMAIL#e{id}");
        let existing = history.get(&pk, &sk).cloned();
        match (rng.below(10), existing) {
            (0..=4, Some(new)) if id != current => {
                let old = history
                    .get(&pk, &format!("EMAIL#e{current}"))
                    .cloned()
                    .expect("the primary exists");
                let mut old = old;
                old.insert("isPrimary".into(), Av::Bool(false));
                history.put(old);
                let mut new = new;
                new.insert("isPrimary".into(), Av::Bool(true));
                history.put(new);
                primary.insert(user.clone(), id);
            }
            (5..=7, Some(mut item)) => {
                item.insert("email".into(), s(&address(user, id, step)));
                history.put(item);
            }
            (_, Some(_)) if id != current => history.delete(&pk, &sk),
            (_, None) => history.put(email(
                user,
                &format!("e{id}"),
                &address(user, id, step),
                false,
            )),
            _ => {}
        }
    }
}

/// Writes a history to the table as its writers would, in order: the
/// table's stream then holds its records.
pub async fn write_history(client: &aws_sdk_dynamodb::Client, table: &str, history: &History) {
    for record in history.records.iter().flatten() {
        match &record.new_image {
            Some(image) => put_item(client, table, &image.to_item().into()).await,
            None => delete_item(client, table, record.keys.to_item().into()).await,
        }
    }
}

// ---------------------------------------------------------------- oracle ---

/// Every item of the table but the projector's own bookkeeping.
pub async fn user_items(client: &aws_sdk_dynamodb::Client, table: &str) -> Vec<Attrs> {
    support::scan_all(client, table)
        .await
        .into_iter()
        .filter(|item| !text(item, "PK").is_some_and(|pk| pk.starts_with("_ddbp#")))
        .collect()
}

/// Compares derived state with what the shipped specs compute from the
/// source items of a scan (emails and profiles, follows and counters,
/// achievements, campaigns); returns every difference. Counters are read
/// for every user the items name and for `counted_users` (who may have none),
/// when the spec has the `followers` and `following` counters.
pub async fn check_derived(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    spec: &Spec,
    counted_users: &[String],
) -> Vec<String> {
    let items = user_items(client, table).await;
    let by_key: HashMap<(String, String), &Attrs> = items
        .iter()
        .map(|item| ((text(item, "PK").unwrap(), text(item, "SK").unwrap()), item))
        .collect();
    let mut problems = Vec::new();
    let mut primary: HashMap<String, BTreeMap<String, String>> = HashMap::new();
    let mut profiles = BTreeSet::new();
    let mut followers: BTreeMap<String, i64> = BTreeMap::new();
    let mut following: BTreeMap<String, i64> = BTreeMap::new();
    let mut users: BTreeSet<String> = counted_users.iter().cloned().collect();
    for item in &items {
        let pk = text(item, "PK").unwrap();
        let sk = text(item, "SK").unwrap();
        let gsi = (text(item, "GSI1PK"), text(item, "GSI1SK"));
        if let Some(id) = pk.strip_prefix("CAMPAIGN#") {
            if sk != "METADATA" || spec.projection_id("campaign-gsi1-keys").is_none() {
                continue;
            }
            let expected = (
                text(item, "profileId").map(|profile| format!("PROFILE#{profile}")),
                text(item, "status").map(|status| format!("STATUS#{status}#CAMPAIGN#{id}")),
            );
            if gsi != expected {
                problems.push(format!(
                    "{pk}/{sk}: GSI1 keys {gsi:?}, expected {expected:?}"
                ));
            }
            continue;
        }
        let Some(user) = pk.strip_prefix("USER#") else {
            continue;
        };
        if sk == "PROFILE" {
            profiles.insert(user.to_string());
            if gsi != (None, None) {
                problems.push(format!("{pk}/{sk}: a profile has GSI1 keys {gsi:?}"));
            }
        } else if sk.starts_with("EMAIL#") {
            let address = text(item, "email").unwrap_or_default();
            let expected = (
                Some(format!("EMAIL#{}", address.trim().to_lowercase())),
                Some(format!("USER#{user}")),
            );
            if gsi != expected {
                problems.push(format!(
                    "{pk}/{sk}: GSI1 keys {gsi:?}, expected {expected:?}"
                ));
            }
            if item.get("isPrimary") == Some(&Av::Bool(true)) {
                primary
                    .entry(user.to_string())
                    .or_default()
                    .insert(sk.clone(), address);
            }
        } else if let Some(b) = sk.strip_prefix("FOLLOWS#") {
            *followers.entry(b.to_string()).or_default() += 1;
            *following.entry(user.to_string()).or_default() += 1;
            users.insert(user.to_string());
            users.insert(b.to_string());
            match by_key.get(&(format!("USER#{b}"), format!("FOLLOWED_BY#{user}"))) {
                None => problems.push(format!(
                    "{pk}/{sk}: no inverse edge USER#{b}/FOLLOWED_BY#{user}"
                )),
                Some(edge) if edge.get("followedAt") != item.get("followedAt") => {
                    problems.push(format!(
                        "USER#{b}/FOLLOWED_BY#{user}: followedAt {:?}, the follow has {:?}",
                        edge.get("followedAt"),
                        item.get("followedAt")
                    ))
                }
                Some(_) => {}
            }
        } else if let Some(a) = sk.strip_prefix("FOLLOWED_BY#") {
            users.insert(user.to_string());
            if !by_key.contains_key(&(format!("USER#{a}"), format!("FOLLOWS#{user}"))) {
                problems.push(format!("{pk}/{sk}: an inverse edge without its follow"));
            }
        } else if sk.starts_with("ACHIEVEMENT#") {
            // A score `pad` cannot render derives nothing (it is dead-lettered).
            let expected = match item.get("score") {
                Some(Av::N(score)) => (
                    Some(format!("TIER#{}", text(item, "tier").unwrap_or_default())),
                    Some(format!("SCORE#{score:0>4}")),
                ),
                _ => (None, None),
            };
            if gsi != expected {
                problems.push(format!(
                    "{pk}/{sk}: GSI1 keys {gsi:?}, expected {expected:?}"
                ));
            }
        }
    }
    if spec.projection_id("profile-primary-email").is_some() {
        for user in &profiles {
            let item = by_key[&(format!("USER#{user}"), "PROFILE".to_string())];
            // Several primaries (a violation): the smallest sort key wins.
            let expected = primary
                .get(user)
                .and_then(|by_sk| by_sk.values().next().cloned());
            if text(item, "email") != expected {
                problems.push(format!(
                    "USER#{user}/PROFILE: email {:?}, expected {expected:?}",
                    text(item, "email")
                ));
            }
        }
    }
    // Rollups and aggregates (and the counters they read), as the oracle
    // that reads the spec's TOML computes them: independent of `src/plan`.
    problems.extend(rollups_and_aggregates(client, table, spec).await);
    if spec.projection_id("followers").is_some() {
        let counts = stream::iter(users.iter())
            .map(|user| async move {
                let read = |name: &'static str| async move {
                    let vars = [("userId".to_string(), user.clone())];
                    ddb_projector::counter::read_counter(client, table, spec, name, &vars)
                        .await
                        .expect("read counter")
                };
                (user, read("followers").await, read("following").await)
            })
            .buffer_unordered(8)
            .collect::<Vec<_>>()
            .await;
        for (user, n_followers, n_following) in counts {
            let expected = (
                followers.get(user).copied().unwrap_or(0),
                following.get(user).copied().unwrap_or(0),
            );
            if (n_followers, n_following) != expected {
                problems.push(format!(
                    "{user}: counters (followers, following) = ({n_followers}, {n_following}), expected {expected:?}"
                ));
            }
        }
    }
    problems
}

/// What `oracle.rs` finds wrong with the counters, rollups and aggregates
/// of `spec` (none when it has no rollup or aggregate).
async fn rollups_and_aggregates(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    spec: &Spec,
) -> Vec<String> {
    let mut value = toml::Value::try_from(&spec.raw).expect("the spec as TOML");
    let Some(projections) = value.get_mut("projections").and_then(|p| p.as_array_mut()) else {
        return Vec::new();
    };
    let kind = |p: &toml::Value| p.get("kind").and_then(|k| k.as_str()).map(str::to_string);
    if !projections
        .iter()
        .any(|p| matches!(kind(p).as_deref(), Some("rollup" | "aggregate")))
    {
        return Vec::new();
    }
    projections.retain(|p| matches!(kind(p).as_deref(), Some("counter" | "rollup" | "aggregate")));
    let text = toml::to_string(&value).expect("TOML");
    super::oracle::differences(&text, &support::scan_all(client, table).await)
}

/// Fails with the first differences, if any.
pub fn assert_no_problems(problems: &[String], context: &str) {
    assert!(
        problems.is_empty(),
        "{context}: {} differences, first ones:\n  {}",
        problems.len(),
        problems
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n  ")
    );
}

/// Checks the table against the history's final items too: the source
/// items are exactly what the writers left (the projector never wrote one).
pub async fn assert_converged(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    spec: &Spec,
    counted_users: &[String],
    seed: u64,
) {
    assert_no_problems(
        &check_derived(client, table, spec, counted_users).await,
        &format!("seed {seed}"),
    );
}

pub fn assert_sources_untouched(history: &History, scanned: &[Attrs], seed: u64) {
    let derived = ["GSI1PK", "GSI1SK"];
    // What rollups and aggregates keep on their targets.
    let totals = [
        "followersCount",
        "followingCount",
        "totalSpend",
        "totalClicks",
        "totalImpressions",
        "days",
        "firstDate",
        "lastDate",
    ];
    for (key, wanted) in &history.items {
        let found = scanned
            .iter()
            .find(|item| History::key(item) == *key)
            .unwrap_or_else(|| panic!("seed {seed}: source item {key:?} is gone"));
        // Derived attributes: GSI keys, and the profile's copied email.
        let sources: Attrs = found
            .iter()
            .filter(|(name, _)| {
                !(derived.contains(&name.as_str())
                    || totals.contains(&name.as_str())
                    || name.starts_with("_ddbp#")
                    || key.1 == "PROFILE" && name.as_str() == "email")
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        assert_eq!(&sources, wanted, "seed {seed}: source item {key:?} changed");
    }
}

pub async fn assert_no_dead_letters(applier: &Applier, seed: u64) {
    let letters = applier.dead_letter_store().list().await.expect("list");
    assert!(
        letters.is_empty(),
        "seed {seed}: records that are not poison were dead-lettered: {letters:#?}"
    );
}

// ----------------------------------------------------------------- specs ---

/// A spec with every kind the shipped specs use, over one table, for the
/// runner: emails and profiles, follows with their counters rolled up onto
/// the profiles, achievements, campaigns with their performance totals.
pub const COMBINED_SPEC: &str = r#"
service = "combined-test"

[table]
name = "CombinedTest"
partition_key = "PK"
sort_key = "SK"

[[table.gsi]]
name = "GSI1"
partition_key = "GSI1PK"
sort_key = "GSI1SK"

[entities.profile]
pk = "USER#{userId}"
sk = "PROFILE"

[entities.email]
pk = "USER#{userId}"
sk = "EMAIL#{emailId}"

[entities.follow]
pk = "USER#{followerId}"
sk = "FOLLOWS#{followeeId}"

[entities.followed_by]
pk = "USER#{followeeId}"
sk = "FOLLOWED_BY#{followerId}"

[entities.achievement]
pk = "USER#{userId}"
sk = "ACHIEVEMENT#{badgeId}"

[[projections]]
name = "email-gsi1-keys"
kind = "index-keys"
entity = "email"
set = { GSI1PK = "EMAIL#{lower(trim(email))}", GSI1SK = "USER#{userId}" }

[[projections]]
name = "profile-primary-email"
kind = "denormalize"
source = "email"
target = "profile"
when = { isPrimary = true }
copy = { email = "{email}" }

[[projections]]
name = "followed-by"
kind = "inverse-edge"
source = "follow"
target = "followed_by"
copy = { followedAt = "{followedAt}" }

[[projections]]
name = "followers"
kind = "counter"
source = "follow"
of = { userId = "{followeeId}" }
shards = 8

[[projections]]
name = "following"
kind = "counter"
source = "follow"
of = { userId = "{followerId}" }
shards = 4

[[projections]]
name = "achievement-leaderboard-keys"
kind = "index-keys"
entity = "achievement"
set = { GSI1PK = "TIER#{tier}", GSI1SK = "SCORE#{pad(score, 4)}" }

[[projections]]
name = "followers-count"
kind = "rollup"
counter = "followers"
target = "profile"
attribute = "followersCount"

[[projections]]
name = "following-count"
kind = "rollup"
counter = "following"
target = "profile"
attribute = "followingCount"

[entities.campaign]
pk = "CAMPAIGN#{campaignId}"
sk = "METADATA"

[entities.performance]
pk = "CAMPAIGN#{campaignId}"
sk = "PERF#{date}"

[[projections]]
name = "campaign-gsi1-keys"
kind = "index-keys"
entity = "campaign"
set = { GSI1PK = "PROFILE#{profileId}", GSI1SK = "STATUS#{status}#CAMPAIGN#{campaignId}" }

[[projections]]
name = "campaign-totals"
kind = "aggregate"
source = "performance"
target = "campaign"
set = { totalSpend = "sum(spend)", totalClicks = "sum(clicks)", totalImpressions = "sum(impressions)", days = "count()", firstDate = "min(date)", lastDate = "max(date)" }
"#;

/// What `read_counter` gives for counter `name` of user `user`.
pub async fn user_counter(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    spec: &Spec,
    name: &str,
    user: &str,
) -> i64 {
    ddb_projector::counter::read_counter(
        client,
        table,
        spec,
        name,
        &[("userId".to_string(), user.to_string())],
    )
    .await
    .expect("read counter")
}
