//! `run` and `replay`: the self-hosted stream runner.

use std::process::ExitCode;

use super::Target;

/// `run`: tail the stream, applying projections, checkpointing per shard.
pub async fn run(target: Target, drain: bool) -> anyhow::Result<ExitCode> {
    let _ = (target, drain);
    anyhow::bail!("`run` is not built yet")
}

/// `replay`: process the retained stream again from its start.
pub async fn replay(target: Target, projections: Vec<String>) -> anyhow::Result<ExitCode> {
    let _ = (target, projections);
    anyhow::bail!("`replay` is not built yet")
}
