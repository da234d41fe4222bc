//! Changes of other tables on a Kinesis stream: one Kinesis data stream
//! may carry the changes of several tables, each naming its table
//! (`tableName`). A runner applies its own table's; another table's change
//! is skipped when another consumer serves that table (a spec file the
//! runner was given describes it, or specs are registered in it), and is
//! a dead letter naming the table otherwise: nothing would ever apply it.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long what was learned of a table is trusted.
const TRUSTED: Duration = Duration::from_secs(60);

/// Which other tables' changes a Kinesis runner leaves to their own
/// consumers.
#[derive(Debug, Clone, Default)]
pub struct OtherTables {
    described: Arc<BTreeSet<String>>,
    registry: Option<aws_sdk_dynamodb::Client>,
    learned: Arc<Mutex<HashMap<String, (bool, Instant)>>>,
}

impl OtherTables {
    /// Tables the spec files describe (`described`), and, with `registry`,
    /// any table with specs registered in it, are served by another
    /// consumer.
    pub fn new(
        described: impl IntoIterator<Item = String>,
        registry: Option<aws_sdk_dynamodb::Client>,
    ) -> OtherTables {
        OtherTables {
            described: Arc::new(described.into_iter().collect()),
            registry,
            learned: Arc::default(),
        }
    }

    /// Whether another consumer serves `table`. `Err`: it cannot be told
    /// now (the change is read again later).
    pub(crate) async fn served(&self, table: &str) -> Result<bool, String> {
        if self.described.contains(table) {
            return Ok(true);
        }
        let Some(client) = &self.registry else {
            return Ok(false);
        };
        if let Some((served, at)) = self.learned.lock().expect("not poisoned").get(table) {
            if at.elapsed() < TRUSTED {
                return Ok(*served);
            }
        }
        let served = match crate::control::Registrations::of_table(client, table).await {
            Ok(registrations) => !registrations
                .stamp()
                .await
                .map_err(|e| format!("reading the registry of table `{table}`: {e}"))?
                .services
                .is_empty(),
            Err(error) => {
                let text = format!("{error:#}");
                if text.contains("ResourceNotFound") || text.contains("does not exist") {
                    false
                } else {
                    return Err(format!("describing table `{table}`: {text}"));
                }
            }
        };
        self.learned
            .lock()
            .expect("not poisoned")
            .insert(table.to_string(), (served, Instant::now()));
        Ok(served)
    }
}
