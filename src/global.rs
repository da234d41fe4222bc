//! Global tables: one region projects, the others write nothing.
//!
//! On a global table (DynamoDB global tables, version 2019.11.21) every
//! replica's stream carries every write, local or replicated, and nothing
//! in a record says where it was made. Conditions are checked against the
//! local replica, a transaction is atomic only in its own region, and a
//! conflict is settled per item, last writer wins. A worker in each region
//! would each apply every change: both find a marker absent and both count
//! it, both add +1 to the same counter shard from the same value and
//! replication keeps one. So exactly one region, the **home region**,
//! projects everything its stream carries (its own writes and the
//! replicated ones alike, as on a single-region table); a worker anywhere
//! else writes nothing.
//!
//! [`role`] decides from the table's description (`DescribeTable`:
//! `Replicas`, `MultiRegionConsistency`), the region the worker runs in,
//! and the home region it was given (`--home-region`,
//! `PROJECTOR_HOME_REGION`, the template's `HomeRegion`).

mod failover;
mod worker;

pub use failover::{failover, Failover, Step};
pub use worker::{run_stream, work, Ran, RunFailed, Worked};

use crate::control::Connection;
use crate::dynamo::client::TableInfo;
use crate::kinds::Writes;
use crate::spec::Spec;

/// The environment variable naming the home region.
pub const HOME_REGION_VAR: &str = "PROJECTOR_HOME_REGION";

/// The environment variable that says the writers of the items the
/// projector writes attributes onto write them in the home region only.
pub const WRITERS_IN_HOME_VAR: &str = "PROJECTOR_WRITERS_IN_HOME_REGION";

/// Where the writers of a global table write the items that projections
/// write attributes onto (`index-keys` onto their sources; `denormalize`,
/// `rollup`, `aggregate` onto their targets).
///
/// A projection's write onto such an item in the home region replicates as
/// the whole item, and the last writer wins: a writer's newer write made
/// in another region and not yet replicated is replaced by the item the
/// projection updated, and lost in every region. Only when those items are
/// written in the home region alone are their writes ordered there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Writers {
    /// Anywhere (the default): projections that write onto writers' items
    /// are refused on a global table.
    #[default]
    Anywhere,
    /// In the home region only, as the deployment states
    /// (`--writers-in-home-region`, `PROJECTOR_WRITERS_IN_HOME_REGION=true`,
    /// the stack's `WritersInHomeRegion`).
    HomeOnly,
}

impl Writers {
    /// From the value of [`WRITERS_IN_HOME_VAR`]: `true`, `1` or `yes`
    /// mean [`Writers::HomeOnly`].
    pub fn from_flag(value: Option<&str>) -> Writers {
        match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            Some("true" | "1" | "yes") => Writers::HomeOnly,
            _ => Writers::Anywhere,
        }
    }
}

/// What a worker in this region does with the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// A table of one region: it projects (a home region given or not).
    Single,
    /// The home region of a global table: it projects everything its
    /// stream carries.
    Home {
        /// Every region the table is in, sorted.
        regions: Vec<String>,
    },
    /// Another region of a global table: it writes nothing.
    Away {
        /// The home region.
        home: String,
    },
}

impl Role {
    /// Whether this worker writes derived state.
    pub fn projects(&self) -> bool {
        !matches!(self, Role::Away { .. })
    }
}

/// Why a worker may not run against a global table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GlobalError {
    /// A global table, and no home region.
    #[error(
        "table `{table}` is a global table (replicas in {regions}): a worker in each region would \
         apply every change once per region and corrupt counters and markers. Set the one region \
         that projects: --home-region REGION, {HOME_REGION_VAR}=REGION, or the stack's \
         HomeRegion parameter (one of {regions}); workers in the other regions then write nothing",
        regions = .regions.join(", ")
    )]
    NoHome {
        /// The table.
        table: String,
        /// Its regions.
        regions: Vec<String>,
    },
    /// The home region is not one of the table's.
    #[error(
        "home region `{home}` is not a region of table `{table}` (its replicas are in {regions}): \
         set {HOME_REGION_VAR}, --home-region or the stack's HomeRegion parameter to one of them",
        regions = .regions.join(", ")
    )]
    HomeNotReplica {
        /// The home region given.
        home: String,
        /// The table.
        table: String,
        /// Its regions.
        regions: Vec<String>,
    },
    /// A table in multi-region strong consistency, which has no
    /// transactions: the worker's guarded writes need them.
    #[error(
        "table `{table}` uses multi-region strong consistency, which has no transactions, and \
         the projector writes in transactions (counters move their shards with the record; \
         backfills, audits and prunes guard their writes with the source; the lifecycle registry \
         records a backfill): {projections}. The consistency mode is set when the global table \
         is created: project a global table created with eventual consistency (the default)",
        projections = if .projections.is_empty() { "every spec".to_string() } else { format!("counters {}", .projections.join(", ")) }
    )]
    NeedsTransactions {
        /// The table.
        table: String,
        /// The counters, which write in transactions on every change.
        projections: Vec<String>,
    },
    /// Projections that write attributes onto items writers write, on a
    /// global table whose writers may write anywhere.
    #[error(
        "table `{table}` is a global table, and projections write attributes onto items its \
         writers write: {projections}. Replication copies the whole item and the last writer \
         wins, so a projection's write in the home region would replace, in every region, a \
         newer write made elsewhere and not yet replicated: user data lost. Write those items in \
         the home region only and say so (--writers-in-home-region, \
         {WRITERS_IN_HOME_VAR}=true, the stack's WritersInHomeRegion parameter), or remove \
         those projections",
        projections = .projections.join(", ")
    )]
    WritesOntoWriters {
        /// The table.
        table: String,
        /// Each projection and the entity it writes onto (`name (onto
        /// entity)`).
        projections: Vec<String>,
    },
    /// A global table of the legacy version, whose records this does not
    /// tell apart.
    #[error(
        "table `{table}` is a global table of version {version}, whose replicas DescribeTable \
         does not list: a worker per region cannot be told apart from a home region here. \
         Upgrade it to version 2019.11.21 (the current one), then set the home region"
    )]
    LegacyVersion {
        /// The table.
        table: String,
        /// Its global tables version.
        version: String,
    },
}

/// The projections of `spec` that write in transactions: counters, whose
/// memberships move their shards in the same transaction as the record.
pub fn transactional(spec: &Spec) -> Vec<String> {
    spec.projections
        .iter()
        .filter(|p| p.kind.dispatch().transactional())
        .map(|p| p.name.clone())
        .collect()
}

/// The projections of `spec` that write attributes onto items writers
/// write, each with that entity: `ik (onto email)`. A custom projection
/// may write anything, so it is named too.
pub fn onto_writers_items(spec: &Spec) -> Vec<String> {
    let entity = |id: crate::spec::EntityId| spec.entities[id].name.as_str();
    spec.projections
        .iter()
        .filter_map(|p| {
            let onto = match p.kind.dispatch().writes(&p.name) {
                Writes::Attributes { entity: on, .. } => Some(entity(on)),
                Writes::Items { .. } | Writes::Own => None,
                Writes::Anything => Some("items it chooses"),
            };
            onto.map(|onto| format!("{} (onto {onto})", p.name))
        })
        .collect()
}

/// What a worker in `region` does with `table`, from the home region it
/// was configured with and the one `ddb-projector failover` recorded in
/// the table (replicated to every region). A recorded home that is not
/// one of the table's regions (its replica removed since) is ignored.
/// When both are given and disagree, the worker writes nothing until they
/// agree, whichever is newer: a failover's record may not have reached
/// this region yet, or may be an older failover's, so neither can be
/// trusted alone (two regions projecting would count twice).
pub fn role_with_record(
    table: &TableInfo,
    spec: &Spec,
    region: &str,
    configured: Option<&str>,
    recorded: Option<&str>,
    writers: Writers,
) -> Result<Role, GlobalError> {
    let configured = configured.map(str::trim).filter(|h| !h.is_empty());
    let recorded = recorded.filter(|r| *r == region || table.replicas.iter().any(|x| x == r));
    match (configured, recorded) {
        (Some(configured), Some(recorded)) if configured != recorded => {
            let role = role(table, spec, region, Some(recorded), writers)?;
            if role == Role::Single {
                return Ok(role);
            }
            tracing::warn!(
                table = table.name,
                configured_home = configured,
                recorded_home = recorded,
                "the configured home region ({configured}) and the one the table records \
                 (set by `ddb-projector failover`: {recorded}) disagree: this worker writes \
                 nothing until they agree; set HomeRegion / {HOME_REGION_VAR} to {recorded}"
            );
            Ok(Role::Away {
                home: recorded.to_string(),
            })
        }
        (configured, recorded) => role(table, spec, region, recorded.or(configured), writers),
    }
}

/// What a worker in `region` does with `table` (see the module docs);
/// `home` is the home region it was given, if any, and `writers` where
/// the items projections write onto are written.
pub fn role(
    table: &TableInfo,
    spec: &Spec,
    region: &str,
    home: Option<&str>,
    writers: Writers,
) -> Result<Role, GlobalError> {
    if table.replicas.is_empty() {
        return match &table.global_version {
            Some(version) if version.starts_with("2017") => Err(GlobalError::LegacyVersion {
                table: table.name.clone(),
                version: version.clone(),
            }),
            _ => Ok(Role::Single),
        };
    }
    let mut regions: Vec<String> = table.replicas.clone();
    if !regions.iter().any(|r| r == region) {
        regions.push(region.to_string());
    }
    regions.sort();
    regions.dedup();
    if table.strong_consistency {
        // Every spec: the registry records backfills in transactions.
        return Err(GlobalError::NeedsTransactions {
            table: table.name.clone(),
            projections: transactional(spec),
        });
    }
    let Some(home) = home.map(str::trim).filter(|h| !h.is_empty()) else {
        return Err(GlobalError::NoHome {
            table: table.name.clone(),
            regions,
        });
    };
    if !regions.iter().any(|r| r == home) {
        return Err(GlobalError::HomeNotReplica {
            home: home.to_string(),
            table: table.name.clone(),
            regions,
        });
    }
    let onto = onto_writers_items(spec);
    if writers == Writers::Anywhere && !onto.is_empty() {
        return Err(GlobalError::WritesOntoWriters {
            table: table.name.clone(),
            projections: onto,
        });
    }
    Ok(if home == region {
        Role::Home { regions }
    } else {
        Role::Away {
            home: home.to_string(),
        }
    })
}

/// A warning when the home region's replica is not `ACTIVE` (being
/// created or updated, its region disabled, its KMS key inaccessible):
/// records may not reach it, and the other regions' derived data waits.
/// `None` when it is active, or the table is not global.
pub fn home_unavailable(table: &TableInfo, home: &str) -> Option<String> {
    let (_, status) = table.inactive.iter().find(|(region, _)| region == home)?;
    Some(format!(
        "the home region {home}'s replica of table `{}` is {status}, not ACTIVE: derived data \
         in every region waits for it. If the region is lost, fail over: `ddb-projector \
         failover --to REGION` in another region (see docs/global-tables.md)",
        table.name
    ))
}

/// Where a worker stands on a table, as DynamoDB describes it now.
#[derive(Debug, Clone)]
pub struct Standing {
    /// Its role, or why the table is refused.
    pub role: Result<Role, GlobalError>,
    /// A warning to show (the home replica not `ACTIVE`).
    pub warning: Option<String>,
}

/// Reads where a worker in `region` stands on `table`: the table's
/// description and, on a global table, the home a failover recorded
/// (see [`role_with_record`]). `Err` when either could not be read: the
/// role is then not known.
pub async fn standing(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    spec: &Spec,
    region: &str,
    configured: Option<&str>,
    writers: Writers,
) -> Result<Standing, String> {
    let info = crate::dynamo::client::describe_table(client, table)
        .await
        .map_err(|error| format!("{error:#}"))?;
    let recorded = match info.replicas.is_empty() {
        true => None,
        false => crate::control::Registry::new(client.clone(), table, &spec.table)
            .recorded_home()
            .await
            .map_err(|error| format!("reading the recorded home region: {error}"))?,
    };
    let warning = recorded
        .as_deref()
        .or(configured)
        .and_then(|home| home_unavailable(&info, home));
    Ok(Standing {
        role: role_with_record(
            &info,
            spec,
            region,
            configured,
            recorded.as_deref(),
            writers,
        ),
        warning,
    })
}

/// What a deployment says of a global table: its home region, and where
/// its writers write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Deployment {
    /// `--home-region`, [`HOME_REGION_VAR`].
    pub home_region: Option<String>,
    /// Where the writers write the items projections write onto.
    pub writers: Writers,
}

/// Where a worker of `c` in its region stands on its table: an error
/// names what to set. A warning (the home replica not `ACTIVE`) is
/// logged (a library prints nothing of its own; the CLI's log shows it).
pub async fn region_role(c: &Connection, deployment: &Deployment) -> anyhow::Result<Role> {
    let standing = standing(
        &c.dynamodb,
        &c.table,
        &c.spec,
        &c.region(),
        deployment.home_region.as_deref(),
        deployment.writers,
    )
    .await
    .map_err(anyhow::Error::msg)?;
    if let Some(warning) = &standing.warning {
        tracing::warn!(table = c.table, "{warning}");
    }
    Ok(standing.role?)
}

/// For a command that writes derived state (`verb`): refuses it outside
/// the home region of a global table, and on one without a home region.
pub async fn require_home(
    c: &Connection,
    deployment: &Deployment,
    verb: &str,
) -> anyhow::Result<()> {
    if let Role::Away { home } = region_role(c, deployment).await? {
        anyhow::bail!(
            "table `{}` is a global table projected from its home region {home}: `{verb}` writes derived state, so it runs in {home} only, not in {} (writes made here would be applied twice)",
            c.table,
            c.region()
        );
    }
    Ok(())
}

/// Why a running worker stopped projecting (see [`stand_down`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StandDown {
    /// Another region is now the home region.
    Away {
        /// The home region.
        home: String,
    },
    /// The table would now be refused (a replica added to a table with no
    /// home region, the consistency mode changed, ...).
    Refused(GlobalError),
}

/// How often a running worker asks again where it stands: the Lambda's
/// cache of a table's role lasts as long.
pub const ROLE_CHECK: std::time::Duration = std::time::Duration::from_secs(60);

/// Asks `check` for this worker's role every `interval` and completes
/// when it should stop projecting: another region became home (a
/// failover recorded it, a replica was added and the home is elsewhere),
/// or the table is refused now. A check that fails (DynamoDB did not
/// answer: the `Err` of the outer result) is logged and asked again.
pub async fn stand_down<F, Fut>(interval: std::time::Duration, mut check: F) -> StandDown
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Result<Role, GlobalError>, String>>,
{
    loop {
        tokio::time::sleep(interval).await;
        match check().await {
            Ok(Ok(Role::Away { home })) => return StandDown::Away { home },
            Ok(Err(refused)) => return StandDown::Refused(refused),
            Ok(Ok(_)) => {}
            Err(error) => {
                tracing::warn!(%error, "checking the table's home region failed: projecting on, asking again");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Spec {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/projections/social-service.toml"
        );
        Spec::from_file(std::path::Path::new(path)).expect("the shipped spec")
    }

    fn table(replicas: &[&str], strong: bool) -> TableInfo {
        TableInfo {
            name: "Social".to_string(),
            partition_key: "PK".to_string(),
            sort_key: Some("SK".to_string()),
            stream_arn: None,
            view_type: None,
            replicas: replicas.iter().map(|r| r.to_string()).collect(),
            strong_consistency: strong,
            global_version: (!replicas.is_empty()).then(|| "2019.11.21".to_string()),
            inactive: Vec::new(),
        }
    }

    #[test]
    fn a_table_of_one_region_projects_with_or_without_a_home() {
        for home in [None, Some("eu-west-1")] {
            assert_eq!(
                role(
                    &table(&[], false),
                    &spec(),
                    "us-east-1",
                    home,
                    Writers::HomeOnly
                ),
                Ok(Role::Single)
            );
        }
    }

    #[test]
    fn a_global_table_needs_a_home_region_that_is_one_of_its_regions() {
        let global = table(&["eu-west-1"], false);
        let error = role(&global, &spec(), "us-east-1", None, Writers::HomeOnly).unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains("global table (replicas in eu-west-1, us-east-1)"),
            "{text}"
        );
        assert!(text.contains("PROJECTOR_HOME_REGION"), "{text}");
        assert_eq!(
            role(&global, &spec(), "us-east-1", Some(" "), Writers::HomeOnly),
            Err(error)
        );
        let error = role(
            &global,
            &spec(),
            "us-east-1",
            Some("ap-south-1"),
            Writers::HomeOnly,
        )
        .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("home region `ap-south-1` is not a region"),
            "{error}"
        );
    }

    #[test]
    fn the_home_region_projects_and_the_others_write_nothing() {
        // Replicas listed with or without the region asking.
        for (seen_home, seen_away) in [
            (&["eu-west-1"][..], &["us-east-1"][..]),
            (
                &["eu-west-1", "us-east-1"][..],
                &["eu-west-1", "us-east-1"][..],
            ),
        ] {
            let home = role(
                &table(seen_home, false),
                &spec(),
                "us-east-1",
                Some("us-east-1"),
                Writers::HomeOnly,
            )
            .unwrap();
            assert!(home.projects());
            assert_eq!(
                home,
                Role::Home {
                    regions: vec!["eu-west-1".to_string(), "us-east-1".to_string()]
                }
            );
            let away = role(
                &table(seen_away, false),
                &spec(),
                "eu-west-1",
                Some("us-east-1"),
                Writers::HomeOnly,
            )
            .unwrap();
            assert!(!away.projects());
            assert_eq!(
                away,
                Role::Away {
                    home: "us-east-1".to_string()
                }
            );
        }
    }

    #[test]
    fn projections_writing_onto_writers_items_need_writers_in_the_home_region() {
        let global = table(&["eu-west-1"], false);
        let error = role(
            &global,
            &spec(),
            "us-east-1",
            Some("us-east-1"),
            Writers::Anywhere,
        )
        .unwrap_err();
        let GlobalError::WritesOntoWriters { projections, .. } = &error else {
            panic!("{error}");
        };
        // The rollups onto the profile and the leaderboard keys onto the
        // achievement; not the inverse edge or the counters.
        assert_eq!(
            projections,
            &[
                "followers-count (onto profile)",
                "following-count (onto profile)",
                "achievement-leaderboard-keys (onto achievement)",
            ],
            "{error}"
        );
        let text = error.to_string();
        assert!(
            text.contains("PROJECTOR_WRITERS_IN_HOME_REGION=true"),
            "{text}"
        );
        assert!(text.contains("last writer"), "{text}");
        // Refused away from home too: every region's configuration agrees.
        assert!(role(
            &global,
            &spec(),
            "eu-west-1",
            Some("us-east-1"),
            Writers::Anywhere
        )
        .is_err());
        // A table of one region does not care where writers write.
        assert_eq!(
            role(
                &table(&[], false),
                &spec(),
                "us-east-1",
                None,
                Writers::Anywhere
            ),
            Ok(Role::Single)
        );
        // A spec of edges and counters only needs no statement.
        let edges = Spec::from_toml(
            &std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/projections/social-service.toml"
            ))
            .unwrap()
            .split("[[projections]]")
            .filter(|part| {
                !part.contains("kind = \"rollup\"") && !part.contains("kind = \"index-keys\"")
            })
            .collect::<Vec<_>>()
            .join("[[projections]]"),
            "edges.toml",
        )
        .unwrap();
        assert!(onto_writers_items(&edges).is_empty());
        assert!(role(
            &global,
            &edges,
            "us-east-1",
            Some("us-east-1"),
            Writers::Anywhere
        )
        .is_ok());
        for (flag, writers) in [
            (Some("true"), Writers::HomeOnly),
            (Some(" YES "), Writers::HomeOnly),
            (Some("1"), Writers::HomeOnly),
            (Some("false"), Writers::Anywhere),
            (None, Writers::Anywhere),
        ] {
            assert_eq!(Writers::from_flag(flag), writers, "{flag:?}");
        }
    }

    #[test]
    fn a_recorded_home_is_gone_by_only_when_the_configuration_agrees_or_is_silent() {
        let global = table(&["eu-west-1", "us-east-1"], false);
        let at = |region, configured, recorded| {
            role_with_record(
                &global,
                &spec(),
                region,
                configured,
                recorded,
                Writers::HomeOnly,
            )
            .unwrap()
        };
        let away = |home: &str| Role::Away {
            home: home.to_string(),
        };
        // Silent configuration: the record decides.
        assert!(at("eu-west-1", None, Some("eu-west-1")).projects());
        assert_eq!(
            at("us-east-1", Some(" "), Some("eu-west-1")),
            away("eu-west-1")
        );
        // Agreement.
        assert!(at("eu-west-1", Some("eu-west-1"), Some("eu-west-1")).projects());
        // Disagreement: nobody writes, the old home nor the new one.
        assert_eq!(
            at("us-east-1", Some("us-east-1"), Some("eu-west-1")),
            away("eu-west-1")
        );
        assert_eq!(
            at("eu-west-1", Some("us-east-1"), Some("eu-west-1")),
            away("eu-west-1")
        );
        // A record naming a region the table left is stale: ignored.
        assert!(at("us-east-1", Some("us-east-1"), Some("ap-south-1")).projects());
        // A table of one region projects whatever the record says.
        let single = table(&[], false);
        assert_eq!(
            role_with_record(
                &single,
                &spec(),
                "us-east-1",
                Some("us-east-1"),
                Some("eu-west-1"),
                Writers::Anywhere
            ),
            Ok(Role::Single)
        );
    }

    #[tokio::test]
    async fn a_running_worker_stands_down_when_its_region_is_no_longer_home() {
        let home = || Role::Home {
            regions: vec!["eu-west-1".to_string(), "us-east-1".to_string()],
        };
        let mut answers = vec![
            Ok(Ok(home())),
            Err("throttled".to_string()),
            Ok(Ok(Role::Single)),
            Ok(Ok(Role::Away {
                home: "eu-west-1".to_string(),
            })),
            Ok(Ok(home())),
        ]
        .into_iter();
        let mut asked = 0;
        let why = stand_down(std::time::Duration::from_millis(1), || {
            asked += 1;
            let answer = answers.next().expect("asked no more than needed");
            async move { answer }
        })
        .await;
        assert_eq!(
            why,
            StandDown::Away {
                home: "eu-west-1".to_string()
            }
        );
        assert_eq!(asked, 4);
        let refused = GlobalError::NoHome {
            table: "T".to_string(),
            regions: vec!["eu-west-1".to_string()],
        };
        let why = stand_down(std::time::Duration::from_millis(1), || {
            let answer = Ok(Err(refused.clone()));
            async move { answer }
        })
        .await;
        assert_eq!(why, StandDown::Refused(refused));
    }

    #[test]
    fn a_home_replica_that_is_not_active_is_warned_about() {
        let mut global = table(&["eu-west-1", "us-east-1"], false);
        assert_eq!(home_unavailable(&global, "us-east-1"), None);
        global.inactive = vec![("us-east-1".to_string(), "REGION_DISABLED".to_string())];
        let warning = home_unavailable(&global, "us-east-1").expect("a warning");
        assert!(
            warning.contains("us-east-1's replica of table `Social` is REGION_DISABLED")
                && warning.contains("failover --to"),
            "{warning}"
        );
        assert_eq!(home_unavailable(&global, "eu-west-1"), None);
    }

    #[test]
    fn a_legacy_global_table_is_refused() {
        let mut legacy = table(&[], false);
        legacy.global_version = Some("2017.11.29".to_string());
        let error = role(
            &legacy,
            &spec(),
            "us-east-1",
            Some("us-east-1"),
            Writers::HomeOnly,
        )
        .unwrap_err();
        assert!(error.to_string().contains("version 2017.11.29"), "{error}");
    }

    #[test]
    fn strong_consistency_is_refused_naming_the_projections_that_need_transactions() {
        let strong = table(&["eu-west-1", "us-west-2"], true);
        let error = role(
            &strong,
            &spec(),
            "us-east-1",
            Some("us-east-1"),
            Writers::HomeOnly,
        )
        .unwrap_err();
        let GlobalError::NeedsTransactions { projections, .. } = &error else {
            panic!("{error}");
        };
        assert!(projections.contains(&"followers".to_string()), "{error}");
        assert!(error.to_string().contains("followers"), "{error}");
    }
}
