//! Service registrations (`register`, `unregister`, `specs`): what a
//! service team's CI does, against a worker serving the table's registry.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue as Av;
use ddb_projector::control::{self, Registrations, Written};
use serde_json::Value;

use super::oracle;
use super::support::{self, repo, s};

type Attrs = std::collections::HashMap<String, Av>;

/// The environment of every child: DynamoDB Local, short leases, and a
/// registry read every 300 ms.
fn env() -> Vec<(&'static str, String)> {
    let mut env = support::env();
    env.push(("PROJECTOR_LEASE_SECONDS", "1".to_string()));
    env.push(("PROJECTOR_REGISTRY_POLL_SECONDS", "0.3".to_string()));
    env.push(("RUST_LOG", "warn".to_string()));
    env
}

fn cli(args: &[&str]) -> Output {
    cli_in(env(), args)
}

/// `cli` with the environment `env()` gave (the test thread's DynamoDB
/// Local: another thread may be given another).
fn cli_in(env: Vec<(&'static str, String)>, args: &[&str]) -> Output {
    Command::new(support::binary())
        .args(args)
        .envs(env)
        .env_remove("PROJECTOR_SPEC")
        .env_remove("PROJECTOR_TABLE")
        .stdin(Stdio::null())
        .output()
        .expect("run the binary")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The runner serving `table`'s registry (no spec file).
struct Runner(Child);

impl Runner {
    fn start(table: &str) -> Runner {
        Runner(
            Command::new(support::binary())
                .args(["run", "--table", table])
                .envs(env())
                .env_remove("PROJECTOR_SPEC")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn the runner"),
        )
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A shipped spec's text, describing `table`.
fn shipped_for(name: &str, table: &str) -> String {
    let text = std::fs::read_to_string(repo().join("projections").join(name)).unwrap();
    let spec_table = text
        .lines()
        .find_map(|line| line.strip_prefix("name = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .expect("a [table] name")
        .to_string();
    text.replace(
        &format!("name = \"{spec_table}\""),
        &format!("name = \"{table}\""),
    )
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn register(spec: &Path, table: &str, extra: &[&str]) -> Output {
    cli(&[
        &[
            "register",
            "--spec",
            spec.to_str().unwrap(),
            "--table",
            table,
        ][..],
        extra,
    ]
    .concat())
}

/// The projections `status --table` reports: name, state, deployed.
fn status(table: &str) -> (i32, Vec<(String, String, bool)>) {
    let output = cli(&["status", "--table", table, "--format", "json"]);
    let code = output.status.code().unwrap_or(-1);
    let value: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|_| panic!("status JSON: {}", stderr(&output)));
    let rows = value["projections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            (
                row["name"].as_str().unwrap().to_string(),
                row["state"].as_str().unwrap().to_string(),
                row["deployed"].as_bool().unwrap(),
            )
        })
        .collect();
    (code, rows)
}

/// Waits until the table's worker runs every one of `names` (and none of
/// `gone`).
fn wait_served(table: &str, names: &[&str], gone: &[&str]) {
    let started = Instant::now();
    loop {
        let (_, rows) = status(table);
        let runs = |name: &str| rows.iter().any(|r| r.0 == name && r.2);
        if names.iter().all(|n| runs(n)) && gone.iter().all(|n| !runs(n)) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the worker did not serve the registration: {rows:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The spec registered for `table`, as TOML the oracle reads.
async fn registered_toml(client: &aws_sdk_dynamodb::Client, table: &str) -> String {
    let (spec, _) = control::registered_spec(client, table).await.unwrap();
    toml::to_string(&spec.raw).unwrap()
}

/// Waits until the table is what the registered specs compute from its
/// source items (the runner drains behind the writes).
async fn wait_exact(client: &aws_sdk_dynamodb::Client, table: &str) {
    let toml = registered_toml(client, table).await;
    let started = Instant::now();
    loop {
        let problems = oracle::differences(&toml, &support::scan_all(client, table).await);
        if problems.is_empty() {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the table differs from the registered specs:\n  {}",
            problems.join("\n  ")
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn follow(client: &aws_sdk_dynamodb::Client, table: &str, a: &str, b: &str) {
    support::put(
        client,
        table,
        &[
            ("PK", s(&format!("USER#{a}"))),
            ("SK", s(&format!("FOLLOWS#{b}"))),
            ("followedAt", s("2026-11-28")),
        ],
    )
    .await;
}

async fn email(client: &aws_sdk_dynamodb::Client, table: &str, user: &str, address: &str) {
    support::put(
        client,
        table,
        &[("PK", s(&format!("USER#{user}"))), ("SK", s("PROFILE"))],
    )
    .await;
    support::put(
        client,
        table,
        &[
            ("PK", s(&format!("USER#{user}"))),
            ("SK", s("EMAIL#e1")),
            ("email", s(address)),
            ("isPrimary", Av::Bool(true)),
            ("isVerified", Av::Bool(true)),
        ],
    )
    .await;
}

fn registry_version(table: &str) -> u64 {
    let output = cli(&["specs", "--table", table, "--format", "json"]);
    assert!(output.status.success(), "specs: {}", stderr(&output));
    let value: Value = serde_json::from_slice(&output.stdout).unwrap();
    value["registryVersion"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn two_teams_register_into_a_running_runner_and_a_conflict_changes_nothing() {
    let started = Instant::now();
    let client = support::client().await;
    let social = support::shipped_spec("social-service.toml");
    let table = support::fresh_table(&client, &social, "reg-run").await;
    let dir = tempfile::tempdir().unwrap();
    let social_file = write(
        dir.path(),
        "social.toml",
        &shipped_for("social-service.toml", &table),
    );
    let users_file = write(
        dir.path(),
        "users.toml",
        &shipped_for("user-service.toml", &table),
    );
    // Written before anything is registered: the backfill brings them.
    follow(&client, &table, "a", "b").await;
    email(&client, &table, "a", " A@Example.org ").await;
    let _runner = Runner::start(&table);

    let dry = register(&social_file, &table, &["--dry-run", "--format", "json"]);
    assert!(dry.status.success(), "dry run: {}", stderr(&dry));
    let planned: Value = serde_json::from_slice(&dry.stdout).unwrap();
    assert_eq!(planned["dryRun"], true);
    assert!(planned["projections"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["name"] == "followed-by" && p["change"] == "new"));
    assert_eq!(registry_version(&table), 0, "a dry run stores nothing");

    for (file, by) in [(&social_file, "team-social"), (&users_file, "team-users")] {
        let output = register(file, &table, &["--by", by]);
        assert!(output.status.success(), "register: {}", stderr(&output));
        assert!(
            stdout(&output).contains("registered:"),
            "{}",
            stdout(&output)
        );
    }
    assert_eq!(registry_version(&table), 2);
    wait_served(&table, &["followed-by", "email-gsi1-keys"], &[]);
    follow(&client, &table, "c", "b").await;
    email(&client, &table, "c", "c@example.org").await;
    let backfill = cli(&["backfill", "--table", &table]);
    assert!(backfill.status.success(), "backfill: {}", stderr(&backfill));
    follow(&client, &table, "d", "b").await;
    wait_exact(&client, &table).await;
    let (code, rows) = status(&table);
    assert_eq!(code, 0, "every projection live: {rows:?}");

    // A second team's spec that takes a name the first registered.
    let clash = shipped_for("user-service.toml", &table)
        .replace("\"user-service\"", "\"profile-service\"")
        .replace("name = \"email-gsi1-keys\"", "name = \"followed-by\"");
    let clash_file = write(dir.path(), "clash.toml", &clash);
    let refused = register(&clash_file, &table, &[]);
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    let message = stderr(&refused);
    assert!(
        message.contains("followed-by") && message.contains("social-service"),
        "the refusal names the projection and the service that has it: {message}"
    );
    assert!(message.contains("nothing was stored"), "{message}");
    assert_eq!(registry_version(&table), 2, "a refusal stores nothing");
    let specs = cli(&["specs", "--table", &table]);
    let listed = stdout(&specs);
    assert!(
        listed.contains("social-service") && listed.contains("by team-users"),
        "{listed}"
    );
    eprintln!(
        "timing: two teams took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn two_registrations_racing_never_lose_an_update() {
    let client = support::client().await;
    let social = support::shipped_spec("social-service.toml");
    let table = support::fresh_table(&client, &social, "reg-race").await;
    let registrations = Registrations::of_table(&client, &table).await.unwrap();
    let social_text = shipped_for("social-service.toml", &table);
    let users_text = shipped_for("user-service.toml", &table);

    // Both read the registry at version 0 before either writes.
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(2));
    let race = |service: &'static str, text: String| {
        let (registrations, barrier) = (registrations.clone(), barrier.clone());
        tokio::spawn(async move {
            let read = registrations.read().await.unwrap();
            barrier.wait().await;
            registrations
                .write(read.version, service, Some(&text), service)
                .await
                .unwrap()
        })
    };
    let a = race("social-service", social_text.clone());
    let b = race("user-service", users_text.clone());
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    let stored = [&a, &b]
        .iter()
        .filter(|w| matches!(w, Written::Stored { .. }))
        .count();
    assert_eq!(stored, 1, "one conditional write lands: {a:?} {b:?}");
    assert!(
        [&a, &b].iter().any(|w| **w == Written::Moved(1)),
        "the other is told the registry moved: {a:?} {b:?}"
    );

    // The loser composes again with what landed, and lands after it.
    let (loser, text) = match a {
        Written::Moved(_) => ("social-service", social_text),
        _ => ("user-service", users_text),
    };
    let change = control::Change {
        table: table.clone(),
        text: Some((format!("{loser}.toml"), text)),
        service: None,
        by: "ci".to_string(),
        dry_run: false,
    };
    let planned = control::register(&registrations, &change)
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(planned.stored.map(|s| s.registry_version), Some(2));
    let registered = registrations.read().await.unwrap();
    assert_eq!(registered.version, 2);
    assert_eq!(
        registered.services.keys().cloned().collect::<Vec<_>>(),
        vec!["social-service".to_string(), "user-service".to_string()],
        "neither registration is lost"
    );

    // Racing a conflicting registration: refused after composing again.
    let clash = shipped_for("user-service.toml", &table)
        .replace("\"user-service\"", "\"profile-service\"")
        .replace("name = \"email-gsi1-keys\"", "name = \"followed-by\"");
    let stale = registrations.read().await.unwrap();
    let landed = registrations
        .write(
            stale.version,
            "user-service",
            Some(
                &shipped_for("user-service.toml", &table)
                    .replace("lower(trim(email))", "lower(email)"),
            ),
            "ci",
        )
        .await
        .unwrap();
    assert!(matches!(landed, Written::Stored { .. }));
    let moved = registrations
        .write(stale.version, "profile-service", Some(&clash), "ci")
        .await
        .unwrap();
    assert_eq!(moved, Written::Moved(3));
    let refused = control::register(
        &registrations,
        &control::Change {
            table: table.clone(),
            text: Some(("clash.toml".to_string(), clash)),
            service: None,
            by: "ci".to_string(),
            dry_run: false,
        },
    )
    .await;
    assert!(
        matches!(&refused, Err(control::RegisterError::Refused(p)) if p.iter().any(|p| p.contains("followed-by"))),
        "{refused:?}"
    );
    assert_eq!(registrations.read().await.unwrap().version, 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn unregister_then_prune_leaves_nothing_of_the_service_and_a_rollback_ends_exact() {
    let started = Instant::now();
    let client = support::client().await;
    let social = support::shipped_spec("social-service.toml");
    let table = support::fresh_table(&client, &social, "reg-life").await;
    let dir = tempfile::tempdir().unwrap();
    let social_text = shipped_for("social-service.toml", &table);
    let social_file = write(dir.path(), "social.toml", &social_text);
    let users_file = write(
        dir.path(),
        "users.toml",
        &shipped_for("user-service.toml", &table),
    );
    let _runner = Runner::start(&table);
    for file in [&social_file, &users_file] {
        let output = register(file, &table, &[]);
        assert!(output.status.success(), "register: {}", stderr(&output));
    }
    wait_served(&table, &["followed-by", "email-gsi1-keys"], &[]);
    for (a, b) in [("a", "b"), ("c", "b"), ("b", "a")] {
        follow(&client, &table, a, b).await;
    }
    email(&client, &table, "a", "a@example.org").await;
    email(&client, &table, "b", " B@Example.org").await;
    let backfill = cli(&["backfill", "--table", &table]);
    assert!(backfill.status.success(), "backfill: {}", stderr(&backfill));
    wait_exact(&client, &table).await;

    // v2 of the social spec: the inverse edge copies nothing.
    let v2 = social_text.replace("copy = { followedAt = \"{followedAt}\" }\n", "");
    assert_ne!(v2, social_text);
    let v2_file = write(dir.path(), "social-v2.toml", &v2);
    let changed = register(&v2_file, &table, &["--format", "json"]);
    assert!(changed.status.success(), "{}", stderr(&changed));
    let planned: Value = serde_json::from_slice(&changed.stdout).unwrap();
    assert!(
        planned["projections"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "followed-by" && p["change"] == "changed"),
        "{planned}"
    );
    wait_served(&table, &["followed-by"], &[]);
    let (_, rows) = status(&table);
    assert!(
        rows.iter()
            .any(|r| r.0 == "followed-by" && r.1 == "changed"),
        "status says changed: {rows:?}"
    );
    // The backfill runs while writers write.
    let backfill = {
        let (table, env) = (table.clone(), env());
        tokio::task::spawn_blocking(move || cli_in(env, &["backfill", "--table", &table]))
    };
    let mut n = 0;
    while !backfill.is_finished() || n < 10 {
        follow(&client, &table, &format!("w{n}"), "a").await;
        if n % 3 == 0 {
            support::delete(&client, &table, &format!("USER#w{}", n / 2), "FOLLOWS#a").await;
        }
        n += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let backfill = backfill.await.unwrap();
    assert!(backfill.status.success(), "backfill: {}", stderr(&backfill));
    wait_exact(&client, &table).await;
    let (code, rows) = status(&table);
    assert_eq!(code, 0, "v2 live after its backfill: {rows:?}");
    let edge = support::get(&client, &table, "USER#b", "FOLLOWED_BY#a")
        .await
        .unwrap();
    assert!(
        !edge.contains_key("followedAt"),
        "v2 copies nothing: {edge:?}"
    );

    // The rollback: v1's text, as `specs` prints it, registered again.
    let v1 = cli(&[
        "specs",
        "--table",
        &table,
        "--service",
        "social-service",
        "--version",
        "1",
    ]);
    assert!(v1.status.success(), "{}", stderr(&v1));
    assert_eq!(stdout(&v1), social_text);
    let rollback_file = write(dir.path(), "rollback.toml", &stdout(&v1));
    let rolled = register(&rollback_file, &table, &[]);
    assert!(rolled.status.success(), "{}", stderr(&rolled));
    assert!(
        stdout(&rolled).contains("social-service v3"),
        "{}",
        stdout(&rolled)
    );
    wait_served(&table, &["followed-by"], &[]);
    let backfill = cli(&["backfill", "--table", &table]);
    assert!(backfill.status.success(), "backfill: {}", stderr(&backfill));
    wait_exact(&client, &table).await;
    let edge = support::get(&client, &table, "USER#b", "FOLLOWED_BY#a")
        .await
        .unwrap();
    assert!(edge.contains_key("followedAt"), "v1 copies again: {edge:?}");
    let history = cli(&[
        "specs",
        "--table",
        &table,
        "--service",
        "social-service",
        "--history",
    ]);
    assert_eq!(stdout(&history).lines().count(), 3, "{}", stdout(&history));

    // Unregistering the user service retires its projections; prune
    // removes what they derived, and the social projections stay exact.
    let dry = cli(&[
        "unregister",
        "--service",
        "user-service",
        "--table",
        &table,
        "--dry-run",
    ]);
    assert!(dry.status.success(), "{}", stderr(&dry));
    assert!(stdout(&dry).contains("retired"), "{}", stdout(&dry));
    let gone = cli(&["unregister", "--service", "user-service", "--table", &table]);
    assert!(gone.status.success(), "{}", stderr(&gone));
    wait_served(&table, &["followed-by"], &["email-gsi1-keys"]);
    let (_, rows) = status(&table);
    assert!(
        rows.iter()
            .any(|r| r.0 == "email-gsi1-keys" && r.1 == "retired"),
        "{rows:?}"
    );
    let started_prune = Instant::now();
    let prune = loop {
        let prune = cli(&[
            "prune",
            "--table",
            &table,
            "--projection",
            "email-gsi1-keys",
            "--projection",
            "profile-primary-email",
        ]);
        // Refused while the worker's lease of the old registration lasts.
        if prune.status.success() || started_prune.elapsed() > Duration::from_secs(20) {
            break prune;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(prune.status.success(), "prune: {}", stderr(&prune));
    let items = support::scan_all(&client, &table).await;
    for item in &items {
        let pk = support::text(item, "PK").unwrap_or_default();
        if pk.starts_with("_ddbp#") {
            continue;
        }
        let sk = support::text(item, "SK").unwrap_or_default();
        if sk.starts_with("EMAIL#") {
            assert!(!item.contains_key("GSI1PK"), "index keys left: {item:?}");
        }
        if sk == "PROFILE" {
            assert!(!item.contains_key("email"), "copied email left: {item:?}");
        }
    }
    wait_exact(&client, &table).await;
    eprintln!(
        "timing: unregister and rollback took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test]
async fn bad_registrations_are_refused_clearly_and_store_nothing() {
    let client = support::client().await;
    let social = support::shipped_spec("social-service.toml");
    let table = support::fresh_table(&client, &social, "reg-bad").await;
    let dir = tempfile::tempdir().unwrap();
    let text = shipped_for("social-service.toml", &table);
    let cases: Vec<(&str, String, i32, &str)> = vec![
        ("empty.toml", String::new(), 1, "the spec is empty"),
        (
            "other.toml",
            shipped_for("social-service.toml", "SomeOtherTable"),
            1,
            "describes table `SomeOtherTable`",
        ),
        (
            "spaced.toml",
            text.replace("\"social-service\"", "\"social service\""),
            1,
            "\"social service\" cannot be registered",
        ),
        (
            "big.toml",
            format!("{text}\n# {}\n", "x".repeat(360 * 1024)),
            1,
            "at most 350 KB",
        ),
        (
            "broken.toml",
            text.replace("kind = \"inverse-edge\"", "kind = \"inverse-edges\""),
            1,
            "broken.toml",
        ),
    ];
    for (name, text, code, needle) in cases {
        let file = write(dir.path(), name, &text);
        let output = register(&file, &table, &[]);
        assert_eq!(
            output.status.code(),
            Some(code),
            "{name}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(needle),
            "{name}: the error names the problem ({needle}): {}",
            stderr(&output)
        );
        assert!(stderr(&output).contains(name), "{name}: names the file");
    }
    let file = write(dir.path(), "ok.toml", &text);
    let unknown = register(&file, "NoSuchTable-reg", &[]);
    assert_eq!(unknown.status.code(), Some(2), "{}", stderr(&unknown));
    assert!(
        stderr(&unknown).contains("NoSuchTable-reg"),
        "{}",
        stderr(&unknown)
    );
    let unknown_service = cli(&["unregister", "--service", "nobody", "--table", &table]);
    assert_eq!(unknown_service.status.code(), Some(1));
    assert!(stderr(&unknown_service).contains("not registered"));
    assert_eq!(registry_version(&table), 0, "nothing stored");
    let items = support::scan_all(&client, &table).await;
    assert!(
        items.iter().all(|i| !support::text(i, "PK")
            .unwrap_or_default()
            .starts_with("_ddbp#svc#")),
        "no registration item"
    );
}

/// The IAM policy a service team's CI role is given (`infra/`) scopes it
/// to the keys a registration of its service writes: its own partition
/// and the shared item, which holds no spec text.
#[tokio::test]
async fn a_registration_writes_only_the_keys_the_service_policy_scopes() {
    let client = support::client().await;
    let social = support::shipped_spec("social-service.toml");
    let table = support::fresh_table(&client, &social, "reg-keys").await;
    let dir = tempfile::tempdir().unwrap();
    let before: Vec<Attrs> = support::scan_all(&client, &table).await;
    assert!(before.is_empty());
    let file = write(
        dir.path(),
        "social.toml",
        &shipped_for("social-service.toml", &table),
    );
    let output = register(&file, &table, &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let policy: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("infra/service-team-policy.json")).unwrap(),
    )
    .unwrap();
    let service = |text: &str| text.replace("${aws:PrincipalTag/service}", "social-service");
    let writes: Vec<&Value> = policy["Statement"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["Effect"] == "Allow")
        .filter(|s| {
            s["Action"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a != "dynamodb:GetItem" && a.as_str().unwrap().contains("Item"))
        })
        .filter(|s| {
            !s["Action"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a == "dynamodb:Query")
        })
        .collect();
    let scoped = |statement: &Value, name: &str| -> Vec<String> {
        statement["Condition"]["ForAllValues:StringLike"][name]
            .as_array()
            .map(|values| {
                values
                    .iter()
                    .map(|v| service(v.as_str().unwrap()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let patterns: Vec<String> = writes
        .iter()
        .flat_map(|s| scoped(s, "dynamodb:LeadingKeys"))
        .collect();
    let like = |pattern: &str, key: &str| match pattern.strip_suffix('*') {
        Some(prefix) => key.starts_with(prefix),
        None => key == pattern,
    };
    let items = support::scan_all(&client, &table).await;
    assert_eq!(items.len(), 3, "shared item, current, v#1: {items:?}");
    for item in &items {
        let pk = support::text(item, "PK").unwrap();
        let statement = writes
            .iter()
            .find(|s| {
                scoped(s, "dynamodb:LeadingKeys")
                    .iter()
                    .any(|p| like(p, &pk))
            })
            .unwrap_or_else(|| panic!("{pk} is outside what the policy lets a team write"));
        // Where the policy names the attributes a team may write, every
        // attribute of the item is one of them.
        let attributes = scoped(statement, "dynamodb:Attributes");
        if !attributes.is_empty() {
            for name in item.keys() {
                assert!(
                    attributes.iter().any(|a| like(a, name)),
                    "{pk}: attribute {name} is outside {attributes:?}"
                );
            }
            assert!(!attributes.iter().any(|a| like(a, "s#user-service")));
        }
        assert!(
            pk.starts_with("_ddbp#svc#social-service") || !item.contains_key("text"),
            "only the service's own partition holds its text: {pk}"
        );
    }
    assert!(
        !patterns.iter().any(|p| like(p, "_ddbp#svc#user-service")),
        "another service's partition is out of reach"
    );
}

/// A table whose last service was unregistered is served by a worker
/// without any projection, which still leases its (empty) spec: the
/// changes it consumes meanwhile go unprojected, so the same spec
/// registered again is not live until it is backfilled again.
#[tokio::test(flavor = "multi_thread")]
async fn a_spec_registered_again_after_the_table_had_none_needs_a_backfill() {
    let client = support::client().await;
    let social = support::shipped_spec("social-service.toml");
    let table = support::fresh_table(&client, &social, "reg-again").await;
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "social.toml",
        &shipped_for("social-service.toml", &table),
    );
    let _runner = Runner::start(&table);
    let output = register(&file, &table, &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    wait_served(&table, &["followed-by"], &[]);
    follow(&client, &table, "a", "b").await;
    let backfill = cli(&["backfill", "--table", &table]);
    assert!(backfill.status.success(), "{}", stderr(&backfill));
    wait_exact(&client, &table).await;
    assert_eq!(status(&table).0, 0, "live");

    let gone = cli(&[
        "unregister",
        "--service",
        "social-service",
        "--table",
        &table,
    ]);
    assert!(gone.status.success(), "{}", stderr(&gone));
    wait_served(&table, &[], &["followed-by"]);
    // Consumed while nothing is registered: not projected.
    follow(&client, &table, "c", "b").await;
    // The runner reads the stream every few hundred ms.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let again = register(&file, &table, &[]);
    assert!(again.status.success(), "{}", stderr(&again));
    wait_served(&table, &["followed-by"], &[]);
    let (code, rows) = status(&table);
    assert_eq!(code, 1, "not live before a backfill: {rows:?}");
    assert!(
        rows.iter().any(|r| r.0 == "followed-by" && r.1 != "live"),
        "{rows:?}"
    );
    let backfill = cli(&["backfill", "--table", &table]);
    assert!(backfill.status.success(), "{}", stderr(&backfill));
    wait_exact(&client, &table).await;
    assert_eq!(status(&table).0, 0, "live after the backfill");
}

/// What the shared item names and the services' own items must agree: a
/// registration replicating item by item (a global table's replica), or
/// a team's direct write, is never read in part.
#[tokio::test]
async fn a_registry_read_in_part_is_an_error_never_a_smaller_spec() {
    let client = support::client().await;
    let social = support::shipped_spec("social-service.toml");
    let table = support::fresh_table(&client, &social, "reg-part").await;
    let registrations = Registrations::of_table(&client, &table).await.unwrap();
    let text = shipped_for("social-service.toml", &table);
    let written = registrations
        .write(0, "social-service", Some(&text), "ci")
        .await
        .unwrap();
    assert!(matches!(written, Written::Stored { .. }));
    // The shared item moves to v2 of the service; its own items have not
    // arrived yet.
    client
        .update_item()
        .table_name(&table)
        .key("PK", s("_ddbp#registry"))
        .key("SK", s("registry"))
        .update_expression("SET #s = :two, #v = :two")
        .expression_attribute_names("#s", "s#social-service")
        .expression_attribute_names("#v", "version")
        .expression_attribute_values(":two", Av::N("2".to_string()))
        .send()
        .await
        .unwrap();
    let error = registrations.read().await.unwrap_err().to_string();
    assert!(
        error.contains("the registry names v2, its current item is v1"),
        "{error}"
    );
    assert!(control::registered_spec(&client, &table).await.is_err());
}

/// A registration another consumer's spec file would fight (the two
/// deriving one attribute, each undoing the other's writes) is refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_registration_that_another_consumer_would_fight_is_refused() {
    let client = support::client().await;
    let social = support::shipped_spec("social-service.toml");
    let table = support::fresh_table(&client, &social, "reg-fight").await;
    let dir = tempfile::tempdir().unwrap();
    let text = shipped_for("social-service.toml", &table);
    let theirs = write(dir.path(), "analytics.toml", &text);
    let run = cli(&[
        "run",
        "--drain",
        "--spec",
        theirs.to_str().unwrap(),
        "--table",
        &table,
        "--consumer",
        "analytics",
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    let ours = write(
        dir.path(),
        "social.toml",
        &text.replace("copy = { followedAt = \"{followedAt}\" }\n", ""),
    );
    let refused = register(&ours, &table, &[]);
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("analytics"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(registry_version(&table), 0);
}
