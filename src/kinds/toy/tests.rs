//! The toy kind end to end against DynamoDB Local: compiled from TOML,
//! planned, applied, audited (broken, repaired, clean), filtered and
//! pruned, with no code outside its folder but its registration.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use aws_sdk_dynamodb::types::AttributeValue as Av;

use crate::apply::{ApplyConfig, BatchOptions, RecordStatus};
use crate::audit::{audit, AuditOptions};
use crate::decode::scanned_record;
use crate::effect::Op;
use crate::lambda::filters::filter_criteria;
use crate::plan::plan_record;
use crate::prune::{prune, PruneOptions, Retired};
use crate::record::Item;
use crate::spec::Spec;

const TABLE: &str = r#"
service = "toy-service"

[table]
name = "ToyTable"
partition_key = "PK"
sort_key = "SK"

[entities.profile]
pk = "USER#{userId}"
sk = "PROFILE"
"#;

const TOY: &str = r#"
[[projections]]
name = "profile-tag"
kind = "toy"
entity = "profile"
attribute = "tag"
value = "T#{lower(name)}"
"#;

/// DynamoDB Local: `AWS_ENDPOINT_URL` when set, else one started with
/// `scripts/ddb-local` for this process, stopped when it exits.
fn endpoint() -> &'static str {
    static ENDPOINT: OnceLock<String> = OnceLock::new();
    ENDPOINT.get_or_init(|| {
        if let Ok(endpoint) = std::env::var("AWS_ENDPOINT_URL") {
            return endpoint;
        }
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/ddb-local");
        let output = std::process::Command::new(&script)
            .arg("start")
            .output()
            .expect("run scripts/ddb-local start");
        assert!(output.status.success(), "scripts/ddb-local start failed");
        let endpoint = String::from_utf8(output.stdout)
            .expect("utf-8")
            .trim()
            .strip_prefix("AWS_ENDPOINT_URL=")
            .expect("start prints AWS_ENDPOINT_URL=...")
            .to_string();
        let port = endpoint.rsplit(':').next().expect("a port").to_string();
        let watchdog = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; '{script}' stop --port {port} >/dev/null 2>&1",
            pid = std::process::id(),
            script = script.display(),
        );
        // The watchdog outlives this process on purpose; nobody waits for it.
        #[allow(clippy::zombie_processes)]
        std::process::Command::new("sh")
            .args(["-c", &watchdog])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn the watchdog");
        endpoint
    })
}

async fn client() -> aws_sdk_dynamodb::Client {
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(endpoint())
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
            "local", "local", None, None, "tests",
        ))
        .load()
        .await;
    aws_sdk_dynamodb::Client::new(&config)
}

fn profile(user: &str, name: &str, tag: Option<&str>) -> HashMap<String, Av> {
    let mut item = HashMap::from([
        ("PK".to_string(), Av::S(format!("USER#{user}"))),
        ("SK".to_string(), Av::S("PROFILE".to_string())),
        ("name".to_string(), Av::S(name.to_string())),
    ]);
    if let Some(tag) = tag {
        item.insert("tag".to_string(), Av::S(tag.to_string()));
    }
    item
}

async fn put(client: &aws_sdk_dynamodb::Client, table: &str, item: HashMap<String, Av>) {
    client
        .put_item()
        .table_name(table)
        .set_item(Some(item))
        .send()
        .await
        .expect("put");
}

async fn tag(client: &aws_sdk_dynamodb::Client, table: &str, user: &str) -> Option<String> {
    let item = client
        .get_item()
        .table_name(table)
        .key("PK", Av::S(format!("USER#{user}")))
        .key("SK", Av::S("PROFILE".to_string()))
        .consistent_read(true)
        .send()
        .await
        .expect("get")
        .item?;
    match item.get("tag") {
        Some(Av::S(tag)) => Some(tag.clone()),
        _ => None,
    }
}

#[tokio::test]
async fn a_kind_is_its_folder_and_its_registration() {
    // Compiled from TOML.
    let spec = Arc::new(
        Spec::from_toml(&format!("{TABLE}{TOY}"), "toy.toml").expect("the toy spec compiles"),
    );
    assert_eq!(spec.projections[0].kind_name(), "toy");
    assert!(spec.summary().contains("profile: tag = T#{lower(name)}"));

    // Planned: the tag, on condition of the name it was derived from.
    let item: Item = Item::from(profile("u1", "Sam", None));
    let record = scanned_record(&spec.table, 0, 0, item).expect("a record");
    let plan = plan_record(&spec, &record, None);
    assert!(plan.errors.is_empty(), "{:?}", plan.errors);
    let [effect] = plan.effects.as_slice() else {
        panic!("one effect: {:?}", plan.effects)
    };
    let Op::SetAttributes { set, expect, .. } = &effect.op else {
        panic!("sets attributes: {effect:?}")
    };
    assert_eq!(
        set,
        &vec![(
            "tag".to_string(),
            crate::record::AttributeValue::S("T#sam".into())
        )]
    );
    assert_eq!(expect.len(), 1);

    // Filtered: its entity's records pass, and the note says why.
    let criteria = filter_criteria(&spec);
    assert!(
        criteria.patterns.iter().any(|p| p.contains("USER#")),
        "{criteria:?}"
    );
    assert!(
        criteria
            .notes
            .iter()
            .any(|n| n.starts_with("toy `profile-tag`")),
        "{:?}",
        criteria.notes
    );

    // Applied.
    let client = client().await;
    let table = format!(
        "toy-{}-{}",
        std::process::id(),
        crate::dynamo::time::now_ms()
    );
    crate::table::create_table(&client, &spec, &table)
        .await
        .expect("create table");
    put(&client, &table, profile("u1", "Sam", None)).await;
    put(&client, &table, profile("u2", "Ann", None)).await;
    let applier =
        crate::control::applier(client.clone(), spec.clone(), &table, ApplyConfig::default());
    let batch: Vec<_> = ["u1", "u2"]
        .iter()
        .map(|u| {
            let item = Item::from(profile(u, if *u == "u1" { "Sam" } else { "Ann" }, None));
            scanned_record(&spec.table, 0, 0, item)
        })
        .collect();
    let outcome = applier
        .apply_batch(&batch, &BatchOptions::default())
        .await
        .expect("apply");
    assert_eq!(outcome.statuses, vec![RecordStatus::Applied; 2]);
    assert_eq!(tag(&client, &table, "u1").await.as_deref(), Some("T#sam"));
    assert_eq!(tag(&client, &table, "u2").await.as_deref(), Some("T#ann"));

    // Audited: a writer breaks a tag; the audit finds it, repairs it, and
    // then finds nothing.
    put(&client, &table, profile("u2", "Ann", Some("wrong"))).await;
    let options = |repair| AuditOptions {
        segments: 1,
        repair,
        progress: false,
        ..AuditOptions::default()
    };
    let report = audit(&applier, &options(false)).await.expect("audit");
    assert_eq!(report.findings.len(), 1, "{:?}", report.findings);
    assert_eq!(report.findings[0].rule, "profile-tag");
    assert_eq!(report.findings[0].rule_kind, "toy");
    audit(&applier, &options(true)).await.expect("repair");
    assert_eq!(tag(&client, &table, "u2").await.as_deref(), Some("T#ann"));
    let report = audit(&applier, &options(false)).await.expect("audit");
    assert!(report.findings.is_empty(), "{:?}", report.findings);

    // Pruned once the spec no longer has it: the attribute is gone.
    let current = Spec::from_toml(TABLE, "current.toml").expect("the spec without it");
    let retired = Retired::new("profile-tag", spec.clone()).expect("retired");
    prune(
        &client,
        &table,
        &current,
        &[retired],
        &PruneOptions {
            segments: 1,
            progress: false,
            ..PruneOptions::default()
        },
    )
    .await
    .expect("prune");
    assert_eq!(tag(&client, &table, "u1").await, None);
    assert_eq!(tag(&client, &table, "u2").await, None);
}
