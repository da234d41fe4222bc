//! `register` and `unregister` as procedures: compose a service's spec with
//! what the table has registered, say what would change and what the
//! lifecycle will ask for, and store it atomically against the registry
//! version it was composed with (see [`super::services`]).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::services::{check_service_name, Registered, Registrations, Written, MAX_SPEC_BYTES};
use super::status::{states, Commands, State};
use super::Registry;
use crate::spec::raw::RawSpec;
use crate::spec::{Spec, SpecErrors};

/// What to register, or unregister.
#[derive(Debug, Clone)]
pub struct Change {
    /// The table.
    pub table: String,
    /// Register this text (labelled with its file); `None`: unregister.
    pub text: Option<(String, String)>,
    /// The service to unregister (with `text: None`).
    pub service: Option<String>,
    /// Who makes the change.
    pub by: String,
    /// Say what would change; store nothing.
    pub dry_run: bool,
}

/// One projection of the table, before and after the change.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedProjection {
    /// The projection.
    pub name: String,
    /// The service that registers it.
    pub service: String,
    /// `new`, `changed`, `retired` or `unchanged`, against what is
    /// registered now.
    pub change: &'static str,
    /// The lifecycle's state once the workers serve the change.
    pub state: &'static str,
    /// What the lifecycle will ask for next (a backfill, a prune).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// What a registration did, or would do.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Planned {
    /// The table.
    pub table: String,
    /// The service.
    pub service: String,
    /// `register` or `unregister`.
    pub action: &'static str,
    /// The service's version registered before (0: none).
    pub previous_version: u64,
    /// The table's registry version composed against.
    pub registry_version: u64,
    /// The projections the change touches (every projection of the
    /// service, and any other whose state the lifecycle reports).
    pub projections: Vec<PlannedProjection>,
    /// The text is what is registered already: nothing to store.
    pub unchanged: bool,
    /// A dry run: nothing stored.
    pub dry_run: bool,
    /// What was stored: the service's version and the registry's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stored: Option<Stored>,
    /// Registrations that landed first and were composed with (a race).
    pub retries: u32,
    /// What the plan could not say exactly.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// A stored registration.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stored {
    /// The service's new version.
    pub version: u64,
    /// The table's new registry version.
    pub registry_version: u64,
}

/// Why a registration was refused (exit 1) or failed (exit 2).
#[derive(Debug)]
pub enum RegisterError {
    /// The spec or the change cannot be registered: every problem.
    Refused(Vec<String>),
    /// The registry could not be read or written.
    Failed(anyhow::Error),
}

impl From<anyhow::Error> for RegisterError {
    fn from(error: anyhow::Error) -> RegisterError {
        RegisterError::Failed(error)
    }
}

impl From<crate::apply::ApplyError> for RegisterError {
    fn from(error: crate::apply::ApplyError) -> RegisterError {
        RegisterError::Failed(error.into())
    }
}

/// How many registrations that land first a registration composes with
/// again before it gives up.
const ATTEMPTS: u32 = 8;

/// Checks a spec text for registration on a table keyed as described:
/// its size, its service name, its table. The service it names.
pub fn admit(
    label: &str,
    text: &str,
    table: &str,
    keys: (&str, Option<&str>),
) -> Result<String, Vec<String>> {
    if text.trim().is_empty() {
        return Err(vec![format!("{label}: the spec is empty")]);
    }
    if text.len() > MAX_SPEC_BYTES {
        return Err(vec![format!(
            "{label}: the spec is {} KB; a registration holds at most {} KB (a DynamoDB item holds 400 KB)",
            text.len() / 1024,
            MAX_SPEC_BYTES / 1024
        )]);
    }
    let raw: RawSpec = toml::from_str(text).map_err(|error| {
        vec![format!(
            "{label}: invalid spec TOML: {}",
            error.to_string().trim_end()
        )]
    })?;
    let mut problems = Vec::new();
    if let Err(problem) = check_service_name(&raw.service) {
        problems.push(format!("{label}: {problem}"));
    }
    let renamed = renamed_table(&raw.table.name);
    if raw.table.name != table && renamed.as_deref() != Some(table) {
        problems.push(format!(
            "{label}: the spec describes table `{}`, not `{table}`: register it into `{}`, or set {}={}={table} when one spec serves tables of other names",
            raw.table.name,
            raw.table.name,
            crate::dynamo::names::TABLE_NAMES_VAR,
            raw.table.name
        ));
    }
    let (pk, sk) = keys;
    let spec_sk = (!raw.table.sort_key.is_empty()).then_some(raw.table.sort_key.as_str());
    if raw.table.partition_key != pk || spec_sk != sk {
        problems.push(format!(
            "{label}: the spec's keys ({} / {}) are not table `{table}`'s ({pk} / {})",
            raw.table.partition_key,
            spec_sk.unwrap_or("no sort key"),
            sk.unwrap_or("no sort key")
        ));
    }
    if problems.is_empty() {
        Ok(raw.service)
    } else {
        Err(problems)
    }
}

/// The actual name `PROJECTOR_TABLE_NAMES` gives the table a spec names.
fn renamed_table(name: &str) -> Option<String> {
    let map = std::env::var(crate::dynamo::names::TABLE_NAMES_VAR).ok()?;
    map.split(',').find_map(|entry| {
        let (from, to) = entry.split_once('=')?;
        (from.trim() == name).then(|| to.trim().to_string())
    })
}

/// Registers (or unregisters) a service's spec: composes it with what is
/// registered, plans, and unless a dry run stores it, composing again
/// when another registration lands first.
pub async fn register(
    registrations: &Registrations,
    change: &Change,
) -> Result<Planned, RegisterError> {
    let described =
        crate::dynamo::client::describe_table(registrations.client(), &change.table).await?;
    let keys = (
        described.partition_key.as_str(),
        described.sort_key.as_deref(),
    );
    let service = match (&change.text, &change.service) {
        (Some((label, text)), _) => {
            admit(label, text, &change.table, keys).map_err(RegisterError::Refused)?
        }
        (None, Some(service)) => service.clone(),
        (None, None) => {
            return Err(RegisterError::Failed(anyhow::anyhow!(
                "nothing to register: a spec or a service to unregister"
            )))
        }
    };
    let mut retries = 0;
    loop {
        let registered = registrations.read().await?;
        let current = registered.services.get(&service);
        if change.text.is_none() && current.is_none() {
            return Err(RegisterError::Refused(vec![format!(
                "service `{service}` is not registered for table `{}` (registered: {})",
                change.table,
                names(&registered)
            )]));
        }
        let text = change.text.as_ref().map(|(_, text)| text.as_str());
        let unchanged = match (current, text) {
            (Some(current), Some(text)) => current.text.as_deref() == Some(text),
            _ => false,
        };
        let mut planned = plan(
            registrations,
            &registered,
            &change.table,
            &service,
            text,
            keys,
        )
        .await?;
        planned.unchanged = unchanged;
        planned.dry_run = change.dry_run;
        planned.retries = retries;
        if change.dry_run || unchanged {
            return Ok(planned);
        }
        match registrations
            .write(registered.version, &service, text, &change.by)
            .await?
        {
            Written::Stored {
                version,
                registry_version,
            } => {
                planned.stored = Some(Stored {
                    version,
                    registry_version,
                });
                tracing::info!(
                    table = change.table,
                    service,
                    version,
                    registry_version,
                    by = change.by,
                    action = planned.action,
                    "registered"
                );
                metrics::counter!("projector_registrations_total", "action" => planned.action)
                    .increment(1);
                return Ok(planned);
            }
            Written::Moved(now) => {
                retries += 1;
                tracing::info!(
                    table = change.table,
                    service,
                    composed = registered.version,
                    now,
                    "another registration landed first: composing again"
                );
                if retries >= ATTEMPTS {
                    return Err(RegisterError::Failed(anyhow::anyhow!(
                        "the registry of `{}` moved {ATTEMPTS} times while this registration was composed; try again",
                        change.table
                    )));
                }
            }
        }
    }
}

fn names(registered: &Registered) -> String {
    if registered.services.is_empty() {
        return "none".to_string();
    }
    registered
        .services
        .keys()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

/// What registering `text` for `service` (`None`: unregistering it) does
/// to the table's projections, and the lifecycle's answer for each.
async fn plan(
    registrations: &Registrations,
    registered: &Registered,
    table: &str,
    service: &str,
    text: Option<&str>,
    keys: (&str, Option<&str>),
) -> Result<Planned, RegisterError> {
    let refused = |errors: SpecErrors| {
        RegisterError::Refused(errors.0.iter().map(|e| e.to_string()).collect())
    };
    // What is registered may not compose for this binary (a text another
    // version stored): a change that composes is still allowed, so that
    // the offending service can be fixed or unregistered.
    let mut warnings = Vec::new();
    let before = match registered.compose(table, None) {
        Ok(before) => before,
        Err(errors) => {
            warnings.push(format!(
                "what is registered now does not compose; every projection is shown as new:\n{errors}"
            ));
            None
        }
    };
    let after = registered
        .compose(table, Some((service, text)))
        .map_err(refused)?;
    let after = match after {
        Some(spec) => spec,
        None => empty_spec(table, keys),
    };
    let definitions = |spec: Option<&Spec>| -> BTreeMap<String, (String, u64)> {
        spec.map(|spec| {
            spec.projections
                .iter()
                .enumerate()
                .filter(|(id, _)| !spec.is_old_version(*id))
                .map(|(_, p)| {
                    (
                        p.name.clone(),
                        (spec.service_of(&p.name).to_string(), p.fingerprint),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
    };
    let old = definitions(before.as_ref());
    let new = definitions(Some(&after));
    let registry = Registry::new(registrations.client().clone(), table, &after.table);
    let (laid, _) = registry.layout(&after).await?;
    // Another consumer's spec file on the table that this composition
    // would fight (each undoing the other's writes, or a loop).
    let conflicts = registry.consumer_conflicts(&laid, None).await?;
    if !conflicts.is_empty() {
        return Err(RegisterError::Refused(conflicts));
    }
    let snapshot = registry.snapshot(&laid).await?;
    let commands = Commands {
        target: format!("--table {table}"),
        consumer: None,
        registered: true,
    };
    let lifecycle: HashMap<String, (State, Option<String>)> = states(
        &laid,
        &snapshot,
        crate::dynamo::time::now_ms(),
        registry.skew_ms(),
        &HashMap::new(),
        &commands,
    )
    .into_iter()
    .map(|row| (row.name, (row.state, row.next)))
    .collect();
    let mut projections = Vec::new();
    let names: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    for name in names {
        let (owner, change) = match (old.get(name), new.get(name)) {
            (None, Some((owner, _))) => (owner.clone(), "new"),
            (Some((owner, _)), None) => (owner.clone(), "retired"),
            (Some((_, a)), Some((owner, b))) if a != b => (owner.clone(), "changed"),
            (Some(_), Some((owner, _))) => (owner.clone(), "unchanged"),
            (None, None) => continue,
        };
        let (state, next) = match lifecycle.get(name.as_str()) {
            Some((state, next)) => (state.as_str(), next.clone()),
            None if change == "retired" => (
                State::Retired.as_str(),
                Some(format!(
                    "ddb-projector prune --table {table} --projection {name}"
                )),
            ),
            None => ("-", None),
        };
        // Other services' projections are listed only when the lifecycle
        // has something to say of them.
        if owner != service && change == "unchanged" && next.is_none() {
            continue;
        }
        projections.push(PlannedProjection {
            name: name.clone(),
            service: owner,
            change,
            state,
            next,
        });
    }
    let previous_version = registered.services.get(service).map_or(0, |r| r.version);
    Ok(Planned {
        table: table.to_string(),
        service: service.to_string(),
        action: if text.is_some() {
            "register"
        } else {
            "unregister"
        },
        previous_version,
        registry_version: registered.version,
        projections,
        unchanged: false,
        dry_run: false,
        stored: None,
        retries: 0,
        warnings,
    })
}

/// The spec of a table nothing is registered for: its keys, no entity, no
/// projection. Its workers project nothing, and read every projection the
/// lifecycle knows as retired.
pub fn empty_spec(table: &str, keys: (&str, Option<&str>)) -> Spec {
    let raw = RawSpec {
        service: "(none registered)".to_string(),
        table: crate::schema::raw::RawTable {
            name: table.to_string(),
            partition_key: keys.0.to_string(),
            sort_key: keys.1.unwrap_or_default().to_string(),
            ttl_attribute: None,
            gsis: Vec::new(),
        },
        ..RawSpec::default()
    };
    Spec::compile(
        raw,
        &format!("the registry of `{table}` (nothing registered)"),
        Vec::new(),
    )
    .expect("a spec of keys alone compiles")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn social() -> String {
        std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("projections/social-service.toml"),
        )
        .unwrap()
    }

    #[test]
    fn a_spec_is_admitted_for_its_own_table_and_keys_only() {
        let keys = ("PK", Some("SK"));
        assert_eq!(
            admit("s.toml", &social(), "SocialServiceTable", keys).unwrap(),
            "social-service"
        );
        let other = admit("s.toml", &social(), "Orders", keys).unwrap_err();
        assert!(
            other[0].contains("describes table `SocialServiceTable`, not `Orders`"),
            "{other:?}"
        );
        let keyed = admit("s.toml", &social(), "SocialServiceTable", ("pk", None)).unwrap_err();
        assert!(keyed[0].contains("are not table"), "{keyed:?}");
        let empty = admit("e.toml", " \n", "T", keys).unwrap_err();
        assert_eq!(empty, vec!["e.toml: the spec is empty".to_string()]);
        let big = format!("{}\n#{}", social(), "x".repeat(MAX_SPEC_BYTES));
        let big = admit("b.toml", &big, "SocialServiceTable", keys).unwrap_err();
        assert!(big[0].contains("at most 350 KB"), "{big:?}");
        let spaced = social().replace("\"social-service\"", "\"social service\"");
        let spaced = admit("n.toml", &spaced, "SocialServiceTable", keys).unwrap_err();
        assert!(
            spaced[0].contains("\"social service\" cannot be registered"),
            "{spaced:?}"
        );
    }

    #[test]
    fn a_table_with_nothing_registered_has_a_spec_of_its_keys_alone() {
        let spec = empty_spec("T", ("PK", Some("SK")));
        assert!(spec.projections.is_empty());
        assert_eq!(spec.table.name, "T");
        let spec = empty_spec("T", ("id", None));
        assert_eq!(spec.table.sort_key, None);
    }
}
