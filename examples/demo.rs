//! The demo behind `scripts/demo`: writers write only source items, the
//! projector (the real `ddb-projector` binary) derives the rest.
//!
//! Expects DynamoDB Local in `AWS_ENDPOINT_URL` and the binary's path in
//! `DDB_PROJECTOR_BIN`; `scripts/demo` sets both.

use std::collections::HashMap;
use std::process::Command;

use aws_sdk_dynamodb::types::AttributeValue as Av;
use aws_sdk_dynamodb::Client;
use ddb_projector::spec::Spec;

type Item = HashMap<String, Av>;

fn s(v: &str) -> Av {
    Av::S(v.to_string())
}

fn item(pairs: &[(&str, Av)]) -> Item {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

fn show(value: Option<&Av>) -> String {
    match value {
        Some(Av::S(v)) => v.clone(),
        Some(Av::N(v)) => v.clone(),
        Some(Av::Bool(v)) => v.to_string(),
        Some(other) => format!("{other:?}"),
        None => "-".to_string(),
    }
}

fn table(title: &str, columns: &[&str], rows: &[Item]) {
    if !title.is_empty() {
        println!("\n  {title}");
    }
    let widths: Vec<usize> = columns
        .iter()
        .map(|c| {
            rows.iter()
                .map(|r| show(r.get(*c)).len())
                .max()
                .unwrap_or(0)
                .max(c.len())
        })
        .collect();
    let line = |cells: Vec<String>| {
        let cells: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("    {}", cells.join("  "));
    };
    line(columns.iter().map(|c| c.to_string()).collect());
    line(widths.iter().map(|w| "-".repeat(*w)).collect());
    for row in rows {
        line(columns.iter().map(|c| show(row.get(*c))).collect());
    }
}

async fn put(client: &Client, table: &str, pairs: &[(&str, Av)]) {
    client
        .put_item()
        .table_name(table)
        .set_item(Some(item(pairs)))
        .send()
        .await
        .expect("put");
}

async fn set(client: &Client, table: &str, pk: &str, sk: &str, name: &str, value: Av) {
    client
        .update_item()
        .table_name(table)
        .key("PK", s(pk))
        .key("SK", s(sk))
        .update_expression("SET #n = :v")
        .expression_attribute_names("#n", name)
        .expression_attribute_values(":v", value)
        .send()
        .await
        .expect("update");
}

async fn query(
    client: &Client,
    table: &str,
    index: Option<&str>,
    pk_name: &str,
    pk: &str,
    sk_prefix: Option<(&str, &str)>,
) -> Vec<Item> {
    let mut condition = "#pk = :pk".to_string();
    let mut request = client
        .query()
        .table_name(table)
        .set_index_name(index.map(str::to_string))
        .expression_attribute_names("#pk", pk_name)
        .expression_attribute_values(":pk", s(pk));
    if let Some((sk_name, prefix)) = sk_prefix {
        condition.push_str(" AND begins_with(#sk, :p)");
        request = request
            .expression_attribute_names("#sk", sk_name)
            .expression_attribute_values(":p", s(prefix));
    }
    request
        .key_condition_expression(condition)
        .send()
        .await
        .expect("query")
        .items
        .unwrap_or_default()
}

async fn get(client: &Client, table: &str, pk: &str, sk: &str) -> Item {
    client
        .get_item()
        .table_name(table)
        .key("PK", s(pk))
        .key("SK", s(sk))
        .consistent_read(true)
        .send()
        .await
        .expect("get")
        .item
        .unwrap_or_default()
}

fn projector(args: &[&str]) -> String {
    let bin = std::env::var("DDB_PROJECTOR_BIN")
        .unwrap_or_else(|_| "target/debug/ddb-projector".to_string());
    let output = Command::new(&bin)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {bin}: {e}"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        panic!("ddb-projector {} failed:\n{stderr}", args.join(" "));
    }
    // The runner's summary is its last stderr lines.
    let summary: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.contains(" INFO ") && !l.contains(" DEBUG "))
        .collect();
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        summary.join("\n")
    )
}

/// Runs the binary and returns its exit code and stdout (exit 1 means
/// "found something" for `audit` and `violations list`).
fn projector_code(args: &[&str]) -> (i32, String) {
    let bin = std::env::var("DDB_PROJECTOR_BIN")
        .unwrap_or_else(|_| "target/debug/ddb-projector".to_string());
    let output = Command::new(&bin)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {bin}: {e}"));
    let code = output.status.code().unwrap_or(-1);
    if code > 1 {
        panic!(
            "ddb-projector {} failed:\n{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    (code, String::from_utf8_lossy(&output.stdout).into_owned())
}

fn heading(text: &str) {
    println!("\n== {text}");
}

#[tokio::main]
async fn main() {
    let config = aws_config::load_from_env().await;
    let client = Client::new(&config);
    let specs = [
        "projections/user-service.toml",
        "projections/social-service.toml",
        "projections/ads-platform.toml",
    ];
    heading(
        "1. Create the tables the shipped specs describe (keys, GSI1, a NEW_AND_OLD_IMAGES stream)",
    );
    for spec in specs {
        println!(
            "  {}",
            projector(&["table", "create", "--spec", spec]).trim()
        );
    }
    let users = Spec::from_file("projections/user-service.toml".as_ref())
        .unwrap()
        .rules
        .table
        .name;
    let social = Spec::from_file("projections/social-service.toml".as_ref())
        .unwrap()
        .rules
        .table
        .name;
    let ads = Spec::from_file("projections/ads-platform.toml".as_ref())
        .unwrap()
        .rules
        .table
        .name;

    heading("2. Writers write only source items, with plain single-item writes");
    put(
        &client,
        &users,
        &[
            ("PK", s("USER#sam")),
            ("SK", s("PROFILE")),
            ("userId", s("sam")),
            ("firstName", s("Sam")),
            ("lastName", s("Lee")),
            ("status", s("active")),
            ("version", Av::N("1".into())),
        ],
    )
    .await;
    put(
        &client,
        &users,
        &[
            ("PK", s("USER#sam")),
            ("SK", s("EMAIL#e1")),
            ("emailId", s("e1")),
            ("userId", s("sam")),
            ("email", s("sam@old.org")),
            ("isPrimary", Av::Bool(true)),
            ("isVerified", Av::Bool(true)),
        ],
    )
    .await;
    put(
        &client,
        &users,
        &[
            ("PK", s("USER#sam")),
            ("SK", s("EMAIL#e2")),
            ("emailId", s("e2")),
            ("userId", s("sam")),
            ("email", s("  Sam@New.ORG ")),
            ("isPrimary", Av::Bool(false)),
            ("isVerified", Av::Bool(true)),
        ],
    )
    .await;
    // The primary switch, as two plain writes (no transaction).
    set(
        &client,
        &users,
        "USER#sam",
        "EMAIL#e2",
        "isPrimary",
        Av::Bool(true),
    )
    .await;
    set(
        &client,
        &users,
        "USER#sam",
        "EMAIL#e1",
        "isPrimary",
        Av::Bool(false),
    )
    .await;
    println!("  user-service: profile USER#sam, emails e1 (was primary) and e2; primary switched to e2 by two plain updates");

    let fans = 250;
    for i in 0..fans {
        put(
            &client,
            &social,
            &[
                ("PK", s(&format!("USER#fan{i:03}"))),
                ("SK", s("FOLLOWS#alice")),
                ("followedAt", s("2026-11-22T08:00:00Z")),
            ],
        )
        .await;
    }
    for (a, b) in [
        ("alice", "bob"),
        ("alice", "carol"),
        ("bob", "alice"),
        ("carol", "alice"),
    ] {
        put(
            &client,
            &social,
            &[
                ("PK", s(&format!("USER#{a}"))),
                ("SK", s(&format!("FOLLOWS#{b}"))),
                ("followedAt", s("2026-11-22T08:05:00Z")),
            ],
        )
        .await;
    }
    // carol unfollows alice; ten fans unfollow too.
    client
        .delete_item()
        .table_name(&social)
        .key("PK", s("USER#carol"))
        .key("SK", s("FOLLOWS#alice"))
        .send()
        .await
        .unwrap();
    for i in 0..10 {
        client
            .delete_item()
            .table_name(&social)
            .key("PK", s(&format!("USER#fan{i:03}")))
            .key("SK", s("FOLLOWS#alice"))
            .send()
            .await
            .unwrap();
    }
    for (user, badge, tier, score) in [
        ("alice", "streak", "gold", 850),
        ("bob", "streak", "gold", 920),
        ("carol", "streak", "silver", 400),
        ("dave", "first-post", "gold", 75),
    ] {
        put(
            &client,
            &social,
            &[
                ("PK", s(&format!("USER#{user}"))),
                ("SK", s(&format!("ACHIEVEMENT#{badge}"))),
                ("tier", s(tier)),
                ("score", Av::N(score.to_string())),
            ],
        )
        .await;
    }
    // Profiles of alice and bob; carol's comes later (step 5).
    for (user, name) in [("alice", "Alice"), ("bob", "Bob")] {
        put(
            &client,
            &social,
            &[
                ("PK", s(&format!("USER#{user}"))),
                ("SK", s("PROFILE")),
                ("userId", s(user)),
                ("name", s(name)),
            ],
        )
        .await;
    }
    println!("  social-service: {fans} fans follow alice (hot user), 10 unfollow; alice follows bob and carol; bob and carol follow alice, carol unfollows; 4 achievements; profiles of alice and bob");

    for (campaign, profile, status, name) in [
        ("c1", "p1", "ENABLED", "Winter sale"),
        ("c2", "p1", "PAUSED", "Spring teaser"),
        ("c3", "p1", "ENABLED", "Black Friday"),
        ("c4", "p2", "ENABLED", "Launch"),
    ] {
        put(
            &client,
            &ads,
            &[
                ("PK", s(&format!("CAMPAIGN#{campaign}"))),
                ("SK", s("METADATA")),
                ("campaignId", s(campaign)),
                ("profileId", s(profile)),
                ("status", s(status)),
                ("name", s(name)),
            ],
        )
        .await;
    }
    for (campaign, date, spend, clicks, impressions) in [
        ("c1", "2026-11-20", "12.40", 31, 1200),
        ("c1", "2026-11-21", "9.95", 25, 980),
        ("c1", "2026-11-22", "0.15", 1, 40),
        ("c3", "2026-11-22", "120.00", 410, 15000),
    ] {
        put(
            &client,
            &ads,
            &[
                ("PK", s(&format!("CAMPAIGN#{campaign}"))),
                ("SK", s(&format!("PERF#{date}"))),
                ("campaignId", s(campaign)),
                ("date", s(date)),
                ("spend", Av::N(spend.to_string())),
                ("clicks", Av::N(clicks.to_string())),
                ("impressions", Av::N(impressions.to_string())),
            ],
        )
        .await;
    }
    println!("  ads-platform: 4 campaigns over 2 advertiser profiles; daily performance snapshots of c1 (3 days) and c3 (1 day)");

    let emails = query(&client, &users, None, "PK", "USER#sam", None).await;
    table(
        "Before the projector runs: USER#sam in UserServiceTable",
        &["PK", "SK", "email", "isPrimary", "GSI1PK", "GSI1SK"],
        &emails,
    );

    heading("3. Run the projector over each table's stream until it is caught up (ddb-projector run --drain)");
    for spec in specs {
        println!(
            "  {spec}:\n{}",
            indent(&projector(&["run", "--spec", spec, "--drain"]))
        );
    }

    heading("4. What the projections derived");
    let emails = query(&client, &users, None, "PK", "USER#sam", None).await;
    table(
        "USER#sam in UserServiceTable: GSI1 keys on emails, the primary address on the profile",
        &["PK", "SK", "email", "isPrimary", "GSI1PK", "GSI1SK"],
        &emails,
    );
    let by_email = query(
        &client,
        &users,
        Some("GSI1"),
        "GSI1PK",
        "EMAIL#sam@new.org",
        None,
    )
    .await;
    table(
        "Query GSI1 by address EMAIL#sam@new.org (normalized)",
        &["GSI1PK", "GSI1SK", "PK", "SK", "isPrimary"],
        &by_email,
    );

    let followers = query(
        &client,
        &social,
        None,
        "PK",
        "USER#alice",
        Some(("SK", "FOLLOWED_BY#")),
    )
    .await;
    println!(
        "\n  Inverse edges: USER#alice has {} FOLLOWED_BY# items (written by the projector), e.g.",
        followers.len()
    );
    table(
        "",
        &["PK", "SK", "followedAt"],
        &followers[..3.min(followers.len())],
    );
    for (counter, user) in [
        ("followers", "alice"),
        ("following", "alice"),
        ("followers", "carol"),
    ] {
        let value = projector(&[
            "counter",
            "get",
            counter,
            &format!("userId={user}"),
            "--spec",
            "projections/social-service.toml",
        ]);
        println!("  counter {counter}({user}) = {}", value.trim());
    }
    let shards = query(
        &client,
        &social,
        None,
        "PK",
        "COUNTER#followers#alice#0",
        None,
    )
    .await;
    println!("  (alice's followers are counted in 8 write shards on distinct partition keys, e.g. COUNTER#followers#alice#0 = {})", shards.first().map(|i| show(i.get("count"))).unwrap_or_default());
    let profiles = [
        get(&client, &social, "USER#alice", "PROFILE").await,
        get(&client, &social, "USER#bob", "PROFILE").await,
    ];
    table(
        "Rollups: the counters' totals on the profiles, one read instead of 8 shards (carol has no profile yet: nothing written)",
        &["PK", "SK", "name", "followersCount", "followingCount"],
        &profiles,
    );
    let gold = query(&client, &social, Some("GSI1"), "GSI1PK", "TIER#gold", None).await;
    table(
        "Leaderboard: query GSI1 TIER#gold (sorted by zero-padded score)",
        &["GSI1PK", "GSI1SK", "PK", "SK", "score"],
        &gold,
    );
    let enabled = query(
        &client,
        &ads,
        Some("GSI1"),
        "GSI1PK",
        "PROFILE#p1",
        Some(("GSI1SK", "STATUS#ENABLED#")),
    )
    .await;
    table(
        "Enabled campaigns of profile p1: query GSI1 PROFILE#p1, begins_with STATUS#ENABLED#",
        &["GSI1PK", "GSI1SK", "name"],
        &enabled,
    );
    let campaigns = [
        get(&client, &ads, "CAMPAIGN#c1", "METADATA").await,
        get(&client, &ads, "CAMPAIGN#c2", "METADATA").await,
        get(&client, &ads, "CAMPAIGN#c3", "METADATA").await,
    ];
    table(
        "Aggregates: campaign-totals over each campaign's PERF# snapshots (exact decimals; c2 has none: days = 0)",
        &["PK", "totalSpend", "totalClicks", "days", "firstDate", "lastDate"],
        &campaigns,
    );

    heading("5. Writers keep writing; the projector keeps up");
    set(
        &client,
        &users,
        "USER#sam",
        "EMAIL#e2",
        "isPrimary",
        Av::Bool(false),
    )
    .await;
    println!("  sam's primary email e2 is unset (no primary at all now)");
    projector(&["run", "--spec", "projections/user-service.toml", "--drain"]);
    let profile = get(&client, &users, "USER#sam", "PROFILE").await;
    println!("  profile email is now: {}", show(profile.get("email")));
    put(
        &client,
        &social,
        &[
            ("PK", s("USER#carol")),
            ("SK", s("PROFILE")),
            ("userId", s("carol")),
            ("name", s("Carol")),
        ],
    )
    .await;
    put(
        &client,
        &ads,
        &[
            ("PK", s("CAMPAIGN#c1")),
            ("SK", s("PERF#2026-11-23")),
            ("campaignId", s("c1")),
            ("date", s("2026-11-23")),
            ("spend", Av::N("7.5".to_string())),
            ("clicks", Av::N("12".to_string())),
            ("impressions", Av::N("300".to_string())),
        ],
    )
    .await;
    println!("  carol's profile is created late; c1 gets a fourth day of performance");
    projector(&[
        "run",
        "--spec",
        "projections/social-service.toml",
        "--drain",
    ]);
    projector(&["run", "--spec", "projections/ads-platform.toml", "--drain"]);
    let carol = get(&client, &social, "USER#carol", "PROFILE").await;
    let c1 = get(&client, &ads, "CAMPAIGN#c1", "METADATA").await;
    println!(
        "  carol's profile now carries followersCount = {}, followingCount = {}; c1 totalSpend = {}, days = {}",
        show(carol.get("followersCount")),
        show(carol.get("followingCount")),
        show(c1.get("totalSpend")),
        show(c1.get("days"))
    );

    heading("6. Replaying the whole stream changes nothing (idempotent)");
    let before = client
        .scan()
        .table_name(&social)
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .count;
    println!(
        "{}",
        indent(&projector(&[
            "replay",
            "--spec",
            "projections/social-service.toml"
        ]))
    );
    let value = projector(&[
        "counter",
        "get",
        "followers",
        "userId=alice",
        "--spec",
        "projections/social-service.toml",
    ]);
    let after = client
        .scan()
        .table_name(&social)
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .count;
    println!(
        "  followers(alice) after replay = {} (items in table: {before} before, {after} after)",
        value.trim()
    );

    heading("7. Invariants: the worker checked seed 001's rules after each batch");
    let (code, listed) = projector_code(&[
        "violations",
        "list",
        "--spec",
        "projections/user-service.toml",
    ]);
    println!(
        "  ddb-projector violations list (exit {code}):\n{}",
        indent(&listed)
    );

    heading("8. Audit: recompute everything from the sources, find drift, repair it");
    client
        .delete_item()
        .table_name(&social)
        .key("PK", s("USER#alice"))
        .key("SK", s("FOLLOWED_BY#bob"))
        .send()
        .await
        .unwrap();
    client
        .update_item()
        .table_name(&social)
        .key("PK", s("COUNTER#followers#alice#0"))
        .key("SK", s("COUNTER"))
        .update_expression("ADD #c :d")
        .expression_attribute_names("#c", "count")
        .expression_attribute_values(":d", Av::N("3".into()))
        .send()
        .await
        .unwrap();
    println!(
        "  someone deleted USER#alice / FOLLOWED_BY#bob by hand and bumped a followers shard by 3"
    );
    let social_spec = "projections/social-service.toml";
    let (code, report) = projector_code(&["audit", "--spec", social_spec]);
    println!("  ddb-projector audit (exit {code}):\n{}", indent(&report));
    let (code, report) = projector_code(&["audit", "--spec", social_spec, "--repair"]);
    println!(
        "  ddb-projector audit --repair (exit {code}): {}",
        report.lines().last().unwrap_or_default()
    );
    let (code, report) = projector_code(&["audit", "--spec", social_spec]);
    println!(
        "  ddb-projector audit again (exit {code}): {}",
        report.lines().last().unwrap_or_default()
    );
    println!("\nDone. The tables live in DynamoDB Local until the demo stops it.");
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}
