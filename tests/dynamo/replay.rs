//! What readers see while `replay` runs: each record is a hint that its
//! item changed, and the item is derived as it is now, so a replay never
//! shows an item's past. Readers scan the social table in a loop during
//! the replay and check every scan: no `FOLLOWED_BY#` edge of a follow
//! that is not there, none missing, no counter or rollup off; with writers
//! writing meanwhile, nothing older than the source when the replay began.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue as Av;
use ddb_projector::source::RunOptions;

use super::model::{
    assert_no_problems, check_derived, email, follow, profile, put_item, seed_from_env, Rng,
};
use super::runner::{cli, runner, stderr, summary_value};
use super::support::{self, delete, text};

/// The users: a few, and a hot one many follow.
fn users() -> Vec<String> {
    (0..8)
        .map(|i| format!("u{i}"))
        .chain(["hot".to_string()])
        .collect()
}

fn spec_file() -> PathBuf {
    support::repo().join("projections/social-service.toml")
}

fn seed() -> u64 {
    seed_from_env("REPLAY_TEST_SEED", || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    })
}

/// A pair (follower, followee).
type Pair = (String, String);

/// The follows the source holds: pair to `followedAt`.
type Follows = BTreeMap<Pair, String>;

/// A follow or an unfollow of a random pair (a third of them of the hot
/// user), written; `follows` follows it. `log` is told first.
async fn step(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    rng: &mut Rng,
    users: &[String],
    follows: &mut Follows,
    at: String,
    log: &mut (dyn FnMut(&Pair, Option<&str>) + Send),
) {
    let a = users[rng.below(users.len() as u64 - 1) as usize].clone();
    let b = if rng.below(3) == 0 {
        "hot".to_string()
    } else {
        loop {
            let b = users[rng.below(users.len() as u64 - 1) as usize].clone();
            if b != a {
                break b;
            }
        }
    };
    let pair = (a.clone(), b.clone());
    if rng.below(5) < 3 {
        log(&pair, Some(&at));
        put_item(client, table, &follow(&a, &b, &at)).await;
        follows.insert(pair, at);
    } else if follows.contains_key(&pair) {
        log(&pair, None);
        delete(client, table, &format!("USER#{a}"), &format!("FOLLOWS#{b}")).await;
        follows.remove(&pair);
    }
}

/// A table of the social spec with `ops` follows and unfollows among
/// [`users`] (besides a follow and unfollow of one pair, and a follow,
/// unfollow and follow again of the hot user), drained with `run --drain`
/// and checked exact; the follows it holds.
async fn drained_table(
    client: &aws_sdk_dynamodb::Client,
    prefix: &str,
    ops: usize,
    rng: &mut Rng,
) -> (String, Follows) {
    drained_table_in_pages(client, prefix, ops, rng, None).await
}

/// [`drained_table`], its `run --drain` reading `page` records at a time
/// (`None`: as many as GetRecords gives).
async fn drained_table_in_pages(
    client: &aws_sdk_dynamodb::Client,
    prefix: &str,
    ops: usize,
    rng: &mut Rng,
    page: Option<&str>,
) -> (String, Follows) {
    let spec = support::shipped_spec("social-service.toml");
    let table = support::fresh_table(client, &spec, prefix).await;
    let users = users();
    for user in &users {
        put_item(client, &table, &profile(user)).await;
    }
    let mut follows = Follows::new();
    put_item(client, &table, &follow("u0", "u1", "first")).await;
    delete(client, &table, "USER#u0", "FOLLOWS#u1").await;
    put_item(client, &table, &follow("u2", "hot", "first")).await;
    delete(client, &table, "USER#u2", "FOLLOWS#hot").await;
    put_item(client, &table, &follow("u2", "hot", "again")).await;
    follows.insert(("u2".to_string(), "hot".to_string()), "again".to_string());
    for i in 0..ops {
        step(
            client,
            &table,
            rng,
            &users,
            &mut follows,
            format!("t{i}"),
            &mut |_, _| {},
        )
        .await;
    }
    let mut command = cli(&[
        "run",
        "--drain",
        "--spec",
        spec_file().to_str().unwrap(),
        "--table",
        &table,
    ]);
    if let Some(page) = page {
        command.env("PROJECTOR_BATCH_LIMIT", page);
    }
    let output = command.output().expect("run the binary");
    assert!(output.status.success(), "run --drain: {}", stderr(&output));
    assert_no_problems(
        &check_derived(client, &table, &spec, &users).await,
        "the drained table",
    );
    let seen = observe(client, &table).await;
    assert_no_problems(&seen.differences(&follows), "the drained table's scan");
    (table, follows)
}

/// What one scan of the table showed a reader.
#[derive(Debug, Default, Clone, PartialEq)]
struct Seen {
    /// `FOLLOWED_BY#` edges: pair to `followedAt`.
    edges: BTreeMap<Pair, Option<String>>,
    /// Profiles' rollups: user to (followersCount, followingCount).
    profiles: BTreeMap<String, (i64, i64)>,
    /// Counters summed from their shards: (counter, user) to the sum.
    counters: BTreeMap<(String, String), i64>,
    /// Each shard's `changes` stamp: shard key to stamp.
    changes: BTreeMap<String, String>,
}

/// One scan of the whole table, consistent, page after page.
async fn observe(client: &aws_sdk_dynamodb::Client, table: &str) -> Seen {
    let mut seen = Seen::default();
    for item in &support::scan_all(client, table).await {
        let (Some(pk), Some(sk)) = (text(item, "PK"), text(item, "SK")) else {
            continue;
        };
        let number = |name: &str| match item.get(name) {
            Some(Av::N(n)) => n.parse::<i64>().expect("a number"),
            _ => 0,
        };
        if let (Some(b), Some(a)) = (pk.strip_prefix("USER#"), sk.strip_prefix("FOLLOWED_BY#")) {
            seen.edges
                .insert((a.to_string(), b.to_string()), text(item, "followedAt"));
        } else if let (Some(user), "PROFILE") = (pk.strip_prefix("USER#"), sk.as_str()) {
            seen.profiles.insert(
                user.to_string(),
                (number("followersCount"), number("followingCount")),
            );
        } else if let Some(rest) = pk.strip_prefix("COUNTER#") {
            let parts: Vec<&str> = rest.split('#').collect();
            if let [counter, user, _shard] = parts[..] {
                *seen
                    .counters
                    .entry((counter.to_string(), user.to_string()))
                    .or_default() += number("count");
                seen.changes
                    .insert(pk.clone(), text(item, "changes").unwrap_or_default());
            }
        }
    }
    seen
}

impl Seen {
    /// How the scan differs from what `follows` derives.
    fn differences(&self, follows: &Follows) -> Vec<String> {
        let mut problems = Vec::new();
        for (pair, at) in follows {
            match self.edges.get(pair) {
                None => problems.push(format!("{pair:?}: the follow's edge is missing")),
                Some(seen) if seen.as_deref() != Some(at.as_str()) => problems.push(format!(
                    "{pair:?}: followedAt {seen:?}, the follow has {at}"
                )),
                Some(_) => {}
            }
        }
        for (pair, at) in &self.edges {
            if !follows.contains_key(pair) {
                problems.push(format!(
                    "{pair:?}: an edge (followedAt {at:?}) of a follow that does not exist"
                ));
            }
        }
        for user in users() {
            let followers = follows.keys().filter(|(_, b)| *b == user).count() as i64;
            let following = follows.keys().filter(|(a, _)| *a == user).count() as i64;
            let rollups = self.profiles.get(&user).copied().unwrap_or_default();
            if rollups != (followers, following) {
                problems.push(format!(
                    "{user}: the profile shows (followersCount, followingCount) {rollups:?}, the follows make {:?}",
                    (followers, following)
                ));
            }
            for (counter, count) in [("followers", followers), ("following", following)] {
                let sum = self.counter(counter, &user);
                if sum != count {
                    problems.push(format!(
                        "{user}: the {counter} shards sum to {sum}, the follows make {count}"
                    ));
                }
            }
        }
        problems
    }

    /// How `later` differs from this scan: edges, rollups and shard sums
    /// (shards' `changes` stamps included).
    fn differences_from(&self, later: &Seen) -> Vec<String> {
        let mut problems = Vec::new();
        let pairs: BTreeSet<&Pair> = self.edges.keys().chain(later.edges.keys()).collect();
        for pair in pairs {
            let (was, is) = (self.edges.get(pair), later.edges.get(pair));
            if was != is {
                problems.push(format!("{pair:?}: the edge was {was:?}, then {is:?}"));
            }
        }
        for (user, rollups) in &later.profiles {
            let was = self.profiles.get(user).copied().unwrap_or_default();
            if was != *rollups {
                problems.push(format!(
                    "{user}: the profile shows {rollups:?}, it showed {was:?}"
                ));
            }
        }
        for (key, sum) in &later.counters {
            let was = self.counters.get(key).copied().unwrap_or_default();
            if was != *sum {
                problems.push(format!(
                    "{key:?}: the shards sum to {sum}, they summed to {was}"
                ));
            }
        }
        if self.changes != later.changes {
            problems.push("counter shards moved on the shards".to_string());
        }
        problems
    }

    fn counter(&self, counter: &str, user: &str) -> i64 {
        self.counters
            .get(&(counter.to_string(), user.to_string()))
            .copied()
            .unwrap_or(0)
    }
}

/// Scans the table in a loop while `replay` (with `extra` arguments, 20
/// records a page so that an item's records fall in several pages) runs;
/// each scan goes to `check`. Returns the replay's stderr and the scans.
async fn scan_during_replay(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    extra: &[&str],
    check: impl FnMut(&Seen),
) -> (String, usize) {
    scan_during(client, table, &["replay"], extra, check).await
}

/// Scans the table in a loop while the command `verb` (with `extra`
/// arguments, 20 records a page) runs over the social spec; each scan
/// goes to `check`. Returns the command's stderr and the scans.
async fn scan_during(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    verb: &[&str],
    extra: &[&str],
    mut check: impl FnMut(&Seen),
) -> (String, usize) {
    let mut args: Vec<String> = verb.iter().map(|a| a.to_string()).collect();
    args.extend([
        "--spec".to_string(),
        spec_file().to_str().unwrap().to_string(),
        "--table".to_string(),
        table.to_string(),
    ]);
    args.extend(extra.iter().map(|a| a.to_string()));
    // Made here: the DynamoDB Local a test uses depends on its thread.
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut command = cli(&args);
    command.env("PROJECTOR_BATCH_LIMIT", "20");
    let running = tokio::task::spawn_blocking(move || command.output().expect("run the binary"));
    let mut scans = 0;
    while !running.is_finished() {
        check(&observe(client, table).await);
        scans += 1;
    }
    let output = running.await.expect("the command's thread");
    let log = stderr(&output);
    assert!(output.status.success(), "{verb:?} failed: {log}");
    eprintln!("{log}");
    (log, scans)
}

/// How many of `problems` concern edges, profiles' rollups and shards.
fn tally(problems: &[String]) -> String {
    let count = |needle: &str| problems.iter().filter(|p| p.contains(needle)).count();
    format!(
        "{} about edges, {} about profiles' rollups, {} about shard sums",
        problems.len() - count(" on the ") - count("the profile shows") - count("shards sum"),
        count("the profile shows") + count(" on the profile"),
        count("shards sum") + count(" on the shards"),
    )
}

/// A replay (of `extra`'s selection) of an exact table, idle writers: every
/// scan a reader makes equals what the follows derive, the replay writes
/// nothing and moves no shard.
async fn replay_of_an_exact_table(prefix: &str, extra: &[&str]) {
    let started = Instant::now();
    let client = support::client().await;
    let seed = seed();
    eprintln!("seed {seed} (REPLAY_TEST_SEED)");
    let mut rng = Rng::new(seed);
    let (table, follows) = drained_table(&client, prefix, 600, &mut rng).await;
    let before = observe(&client, &table).await;
    let mut problems = Vec::new();
    let mut bad_scans = 0;
    let (log, scans) = scan_during_replay(&client, &table, extra, |seen| {
        let found = seen.differences(&follows);
        if !found.is_empty() {
            bad_scans += 1;
            problems.extend(found);
        }
    })
    .await;
    eprintln!(
        "{scans} scans during the replay, {bad_scans} showing {} differences ({}); the replay took {:.1} s of {:.1} s",
        problems.len(),
        tally(&problems),
        summary_value(&log, "elapsed"),
        started.elapsed().as_secs_f64()
    );
    assert!(
        scans >= 2,
        "the reader scanned {scans} times during the replay"
    );
    assert_no_problems(&problems, "what readers saw during the replay");
    assert_eq!(summary_value(&log, "writes"), 0.0, "{log}");
    assert!(summary_value(&log, "items read") > 0.0, "{log}");
    let after = observe(&client, &table).await;
    let moved: Vec<String> = before
        .changes
        .iter()
        .filter(|(shard, stamp)| after.changes.get(*shard) != Some(stamp))
        .map(|(shard, stamp)| format!("{shard}: changes {stamp} -> {:?}", after.changes.get(shard)))
        .collect();
    assert_no_problems(&moved, "counter shards the replay moved");
    assert_eq!(before, after, "the replay changed the table");
    eprintln!(
        "timing: {prefix} took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test]
async fn a_replay_of_an_exact_table_writes_nothing_and_readers_never_see_the_past() {
    replay_of_an_exact_table("replay-exact", &[]).await;
}

#[tokio::test]
async fn a_replay_of_one_projection_writes_nothing_and_readers_never_see_the_past() {
    replay_of_an_exact_table("replay-one", &["--projection", "followers"]).await;
}

/// Every state a pair's follow had from when the replay began: the state
/// then, then each the writer wrote (`None`: no follow).
type Versions = BTreeMap<Pair, Vec<Option<String>>>;

/// What a scan shows that no state of the source since the replay began
/// derives: an edge or its absence that no version of its pair has, a
/// count outside what the versions allow (a pair counts when every
/// version follows; may count when one does).
fn older_than(seen: &Seen, versions: &Versions) -> Vec<String> {
    let mut problems = Vec::new();
    let pairs: BTreeSet<&Pair> = versions.keys().chain(seen.edges.keys()).collect();
    for pair in pairs {
        let state = seen.edges.get(pair).cloned().flatten();
        let shown = seen.edges.contains_key(pair);
        let allowed = versions.get(pair).map(Vec::as_slice).unwrap_or(&[None]);
        let fits = allowed.iter().any(|version| match version {
            None => !shown,
            Some(at) => shown && state.as_deref() == Some(at.as_str()),
        });
        if !fits {
            problems.push(format!(
                "{pair:?}: shows {:?}, and the follow since the replay began was {allowed:?}",
                shown.then_some(state)
            ));
        }
    }
    for user in users() {
        for (counter, rollup) in [("followers", 0), ("following", 1)] {
            let of = |pair: &Pair| {
                if counter == "followers" {
                    pair.1 == user
                } else {
                    pair.0 == user
                }
            };
            let mut low = 0;
            let mut high = 0;
            for (pair, states) in versions {
                if of(pair) {
                    low += states.iter().all(Option::is_some) as i64;
                    high += states.iter().any(Option::is_some) as i64;
                }
            }
            let rollups = seen.profiles.get(&user).copied().unwrap_or_default();
            let shown = [
                ("shards", seen.counter(counter, &user)),
                ("profile", [rollups.0, rollups.1][rollup]),
            ];
            for (where_, value) in shown {
                if value < low || value > high {
                    problems.push(format!(
                        "{user}: {counter} {value} on the {where_}, the follows since the replay began allow {low} to {high}"
                    ));
                }
            }
        }
    }
    problems
}

#[tokio::test]
async fn while_writers_write_a_replay_shows_readers_only_states_since_it_began() {
    let started = Instant::now();
    let client = support::client().await;
    let seed = seed();
    eprintln!("seed {seed} (REPLAY_TEST_SEED)");
    let mut rng = Rng::new(seed);
    let (table, follows) = drained_table(&client, "replay-live", 600, &mut rng).await;
    let mut versions: Versions = follows
        .iter()
        .map(|(pair, at)| (pair.clone(), vec![Some(at.clone())]))
        .collect();
    // Pairs followed once and not now start unfollowed.
    for a in users() {
        for b in users() {
            versions.entry((a.clone(), b)).or_insert_with(|| vec![None]);
        }
    }
    let versions = Arc::new(Mutex::new(versions));

    // The live worker, tailing the stream.
    let spec = support::shipped_spec("social-service.toml");
    let live = runner(&client, spec.clone(), &table).await;
    let (stop_live, live_stopped) = tokio::sync::oneshot::channel::<()>();
    let live_run = live.run(
        RunOptions {
            poll_interval: Duration::from_millis(100),
            ..RunOptions::follow()
        },
        async {
            let _ = live_stopped.await;
        },
    );
    // A writer, until the replay ends.
    let writing = Arc::new(AtomicBool::new(true));
    let writer = {
        let (client, table, writing, versions) = (
            client.clone(),
            table.clone(),
            writing.clone(),
            versions.clone(),
        );
        let mut follows = follows.clone();
        let mut rng = Rng::new(seed ^ 0x5eed);
        tokio::spawn(async move {
            let users = users();
            let mut n = 0;
            // Bounded: the replay reads on until it has caught up.
            while writing.load(Ordering::Relaxed) && n < 200 {
                let mut log = |pair: &Pair, state: Option<&str>| {
                    versions
                        .lock()
                        .unwrap()
                        .entry(pair.clone())
                        .or_insert_with(|| vec![None])
                        .push(state.map(str::to_string));
                };
                step(
                    &client,
                    &table,
                    &mut rng,
                    &users,
                    &mut follows,
                    format!("w{n}"),
                    &mut log,
                )
                .await;
                n += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            n
        })
    };
    // A scan is checked against the versions logged when it ended: the
    // writer logs a version before it writes it, so every state the scan
    // can show a derivation of is among them.
    let mut problems = Vec::new();
    let mut bad_scans = 0;
    let scenario = async {
        let (log, scans) = scan_during_replay(&client, &table, &[], |scan| {
            let found = older_than(scan, &versions.lock().unwrap());
            if !found.is_empty() {
                bad_scans += 1;
                problems.extend(found);
            }
        })
        .await;
        writing.store(false, Ordering::Relaxed);
        let written = writer.await.expect("the writer");
        // Let the live worker apply the last writes, then stop it.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let _ = stop_live.send(());
        (log, scans, written)
    };
    let (live_result, (log, scans, written)) = tokio::join!(live_run, scenario);
    let live_summary = live_result.expect("the live worker");
    eprintln!(
        "{scans} scans during the replay; the writer wrote {written} changes meanwhile; the live worker applied {} records",
        live_summary.records
    );
    assert!(
        scans >= 2,
        "the reader scanned {scans} times during the replay"
    );
    assert!(written > 0, "the writer wrote nothing during the replay");
    let versions = versions.lock().unwrap().clone();
    eprintln!(
        "{bad_scans} of {scans} scans showed {} states older than the replay's start ({}); the replay wrote {}, read {} items",
        problems.len(),
        tally(&problems),
        summary_value(&log, "writes"),
        summary_value(&log, "items read"),
    );
    assert_no_problems(&problems, "what readers saw during the replay");

    // The end state is exact once the stream is drained.
    let output = cli(&[
        "run",
        "--drain",
        "--spec",
        spec_file().to_str().unwrap(),
        "--table",
        &table,
    ])
    .output()
    .expect("run the binary");
    assert!(output.status.success(), "run --drain: {}", stderr(&output));
    assert_no_problems(
        &check_derived(&client, &table, &spec, &users()).await,
        "the table after the replay and the writes",
    );
    let last: Follows = versions
        .iter()
        .filter_map(|(pair, states)| {
            let at = states.last().cloned().flatten()?;
            Some((pair.clone(), at))
        })
        .collect();
    assert_no_problems(
        &observe(&client, &table).await.differences(&last),
        "the table's scan after the replay and the writes",
    );
    eprintln!(
        "timing: while_writers_write_a_replay_shows_readers_only_states_since_it_began took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// A runner's checkpoints are deleted after it drained the table, and
/// `run --drain` reads the whole stream again (20 records a page) while a
/// reader scans. Drained in pages of `page` records: `None` leaves the
/// stream's records in a page or two, so the first run's checkpoint stayed
/// where the restart starts, and its entry in the ledger of deliveries
/// says what it held; 20 leaves its checkpoint far ahead, and the restart,
/// finding itself behind, applies its items as they are now until caught
/// up. Either way readers see the table exact on every scan, no shard
/// moves.
async fn restarted_runner_shows_no_past(prefix: &str, page: Option<&str>) {
    let started = Instant::now();
    let client = support::client().await;
    let seed = seed();
    eprintln!("seed {seed} (REPLAY_TEST_SEED)");
    let mut rng = Rng::new(seed);
    let (table, follows) = drained_table_in_pages(&client, prefix, 300, &mut rng, page).await;
    for item in support::scan_all(&client, &table).await {
        if text(&item, "PK").as_deref() == Some("_ddbp#checkpoint") {
            delete(
                &client,
                &table,
                "_ddbp#checkpoint",
                &text(&item, "SK").unwrap(),
            )
            .await;
        }
    }
    let before = observe(&client, &table).await;
    let mut problems = Vec::new();
    let mut bad_scans = 0;
    let (log, scans) = scan_during(&client, &table, &["run", "--drain"], &[], |seen| {
        let found = seen.differences(&follows);
        if !found.is_empty() {
            bad_scans += 1;
            problems.extend(found);
        }
    })
    .await;
    eprintln!(
        "{scans} scans while the restarted runner read the stream again, {bad_scans} showing {} differences ({}); it read {} items as they are now",
        problems.len(),
        tally(&problems),
        summary_value(&log, "items read"),
    );
    assert!(summary_value(&log, "records") > 300.0, "{log}");
    assert!(scans >= 2, "the reader scanned {scans} times");
    assert_no_problems(&problems, "what readers saw while the runner read again");
    assert_eq!(
        before,
        observe(&client, &table).await,
        "the runner changed the table"
    );
    if page.is_some() {
        assert!(
            summary_value(&log, "items read") > 0.0,
            "caught up as a replay: {log}"
        );
    }
    eprintln!(
        "timing: {prefix} took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test]
async fn a_runner_restarted_behind_what_it_applied_never_shows_the_past() {
    restarted_runner_shows_no_past("restart-ledger", None).await;
}

#[tokio::test]
async fn a_runner_restarted_behind_its_checkpoints_catches_up_as_a_replay() {
    restarted_runner_shows_no_past("restart-behind", Some("20")).await;
}

/// Lambda bisects a batch that failed and sends its first half alone. A
/// batch applied whole by an invocation that then timed out comes again
/// in halves and quarters, as bisection sends it, before the next batch:
/// after every invocation readers see what the whole batch left (no
/// follow its unfollow had removed comes back, no counter moves), and the
/// table ends exact.
#[tokio::test]
async fn a_bisected_batch_sent_again_never_shows_the_past() {
    use ddb_projector::lambda::event::{Payload, StreamsEvent};
    use ddb_projector::lambda::{Handler, Response};

    let started = Instant::now();
    let client = support::client().await;
    let seed = seed();
    eprintln!("seed {seed} (REPLAY_TEST_SEED)");
    let mut rng = Rng::new(seed);
    let spec = support::shipped_spec("social-service.toml");
    let table = support::fresh_table(&client, &spec, "bisected").await;
    let users = users();
    for user in &users {
        put_item(&client, &table, &profile(user)).await;
    }
    let mut follows = Follows::new();
    for i in 0..400 {
        step(
            &client,
            &table,
            &mut rng,
            &users,
            &mut follows,
            format!("t{i}"),
            &mut |_, _| {},
        )
        .await;
    }
    let (arn, shard, records) = super::recover::stream(&client, &table).await;
    let records: Vec<_> = records
        .iter()
        .enumerate()
        .map(|(i, r)| ddb_projector::decode::decode_stream_record(i, &shard, r))
        .collect();
    let handler = Handler {
        specs: spec.clone().into(),
        client: client.clone(),
        table: Some(table.clone()),
        margin: Duration::from_millis(1500),
        config: Default::default(),
        metrics: None,
        process_started: std::time::SystemTime::now(),
        registered: None,
        regions: Default::default(),
    };
    let mut invocations = 0;
    let mut problems = Vec::new();
    // Lambda's default batch of 100.
    for batch in records.chunks(100) {
        let (h, q) = (batch.len() / 2, batch.len() / 4);
        let mut left = None;
        for part in [batch, &batch[..h], &batch[..q], &batch[q..h], &batch[h..]] {
            if part.is_empty() {
                continue;
            }
            invocations += 1;
            let mut context = lambda_runtime::Context::default();
            context.request_id = format!("r{invocations}");
            context.deadline = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64
                + 60_000;
            let payload =
                Payload::Stream(StreamsEvent::from_records(part.to_vec(), Some(arn.clone())));
            let answer =
                Box::pin(handler.handle(lambda_runtime::LambdaEvent::new(payload, context)))
                    .await
                    .expect("an invocation");
            let Response::Stream(answer) = answer else {
                panic!("a stream answer");
            };
            assert!(answer.batch_item_failures.is_empty(), "{answer:?}");
            let seen = observe(&client, &table).await;
            match &left {
                None => left = Some(seen),
                Some(left) => {
                    let mut found = left.differences_from(&seen);
                    problems.append(&mut found);
                }
            }
        }
    }
    eprintln!(
        "{} records, {invocations} invocations; {} differences from what the whole batch left ({})",
        records.len(),
        problems.len(),
        tally(&problems)
    );
    assert_no_problems(&problems, "what readers saw between the invocations");
    assert_no_problems(
        &observe(&client, &table).await.differences(&follows),
        "the table once every batch is applied",
    );
    eprintln!(
        "timing: bisected took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// What readers read of the user-service's derived attributes: each
/// source item's key to its `GSI1PK`, `GSI1SK` and (profiles) `email`.
async fn derived_attributes(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
) -> BTreeMap<Pair, [Option<String>; 3]> {
    support::scan_all(client, table)
        .await
        .iter()
        .filter_map(|item| {
            let pk = text(item, "PK")?;
            (!pk.starts_with("_ddbp#")).then(|| {
                (
                    (pk, text(item, "SK").unwrap_or_default()),
                    [
                        text(item, "GSI1PK"),
                        text(item, "GSI1SK"),
                        text(item, "email"),
                    ],
                )
            })
        })
        .collect()
}

/// `dlq redrive`, the operator's repair lever, while a reader scans. The
/// letters are emails whose address no template renders (a map), each
/// then deleted or written again right, and held behind its letter until
/// the redrive. Every scan during the redrive shows each item's derived
/// attributes as before the redrive or as after it, never a third state
/// (an older one, or one on the way), and the table ends exact.
#[tokio::test]
async fn a_redrive_shows_readers_each_item_as_before_or_after_it() {
    let started = Instant::now();
    let client = support::client().await;
    let spec = support::shipped_spec("user-service.toml");
    let table = support::fresh_table(&client, &spec, "redrive-readers").await;
    let spec_path = support::repo().join("projections/user-service.toml");
    let spec_arg = spec_path.to_str().unwrap().to_string();
    let drain = |table: &str| {
        let output = cli(&["run", "--drain", "--spec", &spec_arg, "--table", table])
            .output()
            .expect("run the binary");
        assert!(output.status.success(), "{}", stderr(&output));
        summary_value(&stderr(&output), "dead letters")
    };
    let users: Vec<String> = (0..12).map(|i| format!("u{i}")).collect();
    for user in &users {
        put_item(&client, &table, &profile(user)).await;
        put_item(
            &client,
            &table,
            &email(user, "e1", &format!("{user}@x.org"), true),
        )
        .await;
    }
    let poison = || Av::M([("not".to_string(), Av::S("text".to_string()))].into());
    for user in &users {
        let mut bad = email(user, "e2", "", false);
        bad.insert("email".to_string(), poison());
        put_item(&client, &table, &bad).await;
    }
    let mut letters = drain(&table);
    let mut rng = Rng::new(seed());
    for user in &users {
        if rng.below(2) == 0 {
            delete(&client, &table, &format!("USER#{user}"), "EMAIL#e2").await;
        } else {
            put_item(
                &client,
                &table,
                &email(user, "e2", &format!(" {user}.Work@X.org "), false),
            )
            .await;
        }
    }
    letters += drain(&table);
    assert!(letters >= users.len() as f64, "{letters} letters");
    let before = derived_attributes(&client, &table).await;
    let mut args: Vec<String> = ["dlq", "redrive", "--spec", &spec_arg, "--table", &table]
        .iter()
        .map(|a| a.to_string())
        .collect();
    args.shrink_to_fit();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut command = cli(&args);
    let running = tokio::task::spawn_blocking(move || command.output().expect("run the binary"));
    let mut scans = Vec::new();
    while !running.is_finished() {
        scans.push(derived_attributes(&client, &table).await);
    }
    let output = running.await.expect("the redrive's thread");
    assert!(output.status.success(), "{}", stderr(&output));
    let after = derived_attributes(&client, &table).await;
    let mut problems = Vec::new();
    for seen in &scans {
        let keys: BTreeSet<&Pair> = before
            .keys()
            .chain(after.keys())
            .chain(seen.keys())
            .collect();
        for key in keys {
            let (b, a, s) = (before.get(key), after.get(key), seen.get(key));
            if s != b && s != a {
                problems.push(format!("{key:?}: seen {s:?}, before {b:?}, after {a:?}"));
            }
        }
    }
    eprintln!(
        "{} scans during a redrive of {letters} letters, {} outside before-or-after; {:.1} s",
        scans.len(),
        problems.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        !scans.is_empty(),
        "the reader never scanned during the redrive"
    );
    assert_no_problems(&problems, "what readers saw during the redrive");
    assert_ne!(
        before, after,
        "the redrive changed nothing: the test tests nothing"
    );
    assert_no_problems(
        &check_derived(&client, &table, &spec, &[]).await,
        "the table after the redrive",
    );
}

/// One resume model for `replay`: `--resume` continues the last replay of
/// the stream from the positions it kept in the table (a replay `r1`
/// stopped after it had read every record reads none again: a reverse
/// edge deleted since stays missing), deletes them once caught up, and
/// `--resume` after it starts a new replay, which repairs the edge.
#[tokio::test]
async fn replay_resume_continues_from_the_positions_the_last_replay_kept() {
    use ddb_projector::control::{Job, Runs};
    use ddb_projector::spec::Spec;
    let client = support::client().await;
    let mut rng = Rng::new(seed());
    let (table, follows) = drained_table(&client, "replay-resume", 40, &mut rng).await;
    let spec = Spec::from_file(&spec_file()).unwrap();
    // The consumer's checkpoints, copied as the positions of replay `r1`
    // that read to where the stream ends, then stopped.
    let checkpoints = client
        .query()
        .table_name(&table)
        .key_condition_expression("PK = :pk")
        .expression_attribute_values(":pk", Av::S("_ddbp#checkpoint".into()))
        .send()
        .await
        .unwrap();
    assert!(checkpoints.count() > 0);
    for item in checkpoints.items() {
        let mut item = item.clone();
        item.insert("PK".into(), Av::S("_ddbp#replay#r1".into()));
        client
            .put_item()
            .table_name(&table)
            .set_item(Some(item))
            .send()
            .await
            .unwrap();
    }
    let scope = format!("{table}#stream#*");
    let runs = Runs::new(client.clone(), &table, &spec.table);
    runs.choose(Job::Replay, &scope, Some("r1"), false, &mut |_| {})
        .await
        .unwrap();
    let ((a, b), _) = follows.iter().next().expect("a follow");
    let edge = (format!("USER#{b}"), format!("FOLLOWED_BY#{a}"));
    delete(&client, &table, &edge.0, &edge.1).await;
    let spec_path = spec_file();
    let replay = |extra: &[&str]| {
        let mut args = vec![
            "replay",
            "--spec",
            spec_path.to_str().unwrap(),
            "--table",
            &table,
        ];
        args.extend_from_slice(extra);
        cli(&args).output().expect("run the binary")
    };
    let resumed = replay(&["--resume"]);
    let log = stderr(&resumed);
    assert!(resumed.status.success(), "{log}");
    assert!(log.contains("resuming replay `r1`"), "{log}");
    // What it reads is what was written since: the bookkeeping and the
    // deleted edge, no change of a source item.
    assert_eq!(summary_value(&log, "items read"), 0.0, "{log}");
    assert!(
        support::get(&client, &table, &edge.0, &edge.1)
            .await
            .is_none(),
        "the resumed replay read records before its positions"
    );
    let left = client
        .query()
        .table_name(&table)
        .key_condition_expression("PK = :pk")
        .expression_attribute_values(":pk", Av::S("_ddbp#replay#r1".into()))
        .send()
        .await
        .unwrap();
    assert_eq!(left.count(), 0, "{:?}", left.items());
    assert!(runs.last(Job::Replay, &scope).await.unwrap().unwrap().done);

    let again = replay(&["--resume"]);
    let log = stderr(&again);
    assert!(again.status.success(), "{log}");
    assert!(
        log.contains("the last replay, `r1`, ran to its end: starting `replay-"),
        "{log}"
    );
    assert!(summary_value(&log, "items read") > 0.0, "{log}");
    assert!(
        support::get(&client, &table, &edge.0, &edge.1)
            .await
            .is_some(),
        "the new replay did not derive the edge again"
    );
}
