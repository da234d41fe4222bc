//! The coordinator: lists the stream's shards and runs one task per shard
//! that may run (a child once its parent is finished), listing again to
//! find new shards.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use futures::future::LocalBoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::watch;

use super::shard::walk_shard;
use super::{RunErrorKind, ShardExit, ShardInfo, ShardRun, Shared, TaskResult};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ShardState {
    /// Not started: waiting for its parent, or for a slot.
    Waiting,
    /// A task is reading it.
    Running,
    /// Open and caught up (drain); started again if it closes.
    CaughtUp,
    /// Read to its end.
    Finished,
}

struct Entry {
    parent: Option<String>,
    closed: bool,
    listed: bool,
    state: ShardState,
    run: Option<ShardRun>,
}

pub(super) struct Coordinator {
    shared: Arc<Shared>,
    shards: BTreeMap<String, Entry>,
    /// The shard tasks, polled by the coordinator itself: the applier's
    /// batch future is not `Send`, so they cannot be spawned.
    tasks: FuturesUnordered<LocalBoxFuture<'static, TaskResult>>,
    stop_tx: watch::Sender<bool>,
}

impl Coordinator {
    pub(super) fn new(shared: Arc<Shared>) -> Coordinator {
        let (stop_tx, _) = watch::channel(false);
        Coordinator {
            shared,
            shards: BTreeMap::new(),
            tasks: FuturesUnordered::new(),
            stop_tx,
        }
    }

    /// Runs the shards until stopped, or (drain) caught up: `true` then.
    pub(super) async fn run(
        mut self,
        stop: impl Future<Output = ()>,
    ) -> Result<bool, RunErrorKind> {
        tokio::pin!(stop);
        let mut caught_up = false;
        let mut stopping = false;
        let mut failure: Option<RunErrorKind> = None;
        // Whether anything changed since the shards were last listed.
        let mut dirty = true;
        let mut next_list = tokio::time::Instant::now();
        loop {
            if !stopping && (dirty || tokio::time::Instant::now() >= next_list) {
                dirty = false;
                next_list = tokio::time::Instant::now() + self.shared.options.relist_interval;
                let listed = tokio::select! {
                    listed = self.relist() => Some(listed),
                    () = &mut stop => None,
                };
                match listed {
                    Some(Ok(())) => self.start_ready(),
                    Some(Err(error)) => {
                        failure = Some(error);
                        stopping = true;
                        self.stop_tx.send_replace(true);
                    }
                    None => {
                        stopping = true;
                        self.stop_tx.send_replace(true);
                    }
                }
            }
            if self.tasks.is_empty() {
                if stopping {
                    break;
                }
                if self.shared.options.drain && !dirty {
                    let waiting: Vec<&String> = self
                        .shards
                        .iter()
                        .filter(|(_, e)| e.listed && e.state == ShardState::Waiting)
                        .map(|(id, _)| id)
                        .collect();
                    if !waiting.is_empty() {
                        tracing::warn!(shards = ?waiting, "shards wait for parents that are neither finished nor readable");
                    }
                    tracing::info!(shards = self.shards.len(), "caught up");
                    caught_up = true;
                    break;
                }
            }
            tokio::select! {
                () = &mut stop, if !stopping => {
                    tracing::info!("stopping: finishing the current batches");
                    stopping = true;
                    self.stop_tx.send_replace(true);
                }
                Some((run, result)) = self.tasks.next(), if !self.tasks.is_empty() => {
                    dirty = true;
                    let shard_id = run.shard_id.clone();
                    let entry = self.shards.get_mut(&shard_id).expect("a task's shard is known");
                    entry.run = Some(run);
                    match result {
                        Ok(ShardExit::Finished) => {
                            entry.state = ShardState::Finished;
                            self.shared.summary.lock().expect("summary lock").shards_finished += 1;
                            tracing::info!(shard = %shard_id, "shard finished");
                        }
                        Ok(ShardExit::CaughtUp) => entry.state = ShardState::CaughtUp,
                        Ok(ShardExit::Stopped) => entry.state = ShardState::Waiting,
                        Err(error) => {
                            entry.state = ShardState::Waiting;
                            tracing::error!(shard = %shard_id, %error, "shard stopped the runner");
                            failure.get_or_insert(error);
                            stopping = true;
                            self.stop_tx.send_replace(true);
                        }
                    }
                }
                () = tokio::time::sleep_until(next_list), if !stopping && !self.shared.options.drain => {}
            }
        }
        match failure {
            Some(error) => Err(error),
            None => Ok(caught_up),
        }
    }

    /// Lists the shards and learns the new ones (with their checkpoints).
    async fn relist(&mut self) -> Result<(), RunErrorKind> {
        let listed = self.shared.list_shards().await?;
        let listed_ids: std::collections::HashSet<&str> =
            listed.iter().map(|s| s.shard_id.as_str()).collect();
        for info in merge_listing(&mut self.shards, &listed) {
            let mut run = ShardRun {
                shard_id: info.shard_id.clone(),
                parent: info.parent.clone(),
                position: None,
                durable: None,
                unconfirmed: Vec::new(),
                records: 0,
                ledger: None,
                catching_up: None,
                closed: false,
            };
            let mut state = ShardState::Waiting;
            if let Some(store) = self.shared.positions() {
                if let Some(checkpoint) = store.load(&info.shard_id).await? {
                    run.position = checkpoint.sequence_number.clone();
                    run.durable = checkpoint.sequence_number;
                    run.records = checkpoint.records;
                    if checkpoint.finished {
                        state = ShardState::Finished;
                    }
                }
                // A parent trimmed away before it was read to its end: its
                // remaining records are gone (a replay's are hints only).
                if let Some(parent) = info
                    .parent
                    .as_ref()
                    .filter(|_| self.shared.checkpoints.is_some())
                {
                    if !listed_ids.contains(parent.as_str()) && !self.shards.contains_key(parent) {
                        if let Some(checkpoint) = store.load(parent).await? {
                            if !checkpoint.finished {
                                return Err(self.shared.records_lost(
                                    parent,
                                    checkpoint.sequence_number.as_ref(),
                                    "the shard was trimmed away before it was read to its end",
                                ));
                            }
                        }
                    }
                }
            }
            tracing::debug!(shard = %info.shard_id, parent = ?info.parent, closed = info.closed, position = ?run.position, ?state, "shard found");
            self.shards.insert(
                info.shard_id.clone(),
                Entry {
                    parent: info.parent.clone(),
                    closed: info.closed,
                    listed: true,
                    state,
                    run: Some(run),
                },
            );
        }
        // Finished shards trimmed away need no memory; their children
        // treat an unknown parent as done.
        self.shards
            .retain(|_, entry| entry.listed || entry.state != ShardState::Finished);
        // A known shard that disappeared before it was read to its end.
        if self.shared.checkpoints.is_some() {
            for (shard_id, entry) in &self.shards {
                if !entry.listed && entry.state == ShardState::Waiting {
                    let position = entry.run.as_ref().and_then(|r| r.position.as_ref());
                    return Err(self.shared.records_lost(
                        shard_id,
                        position,
                        "the shard was trimmed away before it was read to its end",
                    ));
                }
            }
        }
        Ok(())
    }

    /// Starts every waiting shard whose parent is done.
    fn start_ready(&mut self) {
        // On Kinesis order does not matter: a child need not wait.
        let ready = ready_shards(&self.shards, !self.shared.streams.is_kinesis());
        for shard_id in ready {
            let entry = self.shards.get_mut(&shard_id).expect("listed above");
            let run = entry.run.take().expect("a waiting shard has its state");
            entry.state = ShardState::Running;
            let mut run = run;
            run.closed = entry.closed;
            tracing::info!(shard = %shard_id, parent = ?entry.parent, closed = entry.closed, position = ?run.position, "reading shard");
            let shared = self.shared.clone();
            let stop = self.stop_tx.subscribe();
            self.tasks.push(Box::pin(walk_shard(shared, run, stop)));
        }
    }
}

/// Marks what a listing says about known shards (listed or not, closed or
/// not; a caught-up shard that closed is read again) and returns the listed
/// shards that are new.
fn merge_listing(shards: &mut BTreeMap<String, Entry>, listed: &[ShardInfo]) -> Vec<ShardInfo> {
    for entry in shards.values_mut() {
        entry.listed = false;
    }
    let mut new = Vec::new();
    for info in listed {
        match shards.get_mut(&info.shard_id) {
            Some(entry) => {
                entry.listed = true;
                entry.closed = info.closed;
                if entry.state == ShardState::CaughtUp && info.closed {
                    // It closed after it caught up: read the rest.
                    entry.state = ShardState::Waiting;
                }
            }
            None => new.push(info.clone()),
        }
    }
    new
}

/// The waiting, listed shards whose parent is finished or unknown (trimmed
/// before this run, or forgotten once finished and trimmed).
fn ready_shards(shards: &BTreeMap<String, Entry>, ordered: bool) -> Vec<String> {
    shards
        .iter()
        .filter(|(_, entry)| entry.state == ShardState::Waiting && entry.listed)
        .filter(|(_, entry)| match &entry.parent {
            _ if !ordered => true,
            None => true,
            Some(parent) => shards
                .get(parent)
                .is_none_or(|parent| parent.state == ShardState::Finished),
        })
        .map(|(id, _)| id.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: &str, parent: Option<&str>, closed: bool) -> ShardInfo {
        ShardInfo {
            shard_id: id.to_string(),
            parent: parent.map(str::to_string),
            closed,
        }
    }

    fn learn(shards: &mut BTreeMap<String, Entry>, listed: &[ShardInfo]) {
        let new = merge_listing(shards, listed);
        insert(shards, &new);
    }

    fn insert(shards: &mut BTreeMap<String, Entry>, new: &[ShardInfo]) {
        for new in new {
            shards.insert(
                new.shard_id.clone(),
                Entry {
                    parent: new.parent.clone(),
                    closed: new.closed,
                    listed: true,
                    state: ShardState::Waiting,
                    run: None,
                },
            );
        }
    }

    #[test]
    fn children_start_only_after_their_parent_is_finished() {
        let mut shards = BTreeMap::new();
        learn(
            &mut shards,
            &[
                info("b-child", Some("a-parent"), false),
                info("a-parent", None, true),
                info("c-grandchild", Some("b-child"), false),
            ],
        );
        assert_eq!(ready_shards(&shards, true), ["a-parent"]);
        shards.get_mut("a-parent").unwrap().state = ShardState::Running;
        assert!(ready_shards(&shards, true).is_empty());
        shards.get_mut("a-parent").unwrap().state = ShardState::Finished;
        assert_eq!(ready_shards(&shards, true), ["b-child"]);
    }

    #[test]
    fn a_trimmed_parent_does_not_block_its_child() {
        let mut shards = BTreeMap::new();
        learn(&mut shards, &[info("child", Some("gone"), false)]);
        assert_eq!(ready_shards(&shards, true), ["child"]);
    }

    #[test]
    fn a_caught_up_shard_that_closes_is_read_again_and_new_shards_are_found() {
        let mut shards = BTreeMap::new();
        learn(&mut shards, &[info("open", None, false)]);
        shards.get_mut("open").unwrap().state = ShardState::CaughtUp;
        assert!(ready_shards(&shards, true).is_empty());
        let new = merge_listing(
            &mut shards,
            &[info("open", None, true), info("next", Some("open"), false)],
        );
        assert_eq!(new.len(), 1);
        assert_eq!(new[0].shard_id, "next");
        assert_eq!(shards["open"].state, ShardState::Waiting);
        assert!(shards["open"].closed);
        insert(&mut shards, &new);
        assert_eq!(ready_shards(&shards, true), ["open"]);
    }

    #[test]
    fn shards_no_longer_listed_are_marked() {
        let mut shards = BTreeMap::new();
        learn(
            &mut shards,
            &[info("a", None, true), info("b", Some("a"), false)],
        );
        let new = merge_listing(&mut shards, &[info("b", Some("a"), false)]);
        assert!(new.is_empty());
        assert!(!shards["a"].listed && shards["b"].listed);
    }
}
