//! Commands that talk to DynamoDB: `table create`, `counter get`, `dlq`.

use super::Outcome;
use std::io::Write;

use anyhow::bail;

use super::{connect, OutputFormat, Target};
use crate::record::ItemKey;

macro_rules! connect_or_return {
    ($target:expr) => {
        match connect(&$target).await {
            Ok(connection) => connection,
            Err(result) => return result,
        }
    };
}

/// `table create`.
pub async fn table_create(target: Target, format: OutputFormat) -> anyhow::Result<Outcome> {
    let c = connect_or_return!(target);
    let created = matches!(
        crate::table::create_table(&c.dynamodb, &c.spec, &c.table).await?,
        crate::table::Created::Created
    );
    match (format, created) {
        (OutputFormat::Json, _) => {
            println!(
                "{}",
                serde_json::json!({ "table": c.table, "created": created })
            )
        }
        (OutputFormat::Text, true) => {
            println!("created table {} with a NEW_AND_OLD_IMAGES stream", c.table)
        }
        (OutputFormat::Text, false) => {
            println!("table {} already exists with the right shape", c.table)
        }
    }
    Ok(Outcome::Done)
}

/// `counter get NAME --key VAR=VALUE...`.
pub async fn counter_get(
    target: Target,
    name: String,
    vars: Vec<String>,
    format: OutputFormat,
) -> anyhow::Result<Outcome> {
    let mut pairs = Vec::new();
    for var in vars {
        let Some((k, v)) = var.split_once('=') else {
            bail!("--key {var}: expected VAR=VALUE (for example --key userId=u42)");
        };
        pairs.push((k.to_string(), v.to_string()));
    }
    let c = connect_or_return!(target);
    let value = crate::counter::read_counter(&c.dynamodb, &c.table, &c.spec, &name, &pairs).await?;
    match format {
        OutputFormat::Text => println!("{value}"),
        OutputFormat::Json => {
            let vars: serde_json::Map<String, serde_json::Value> = pairs
                .into_iter()
                .map(|(k, v)| (k, serde_json::Value::String(v)))
                .collect();
            println!(
                "{}",
                serde_json::json!({ "counter": name, "vars": vars, "value": value })
            );
        }
    }
    Ok(Outcome::Done)
}

/// `dlq list`: JSON lines.
pub async fn dlq_list(target: Target, format: OutputFormat) -> anyhow::Result<Outcome> {
    let c = connect_or_return!(target);
    let applier = c.applier();
    let letters = applier.dead_letter_store().list().await?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for letter in &letters {
        match format {
            OutputFormat::Json => writeln!(out, "{}", serde_json::to_string(letter)?)?,
            OutputFormat::Text => {
                let key = letter
                    .source_key
                    .as_ref()
                    .map_or_else(|| "(no key)".to_string(), ToString::to_string);
                writeln!(
                    out,
                    "{}  {key}  {}{}  since {}  ({} attempts): {}",
                    letter.projection,
                    letter.sequence_number.as_deref().unwrap_or("-"),
                    if letter.held { "  held" } else { "" },
                    letter.first_failed_at,
                    letter.attempts,
                    letter.error
                )?
            }
        }
    }
    eprintln!("{} dead letters in {}", letters.len(), c.table);
    Ok(Outcome::Done)
}

/// `dlq redrive`.
pub async fn dlq_redrive(
    target: Target,
    projections: Vec<String>,
    format: OutputFormat,
) -> anyhow::Result<Outcome> {
    let c = connect_or_return!(target);
    crate::global::require_home(&c, &target.deployment(), "dlq redrive").await?;
    for name in &projections {
        if c.spec.projection_id(name).is_none() && name != "*" {
            bail!("no projection `{name}` in {}", c.spec.file);
        }
    }
    let applier = c.applier();
    let only = (!projections.is_empty()).then_some(projections.as_slice());
    let summary = applier.redrive(only).await?;
    match format {
        OutputFormat::Json => println!("{}", serde_json::to_string(&summary)?),
        OutputFormat::Text => println!(
            "redriven {}, superseded by a later letter {}, still failing {}, skipped {}",
            summary.redriven, summary.superseded, summary.still_failing, summary.skipped
        ),
    }
    Ok(if summary.still_failing > 0 {
        Outcome::Found
    } else {
        Outcome::Done
    })
}

/// `check --table`: the spec, then where a worker in this region stands
/// on the table (see `crate::global`); with `--format json`, a JSON line
/// for each.
pub async fn check_table(target: Target, format: OutputFormat) -> anyhow::Result<Outcome> {
    if let Some(path) = &target.spec {
        let code = super::offline::check(path, format);
        if code != Outcome::Done {
            return Ok(code);
        }
    }
    let c = connect_or_return!(target);
    let region = c.config.region().map(|r| r.to_string()).unwrap_or_default();
    let (standing, said) = match crate::global::region_role(&c, &target.deployment()).await {
        Ok(crate::global::Role::Single) => (
            serde_json::json!({ "standing": "single" }),
            format!("table {}: a table of one region; this worker projects it", c.table),
        ),
        Ok(crate::global::Role::Home { regions }) => (
            serde_json::json!({ "standing": "home", "regions": regions }),
            format!(
                "table {}: a global table in {}; {region} is its home region and projects it",
                c.table,
                regions.join(", ")
            ),
        ),
        Ok(crate::global::Role::Away { home }) => (
            serde_json::json!({ "standing": "away", "home_region": home }),
            format!(
                "table {}: a global table projected from its home region {home}; a worker in {region} writes nothing",
                c.table
            ),
        ),
        // Said and exit 2 where results become exit codes.
        Err(error) => return Err(error),
    };
    match format {
        OutputFormat::Text => println!("{said}"),
        OutputFormat::Json => {
            let mut line = standing;
            line["table"] = serde_json::Value::String(c.table.clone());
            line["region"] = serde_json::Value::String(region.clone());
            println!("{line}");
        }
    }
    // The specs other consumers run on the table (see `--consumer`).
    let registry = crate::control::Registry::new(c.dynamodb.clone(), &c.table, &c.spec.table);
    let conflicts = registry
        .consumer_conflicts(&c.spec, target.consumer.as_deref())
        .await?;
    for conflict in &conflicts {
        eprintln!("error: {conflict}");
    }
    if !conflicts.is_empty() {
        return Ok(Outcome::Found);
    }
    Ok(Outcome::Done)
}

/// `wait`: until what the spec derives from one item's current state is
/// in place (see [`crate::audit::wait`]).
pub async fn wait(
    target: Target,
    keys: Vec<String>,
    timeout: std::time::Duration,
    format: OutputFormat,
) -> anyhow::Result<Outcome> {
    // Exit 1 means "not projected" here: a spec that does not load is an
    // error (2), its problems printed.
    let c = match connect(&target).await {
        Ok(connection) => connection,
        Err(Ok(_)) => return Ok(Outcome::Failed),
        Err(Err(error)) => return Err(error),
    };
    let key = item_key(&c.spec.table, &keys)?;
    let applier = c.applier();
    let waited = crate::audit::wait::wait(
        &applier,
        &key,
        &crate::audit::wait::WaitOptions {
            timeout,
            ..Default::default()
        },
    )
    .await?;
    use crate::audit::wait::Status;
    match format {
        OutputFormat::Json => println!("{}", serde_json::to_string(&waited)?),
        OutputFormat::Text => match &waited.status {
            Status::Projected => println!(
                "{key}: projected ({} checks, {} ms)",
                waited.checks, waited.waited_ms
            ),
            Status::Pending { pending } => {
                println!(
                    "{key}: still pending after {} ms ({} checks):",
                    waited.waited_ms, waited.checks
                );
                for p in pending {
                    println!("  {}: {}: {}", p.projection, p.item, p.detail);
                }
            }
            Status::Held { letters } => {
                println!("{key}: held behind dead letters, which `ddb-projector dlq redrive` applies again once fixed:");
                for (projection, error) in letters {
                    println!("  {projection}: {error}");
                }
            }
        },
    }
    Ok(match waited.status {
        Status::Projected => Outcome::Done,
        _ => Outcome::Found,
    })
}

/// The key `NAME=VALUE` pairs name: the table's partition key, and its
/// sort key when it has one.
fn item_key(table: &crate::spec::TableSpec, pairs: &[String]) -> anyhow::Result<ItemKey> {
    let mut values = std::collections::HashMap::new();
    for pair in pairs {
        let Some((name, value)) = pair.split_once('=') else {
            bail!(
                "--key {pair}: expected NAME=VALUE (for example --key {}=USER#u1)",
                table.partition_key
            );
        };
        let known = name == table.partition_key || table.sort_key.as_deref() == Some(name);
        if !known {
            bail!(
                "--key {pair}: `{name}` is not a key attribute of the table (its keys: {})",
                std::iter::once(table.partition_key.as_str())
                    .chain(table.sort_key.as_deref())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        if values.insert(name.to_string(), value.to_string()).is_some() {
            bail!("--key {name} given twice");
        }
    }
    let Some(pk) = values.remove(&table.partition_key) else {
        bail!(
            "--key {}=VALUE is needed (the partition key)",
            table.partition_key
        );
    };
    let sk = match &table.sort_key {
        Some(name) => Some(values.remove(name).ok_or_else(|| {
            anyhow::anyhow!("--key {name}=VALUE is needed (the table's sort key)")
        })?),
        None => None,
    };
    Ok(ItemKey { pk, sk })
}
