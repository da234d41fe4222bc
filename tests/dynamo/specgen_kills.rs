//! Real kills on a generated spec with every kind: `ddb-projector run`,
//! `backfill` and `prune` as processes, SIGKILLed at random instants while
//! writers write, then run again; the table ends exactly as the oracle
//! (`oracle.rs`, which reads the spec's TOML, not `src/plan`) computes it,
//! the audit is clean, a replay changes nothing and a prune leaves nothing
//! of what it retired. The projections are drawn from a seed
//! (`KILL_SEED`), each kind with its variants: index keys, copies, an
//! inverse edge with a counter riding on it, a counter with markers of
//! its own and a `when`, a rollup and an aggregate.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ddb_projector::spec::Spec;

use super::model::{delete_item, put_item, seed_from_env, Attrs, Rng};
use super::oracle;
use super::specgen::{item, leftovers, spec_toml, Entity, Kind, Projection, Source, When};
use super::support::{self, text};

fn cli(args: &[&str]) -> Command {
    let mut command = Command::new(support::binary());
    command
        .args(args)
        .envs(support::env())
        .env("RUST_LOG", "warn")
        .env("PROJECTOR_LEASE_SECONDS", "1")
        .env("PROJECTOR_BATCH_LIMIT", "40")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

fn with<'a>(args: &[&'a str], spec: &'a Path, table: &'a str) -> Vec<&'a str> {
    let mut all = args.to_vec();
    all.extend_from_slice(&["--spec", spec.to_str().unwrap(), "--table", table]);
    all
}

fn output(args: &[&str]) -> Output {
    cli(args).output().expect("run the binary")
}

fn ok(args: &[&str]) -> Output {
    let out = output(args);
    assert!(
        out.status.success(),
        "{args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// SIGKILLs `child` after `after`, which must still be running then.
async fn kill_after(mut child: Child, after: Duration, what: &str) {
    tokio::time::sleep(after).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "{what} ended before it was killed: {:?}",
        child
            .wait_with_output()
            .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
    );
    child.kill().expect("SIGKILL");
    child.wait().unwrap();
}

/// The spec's projections: every kind, variants from `rng`.
fn projections(rng: &mut Rng) -> Vec<Projection> {
    let when = |rng: &mut Rng| [When::Always, When::Flag, When::KindP][rng.below(3) as usize];
    let edge_when = when(rng);
    let v = |id: u8, kind: Kind| Projection { id, kind };
    vec![
        v(
            0,
            Kind::IndexKeys {
                source: Source::Attr,
                variant: rng.below(3) as u8,
            },
        ),
        v(
            1,
            Kind::Denormalize {
                when: when(rng),
                variant: rng.below(3) as u8,
            },
        ),
        v(
            2,
            Kind::Edge {
                source: Source::Link,
                rev: rng.chance(50),
                when: edge_when,
                variant: rng.below(3) as u8,
            },
        ),
        // Rides on the edge: same source, same `when`.
        v(
            3,
            Kind::Counter {
                source: Source::Link,
                by_b: true,
                when: edge_when,
                shards: 3,
            },
        ),
        v(
            4,
            Kind::Counter {
                source: Source::Attr,
                by_b: rng.chance(50),
                when: When::Flag,
                shards: 2,
            },
        ),
        v(
            5,
            Kind::Rollup {
                counter: 3,
                variant: rng.below(2) as u8,
            },
        ),
        v(
            6,
            Kind::Aggregate {
                when: when(rng),
                variant: rng.below(3) as u8,
                group: rng.chance(50),
            },
        ),
    ]
}

/// One random write of the workload: sources are put and deleted; targets
/// (nodes, tallies, groups) are only created, as writers create them.
fn write(
    rng: &mut Rng,
    created: &mut std::collections::BTreeSet<(String, String)>,
) -> Option<Attrs> {
    let entity = [
        Entity::Attr,
        Entity::Attr,
        Entity::Link,
        Entity::Link,
        Entity::Node,
        Entity::Tally,
        Entity::Group,
    ][rng.below(7) as usize];
    let (a, b) = (rng.below(10) as u8, rng.below(10) as u8);
    let n = (rng.below(4) != 0).then(|| rng.below(3) as u8);
    let f = (rng.below(4) != 0).then(|| rng.chance(50));
    let attrs = item(entity, a, b, rng.below(3) as u8, n, f, rng.chance(50));
    if matches!(entity, Entity::Node | Entity::Tally | Entity::Group) {
        let key = (text(&attrs, "PK").unwrap(), text(&attrs, "SK").unwrap());
        if !created.insert(key) {
            return None;
        }
    }
    Some(attrs)
}

/// The table's items the spec owns, for before and after a replay: not
/// the projector's bookkeeping, and no shard's `changes` stamp (it counts
/// transactions, not state).
async fn owned(client: &aws_sdk_dynamodb::Client, table: &str) -> Vec<Attrs> {
    let mut items: Vec<Attrs> = support::scan_all(client, table)
        .await
        .into_iter()
        .filter(|item| text(item, "PK").is_none_or(|pk| !pk.starts_with("_ddbp#")))
        .map(|mut item| {
            item.remove("changes");
            item
        })
        .collect();
    items.sort_by_key(|item| (text(item, "PK"), text(item, "SK")));
    items
}

fn exact(items: &[Attrs], toml: &str, context: &str) {
    let problems = oracle::differences(toml, items);
    assert!(
        problems.is_empty(),
        "{context}: the table differs from what the spec computes:\n  {}",
        problems.join("\n  ")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_spec_survives_kills_of_run_backfill_and_prune() {
    let started = Instant::now();
    let seed = seed_from_env("KILL_SEED", || 0x0c0f_fee5);
    let mut rng = Rng::new(seed);
    let v1 = projections(&mut rng);
    // v2 adds a projection of each family the backfill must fill; v3
    // retires some of v2's, which the prune removes.
    let mut v2 = v1.clone();
    v2.push(Projection {
        id: 10,
        kind: Kind::IndexKeys {
            source: Source::Link,
            variant: rng.below(3) as u8,
        },
    });
    v2.push(Projection {
        id: 11,
        kind: Kind::Counter {
            source: Source::Attr,
            by_b: true,
            when: When::KindP,
            shards: 4,
        },
    });
    v2.push(Projection {
        id: 12,
        kind: Kind::Aggregate {
            when: When::Always,
            variant: rng.below(3) as u8,
            group: true,
        },
    });
    let retired: Vec<Projection> = v2
        .iter()
        .filter(|p| [0, 4, 6].contains(&p.id))
        .cloned()
        .collect();
    let v3: Vec<Projection> = v2
        .iter()
        .filter(|p| !retired.contains(p))
        .cloned()
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<(String, std::path::PathBuf)> = [&v1, &v2, &v3]
        .iter()
        .enumerate()
        .map(|(i, projections)| {
            let toml = spec_toml(projections);
            let path = dir.path().join(format!("v{}.toml", i + 1));
            std::fs::write(&path, &toml).unwrap();
            (toml, path)
        })
        .collect();
    let spec1 = Arc::new(Spec::from_file(&files[0].1).expect("v1 compiles"));
    eprintln!(
        "seed {seed} (set KILL_SEED={seed} to repeat it)\n{}",
        files[0].0
    );
    let client = support::client().await;
    let table = support::fresh_table(&client, &spec1, "kill-gen").await;

    // `run`, killed at random instants while the writers write.
    let writes = {
        let (client, table) = (client.clone(), table.clone());
        let mut rng = Rng::new(seed ^ 0x77);
        tokio::spawn(async move {
            let mut created = std::collections::BTreeSet::new();
            let mut n = 0;
            for i in 0..1_200 {
                match write(&mut rng, &mut created) {
                    Some(item) if rng.chance(20) && !item.contains_key("title") => {
                        let key = [("PK", item["PK"].clone()), ("SK", item["SK"].clone())]
                            .into_iter()
                            .map(|(k, v)| (k.to_string(), v))
                            .collect();
                        delete_item(&client, &table, key).await;
                    }
                    Some(item) => put_item(&client, &table, &item).await,
                    None => continue,
                }
                n += 1;
                if i % 20 == 19 {
                    tokio::time::sleep(Duration::from_millis(15)).await;
                }
            }
            n
        })
    };
    let checkpoints = super::runner::runner(&client, spec1.clone(), &table).await;
    let (spec_v1, spec_v2, spec_v3) = (&files[0].1, &files[1].1, &files[2].1);
    let mut kills = 0;
    let mut moved = Vec::new();
    while !writes.is_finished() || kills < 4 {
        let child = cli(&with(&["run"], spec_v1, &table)).spawn().unwrap();
        let before = super::runner::checkpointed_records(&checkpoints).await;
        let waited = Instant::now();
        while super::runner::checkpointed_records(&checkpoints).await <= before
            && waited.elapsed() < Duration::from_secs(30)
            && !writes.is_finished()
        {
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        kill_after(child, Duration::from_millis(rng.below(700)), "run").await;
        kills += 1;
        moved.push(super::runner::checkpointed_records(&checkpoints).await);
        assert!(kills < 60, "the writers never finished");
    }
    let written = writes.await.unwrap();
    ok(&with(&["run", "--drain"], spec_v1, &table));
    let items = support::scan_all(&client, &table).await;
    exact(&items, &files[0].0, "v1 after the run's kills");
    eprintln!(
        "{written} writes, {kills} kills of `run`; records checkpointed after each: {moved:?}"
    );
    assert!(
        moved.windows(2).filter(|w| w[1] > w[0]).count() >= 2,
        "the kills did not land while there was work: {moved:?}"
    );
    ok(&with(&["backfill"], spec_v1, &table));
    ok(&with(&["audit"], spec_v1, &table));
    let before = owned(&client, &table).await;
    ok(&with(&["replay"], spec_v1, &table));
    let after = owned(&client, &table).await;
    assert!(before == after, "the replay changed the table");

    // v2 deployed; its backfill killed mid-way, then resumed.
    ok(&with(&["run", "--drain"], spec_v2, &table));
    let backfill = cli(&with(
        &[
            "backfill",
            "--run",
            "bk",
            "--max-wcu",
            "20",
            "--segments",
            "2",
        ],
        spec_v2,
        &table,
    ))
    .spawn()
    .unwrap();
    // Past the wait for v1's leases (a second), into the scan.
    kill_after(
        backfill,
        Duration::from_millis(1_600 + rng.below(1_500)),
        "backfill",
    )
    .await;
    let resumed = ok(&with(&["backfill", "--resume"], spec_v2, &table));
    let resumed = String::from_utf8_lossy(&resumed.stderr).into_owned();
    assert!(
        resumed.contains("bk"),
        "--resume did not continue run bk: {resumed}"
    );
    ok(&with(&["run", "--drain"], spec_v2, &table));
    let items = support::scan_all(&client, &table).await;
    exact(
        &items,
        &files[1].0,
        "v2 after a killed and resumed backfill",
    );
    ok(&with(&["status"], spec_v2, &table));
    ok(&with(&["audit"], spec_v2, &table));

    // v3 retires some: the prune, killed mid-way, then resumed.
    ok(&with(&["run", "--drain"], spec_v3, &table));
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let names: Vec<String> = retired.iter().map(|p| p.name()).collect();
    let mut args = vec!["prune", "--run", "pr", "--max-wcu", "10", "--segments", "2"];
    for name in &names {
        args.extend_from_slice(&["--projection", name]);
    }
    let prune = cli(&with(&args, spec_v3, &table)).spawn().unwrap();
    kill_after(
        prune,
        Duration::from_millis(600 + rng.below(1_000)),
        "prune",
    )
    .await;
    let mut args = vec!["prune", "--resume"];
    for name in &names {
        args.extend_from_slice(&["--projection", name]);
    }
    ok(&with(&args, spec_v3, &table));
    let items = support::scan_all(&client, &table).await;
    let dropped: Vec<&Projection> = retired.iter().collect();
    let left = leftovers(&items, &dropped, &v3);
    assert!(
        left.is_empty(),
        "left after the prune:\n  {}",
        left.join("\n  ")
    );
    exact(&items, &files[2].0, "v3 after a killed and resumed prune");
    ok(&with(&["audit"], spec_v3, &table));
    let _ = client.delete_table().table_name(&table).send().await;
    eprintln!(
        "timing: kills of run, backfill and prune on a generated spec took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
