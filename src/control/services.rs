//! Service registrations: the spec each service registered for the table,
//! every version of it, and the table's registry version, kept in the
//! table itself so that workers serve what is registered without a spec
//! file, a rebuild or a redeploy.
//!
//! Each service keeps its versions under a partition key that names it
//! (`_ddbp#svc#<service>`): a service team's role can be scoped to it with
//! `dynamodb:LeadingKeys`. What every registration must touch is one
//! shared item (`_ddbp#registry`), which holds no spec text: the table's
//! registry version (`version`, `lastBy`) and, for each registered
//! service, an attribute of its own (`s#<service>`, its current version),
//! so that `dynamodb:Attributes` can keep a team's role off the other
//! services' attributes (`infra/service-team-policy.json`). A
//! registration writes, in one `TransactWriteItems` conditioned on the
//! registry version it composed against, the service's new version, its
//! `current` item and the shared item's next version: two registrations
//! that composed against one version never both land.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeValue as Av, KeysAndAttributes, Put, TransactWriteItem, Update,
};
use serde::Serialize;

use crate::apply::ApplyError;
use crate::dynamo::names::{REGISTRY_PK, SERVICE_PK_PREFIX};
use crate::dynamo::retry::describe as retry_describe;
use crate::dynamo::time::{iso, now_ms};
use crate::spec::raw::RawSpec;
use crate::spec::{Spec, SpecErrors, SpecSet, TableSpec};

/// The largest spec text a registration stores: an item holds 400 KB.
pub const MAX_SPEC_BYTES: usize = 350 * 1024;

/// The sort key of a service's current registration.
const CURRENT: &str = "current";

/// The sort key of the shared item.
const SHARED: &str = "registry";

/// The prefix of a registered service's attribute on the shared item.
const SERVICE_ATTRIBUTE: &str = "s#";

/// One version of a service's registration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Registration {
    /// The service (the spec's `service`).
    pub service: String,
    /// Its version: 1 for the first registration, one more for each after.
    pub version: u64,
    /// The spec text; `None` for an unregistration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Who registered it (`--by`, or the OS user).
    pub by: String,
    /// When (ms since the epoch).
    pub at_ms: u64,
    /// When, as text.
    pub at: String,
    /// The table's registry version it made.
    pub registry_version: u64,
}

/// What the shared item says is registered: the table's registry version
/// and each registered service's current version. Workers serve a new
/// registration when it changes: a service's own entry moves only with
/// its own registration (a team's role cannot move another's), so no
/// version written back hides one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stamp {
    /// The registry version.
    pub version: u64,
    /// Each registered service's current version.
    pub services: BTreeMap<String, u64>,
}

/// What is registered for the table now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Registered {
    /// The table's registry version (0: nothing was ever registered).
    pub version: u64,
    /// What the shared item said when this was read.
    pub stamp: Stamp,
    /// Each registered service's current registration (unregistered ones
    /// are left out).
    pub services: BTreeMap<String, Registration>,
}

impl Registered {
    /// The registered specs composed into the one spec the table's workers
    /// serve, with `replace` (a service and its text, or `None` to leave it
    /// out) in the place of that service's current registration. Every
    /// spec describes the table it is registered in, whatever its `[table]
    /// name` says (one spec serves a service's staging and production
    /// tables). `Ok(None)`: nothing would be registered.
    pub fn compose(
        &self,
        table: &str,
        replace: Option<(&str, Option<&str>)>,
    ) -> Result<Option<Spec>, SpecErrors> {
        let mut texts: Vec<(String, String)> = Vec::new();
        for (service, registration) in &self.services {
            if replace.is_some_and(|(name, _)| name == service) {
                continue;
            }
            if let Some(text) = &registration.text {
                texts.push((
                    format!("service `{service}` v{} (registered)", registration.version),
                    text.clone(),
                ));
            }
        }
        if let Some((service, Some(text))) = replace {
            texts.push((
                format!("service `{service}` (to register)"),
                text.to_string(),
            ));
        }
        compose_texts(table, &texts)
    }
}

impl Registered {
    /// The spec the table's workers serve: the registered specs composed,
    /// or, when nothing is registered, a spec of the table's `keys` alone.
    pub fn spec(&self, table: &str, keys: (&str, Option<&str>)) -> Result<Spec, SpecErrors> {
        Ok(match self.compose(table, None)? {
            Some(spec) => spec,
            None => super::register::empty_spec(table, keys),
        })
    }
}

/// Parses and composes spec texts (label, text) for `table`.
pub fn compose_texts(table: &str, texts: &[(String, String)]) -> Result<Option<Spec>, SpecErrors> {
    if texts.is_empty() {
        return Ok(None);
    }
    let mut raws = Vec::new();
    let mut errors = Vec::new();
    for (label, text) in texts {
        match toml::from_str::<RawSpec>(text) {
            Ok(mut raw) => {
                raw.table.name = table.to_string();
                raws.push((label.clone(), raw));
            }
            Err(error) => errors.push(crate::spec::SpecError {
                file: label.clone(),
                context: String::new(),
                problem: format!("invalid spec TOML: {}", error.to_string().trim_end()),
            }),
        }
    }
    if !errors.is_empty() {
        return Err(SpecErrors(errors));
    }
    let set = SpecSet::compose(raws)?;
    Ok(set.specs().first().map(|spec| (**spec).clone()))
}

/// Whether `name` can name a service: lowercase letters, digits, `-`, `_`
/// and `.`, starting with a letter or digit, at most 64 characters (it
/// goes into keys and IAM conditions).
pub fn check_service_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c))
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "service name {name:?} cannot be registered: use lowercase letters, digits, `-`, `_` and `.` (at most 64, starting with a letter or digit)"
        ))
    }
}

/// What writing a registration found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// Stored: the service's version and the table's registry version.
    Stored {
        /// The service's new version.
        version: u64,
        /// The table's new registry version.
        registry_version: u64,
    },
    /// Another registration landed since the registry was read (at this
    /// version): compose again.
    Moved(u64),
}

/// Reads and writes the service registrations of one table.
#[derive(Debug, Clone)]
pub struct Registrations {
    client: aws_sdk_dynamodb::Client,
    table: String,
    pk: String,
    sk: Option<String>,
}

impl Registrations {
    /// The registrations of `table`, with `keys`' key attributes.
    pub fn new(client: aws_sdk_dynamodb::Client, table: &str, keys: &TableSpec) -> Registrations {
        Registrations {
            client,
            table: table.to_string(),
            pk: keys.partition_key.clone(),
            sk: keys.sort_key.clone(),
        }
    }

    /// The registrations of `table`, its key attributes read from the
    /// table's description.
    pub async fn of_table(
        client: &aws_sdk_dynamodb::Client,
        table: &str,
    ) -> anyhow::Result<Registrations> {
        let described = crate::dynamo::client::describe_table(client, table).await?;
        let pk = described.partition_key;
        let sk = described.sort_key;
        Ok(Registrations {
            client: client.clone(),
            table: table.to_string(),
            pk,
            sk,
        })
    }

    /// The table's key attributes: partition key, sort key.
    pub fn keys(&self) -> (&str, Option<&str>) {
        (&self.pk, self.sk.as_deref())
    }

    /// The DynamoDB client.
    pub fn client(&self) -> &aws_sdk_dynamodb::Client {
        &self.client
    }

    /// The table.
    pub fn table(&self) -> &str {
        &self.table
    }

    fn fatal(&self, what: &str, error: impl std::error::Error + 'static) -> ApplyError {
        ApplyError::Fatal {
            table: self.table.clone(),
            message: format!(
                "{what} the service registrations: {}",
                retry_describe(&error)
            ),
        }
    }

    /// The key of the item `sk` under partition `pk` (a table without a
    /// sort key: both in the partition key).
    fn key(&self, pk: &str, sk: &str) -> HashMap<String, Av> {
        let mut key = HashMap::new();
        match &self.sk {
            Some(name) => {
                key.insert(self.pk.clone(), Av::S(pk.to_string()));
                key.insert(name.clone(), Av::S(sk.to_string()));
            }
            None => {
                key.insert(self.pk.clone(), Av::S(format!("{pk}#{sk}")));
            }
        }
        key
    }

    fn service_pk(service: &str) -> String {
        format!("{SERVICE_PK_PREFIX}{service}")
    }

    async fn get(
        &self,
        key: HashMap<String, Av>,
    ) -> Result<Option<HashMap<String, Av>>, ApplyError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.fatal("reading", e))?;
        Ok(output.item)
    }

    /// The shared item: the registry version and each registered
    /// service's current version.
    pub async fn stamp(&self) -> Result<Stamp, ApplyError> {
        let Some(item) = self.get(self.key(REGISTRY_PK, SHARED)).await? else {
            return Ok(Stamp::default());
        };
        let version = number(&item, "version").unwrap_or(0);
        let services = item
            .iter()
            .filter_map(|(name, value)| {
                let service = name.strip_prefix(SERVICE_ATTRIBUTE)?;
                match value {
                    Av::N(n) => Some((service.to_string(), n.parse().unwrap_or(0))),
                    _ => None,
                }
            })
            .collect();
        Ok(Stamp { version, services })
    }

    /// What is registered now, read whole: the shared item, then each
    /// registered service's `current` item, which must be the version the
    /// shared item names (a registration replicating to a global table's
    /// replica arrives item by item), then the shared item again. A read
    /// that does not agree starts over, after a pause; a registry that
    /// never agrees is an error, never a part of it.
    pub async fn read(&self) -> Result<Registered, ApplyError> {
        let mut pause = std::time::Duration::from_millis(50);
        let mut problem = String::new();
        for _attempt in 0..8 {
            let stamp = self.stamp().await?;
            match self.current_items(&stamp).await? {
                Ok(services) => {
                    if self.stamp().await? == stamp {
                        return Ok(Registered {
                            version: stamp.version,
                            stamp,
                            services,
                        });
                    }
                    problem = "a registration landed while they were read".to_string();
                }
                Err(why) => problem = why,
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_secs(2));
        }
        Err(ApplyError::Fatal {
            table: self.table.clone(),
            message: format!("the service registrations cannot be read whole: {problem}"),
        })
    }

    /// Each service's `current` item the stamp names, when every one is
    /// the version it names (`Err`: what does not agree).
    async fn current_items(
        &self,
        stamp: &Stamp,
    ) -> Result<Result<BTreeMap<String, Registration>, String>, ApplyError> {
        let mut services = BTreeMap::new();
        let keys: Vec<HashMap<String, Av>> = stamp
            .services
            .keys()
            .map(|name| self.key(&Registrations::service_pk(name), CURRENT))
            .collect();
        for chunk in keys.chunks(100) {
            let mut pending = chunk.to_vec();
            let mut pause = std::time::Duration::from_millis(20);
            for _ in 0..8 {
                if pending.is_empty() {
                    break;
                }
                let output = self
                    .client
                    .batch_get_item()
                    .request_items(
                        &self.table,
                        KeysAndAttributes::builder()
                            .set_keys(Some(pending.clone()))
                            .consistent_read(true)
                            .build()
                            .expect("keys are set"),
                    )
                    .send()
                    .await
                    .map_err(|e| self.fatal("reading", e))?;
                for item in output
                    .responses()
                    .and_then(|r| r.get(&self.table))
                    .into_iter()
                    .flatten()
                {
                    if let Some(registration) = parse(item) {
                        services.insert(registration.service.clone(), registration);
                    }
                }
                pending = output
                    .unprocessed_keys()
                    .and_then(|u| u.get(&self.table))
                    .map(|k| k.keys().to_vec())
                    .unwrap_or_default();
                if !pending.is_empty() {
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
            }
            if !pending.is_empty() {
                return Ok(Err(format!(
                    "{} registrations were left unread by BatchGetItem",
                    pending.len()
                )));
            }
        }
        for (name, version) in &stamp.services {
            match services.get(name) {
                Some(r) if r.version == *version && r.text.is_some() => {}
                Some(r) => {
                    return Ok(Err(format!(
                        "service `{name}`: the registry names v{version}, its current item is v{}",
                        r.version
                    )))
                }
                None => return Ok(Err(format!("service `{name}` has no current item"))),
            }
        }
        Ok(Ok(services))
    }

    /// Every version a service registered, oldest first.
    pub async fn history(&self, service: &str) -> Result<Vec<Registration>, ApplyError> {
        let mut out = Vec::new();
        let mut start: Option<HashMap<String, Av>> = None;
        loop {
            let mut query = self
                .client
                .query()
                .table_name(&self.table)
                .consistent_read(true)
                .set_exclusive_start_key(start.take());
            query = match &self.sk {
                Some(sk) => query
                    .key_condition_expression("#pk = :pk AND begins_with(#sk, :v)")
                    .expression_attribute_names("#pk", &self.pk)
                    .expression_attribute_names("#sk", sk)
                    .expression_attribute_values(":pk", Av::S(Registrations::service_pk(service)))
                    .expression_attribute_values(":v", Av::S("v#".into())),
                None => {
                    // Each version is a partition of its own.
                    let (current, _) = self.current_version(service).await?;
                    for version in 1..=current {
                        if let Some(item) = self
                            .get(
                                self.key(&Registrations::service_pk(service), &version_sk(version)),
                            )
                            .await?
                        {
                            out.extend(parse(&item));
                        }
                    }
                    return Ok(out);
                }
            };
            let page = query.send().await.map_err(|e| self.fatal("reading", e))?;
            out.extend(page.items().iter().filter_map(parse));
            match page.last_evaluated_key() {
                Some(key) if !key.is_empty() => start = Some(key.clone()),
                _ => break,
            }
        }
        out.sort_by_key(|r| r.version);
        Ok(out)
    }

    /// A service's current version number (0: never registered) and
    /// whether it is registered now.
    pub async fn current_version(&self, service: &str) -> Result<(u64, bool), ApplyError> {
        Ok(self
            .get(self.key(&Registrations::service_pk(service), CURRENT))
            .await?
            .and_then(|item| parse(&item))
            .map_or((0, false), |r| (r.version, r.text.is_some())))
    }

    /// Writes `service`'s next version (`text`; `None` unregisters it) if
    /// the table's registry is still at `expected`, in one transaction
    /// with its `current` item and the shared item.
    pub async fn write(
        &self,
        expected: u64,
        service: &str,
        text: Option<&str>,
        by: &str,
    ) -> Result<Written, ApplyError> {
        let (current, _) = self.current_version(service).await?;
        let version = current + 1;
        let registry_version = expected + 1;
        let at_ms = now_ms();
        let mut fields: Vec<(&str, Av)> = vec![
            ("service", Av::S(service.to_string())),
            ("version", Av::N(version.to_string())),
            ("by", Av::S(by.to_string())),
            ("atMs", Av::N(at_ms.to_string())),
            ("registryVersion", Av::N(registry_version.to_string())),
        ];
        if let Some(text) = text {
            fields.push(("text", Av::S(text.to_string())));
        }
        let item = |sk: &str| {
            let mut item = self.key(&Registrations::service_pk(service), sk);
            for (name, value) in &fields {
                item.insert(name.to_string(), value.clone());
            }
            item
        };
        let versioned = Put::builder()
            .table_name(&self.table)
            .set_item(Some(item(&version_sk(version))))
            .condition_expression("attribute_not_exists(#pk)")
            .expression_attribute_names("#pk", &self.pk)
            .build()
            .expect("table and item are set");
        let current_item = Put::builder()
            .table_name(&self.table)
            .set_item(Some(item(CURRENT)))
            .build()
            .expect("table and item are set");
        let update = if text.is_some() {
            "SET #v = :next, #by = :by, #s = :me"
        } else {
            "SET #v = :next, #by = :by REMOVE #s"
        };
        let mut shared = Update::builder()
            .table_name(&self.table)
            .set_key(Some(self.key(REGISTRY_PK, SHARED)))
            .update_expression(update)
            .condition_expression(if expected == 0 {
                "attribute_not_exists(#v) OR #v = :expected"
            } else {
                "#v = :expected"
            })
            .expression_attribute_names("#v", "version")
            .expression_attribute_names("#s", format!("{SERVICE_ATTRIBUTE}{service}"))
            .expression_attribute_names("#by", "lastBy")
            .expression_attribute_values(":next", Av::N(registry_version.to_string()))
            .expression_attribute_values(":expected", Av::N(expected.to_string()))
            .expression_attribute_values(":by", Av::S(by.to_string()));
        if text.is_some() {
            shared = shared.expression_attribute_values(":me", Av::N(version.to_string()));
        }
        let shared = shared.build().expect("table, key and expression are set");
        let sent = self
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().update(shared).build())
            .transact_items(TransactWriteItem::builder().put(versioned).build())
            .transact_items(TransactWriteItem::builder().put(current_item).build())
            .send()
            .await;
        match sent {
            Ok(_) => Ok(Written::Stored {
                version,
                registry_version,
            }),
            Err(error) => {
                // Another registration landed, or is landing (two
                // transactions on the shared item at once): compose again.
                let moved = match error.as_service_error() {
                    Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) => {
                        cancelled.cancellation_reasons().iter().take(2).any(|r| {
                            matches!(
                                r.code(),
                                Some("ConditionalCheckFailed") | Some("TransactionConflict")
                            )
                        })
                    }
                    _ => false,
                };
                if moved {
                    return Ok(Written::Moved(self.stamp().await?.version));
                }
                Err(self.fatal("writing", error))
            }
        }
    }
}

fn version_sk(version: u64) -> String {
    format!("v#{version:08}")
}

fn number(item: &HashMap<String, Av>, name: &str) -> Option<u64> {
    match item.get(name) {
        Some(Av::N(n)) => n.parse().ok(),
        _ => None,
    }
}

fn parse(item: &HashMap<String, Av>) -> Option<Registration> {
    let text = |name: &str| match item.get(name) {
        Some(Av::S(value)) => Some(value.clone()),
        _ => None,
    };
    let at_ms = number(item, "atMs").unwrap_or(0);
    Some(Registration {
        service: text("service")?,
        version: number(item, "version")?,
        text: text("text"),
        by: text("by").unwrap_or_default(),
        at_ms,
        at: iso(at_ms),
        registry_version: number(item, "registryVersion").unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_are_what_keys_and_policies_can_hold() {
        for good in ["social-service", "ads.v2", "a", "team_x9"] {
            assert!(check_service_name(good).is_ok(), "{good}");
        }
        for bad in ["", "Social", "has space", "a#b", "-lead", &"x".repeat(65)] {
            let error = check_service_name(bad).unwrap_err();
            assert!(error.contains("cannot be registered"), "{bad}: {error}");
        }
    }

    #[test]
    fn registered_specs_describe_the_table_they_are_registered_in() {
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("projections/social-service.toml"),
        )
        .unwrap();
        let spec = compose_texts("Social-staging", &[("s".into(), text)])
            .unwrap()
            .unwrap();
        assert_eq!(spec.table.name, "Social-staging");
        assert!(compose_texts("t", &[]).unwrap().is_none());
    }
}
