//! The library's face for a team's own binary: a [`Projector`] is a spec
//! plus projections written in Rust, and [`serve_lambda`] serves it as an
//! AWS Lambda function, exactly as the shipped bootstrap serves a spec
//! (partial batch responses, the deadline, EMF metrics, Powertools-style
//! logs, the global-table guard, backfill and audit slices).
//!
//! A projection written in Rust implements [`CustomProjection`]: for each
//! change of its source entity it plans whole-item puts and deletes
//! ([`CustomOp`]), idempotent like the built-in kinds. It joins the spec
//! of the table that describes its source entity and is checked with it.
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use ddb_projector::{serve_lambda, CustomOp, CustomProjection, EntityChange, Projector};
//!
//! #[derive(Debug)]
//! struct Nothing;
//!
//! impl CustomProjection for Nothing {
//!     fn name(&self) -> &str {
//!         "nothing"
//!     }
//!     fn source_entity(&self) -> &str {
//!         "email"
//!     }
//!     fn plan(&self, _change: &EntityChange<'_>) -> Result<Vec<CustomOp>, String> {
//!         Ok(Vec::new())
//!     }
//! }
//!
//! fn main() -> anyhow::Result<()> {
//!     // PROJECTOR_SPEC names the spec file inside the package, as for the
//!     // shipped bootstrap; `.spec(path)` names it here instead.
//!     serve_lambda(Projector::new().custom(Arc::new(Nothing)))
//! }
//! ```
//!
//! `examples/custom_projection.rs` is a whole one, tested end to end on
//! DynamoDB Local through the Lambda Runtime API.

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use crate::effect::CustomOp;
pub use crate::kinds::custom::{CustomProjection, EntityChange};
use crate::lambda::SPEC_VAR;
use crate::logging::LogFormat;
pub use crate::record::{AttributeValue, ChangeKind, ChangeRecord, Image, Item, ItemKey};
use crate::spec::{SpecErrors, SpecSet};

/// A spec and the projections written in Rust that join it.
#[derive(Debug, Default, Clone)]
pub struct Projector {
    spec: Option<PathBuf>,
    custom: Vec<Arc<dyn CustomProjection>>,
}

impl Projector {
    /// The spec `PROJECTOR_SPEC` names (a file, or a directory of them),
    /// with no projection written in Rust yet.
    pub fn new() -> Projector {
        Projector::default()
    }

    /// Reads the spec from `path` (a file, or a directory of them) rather
    /// than from `PROJECTOR_SPEC`.
    pub fn spec(mut self, path: impl AsRef<Path>) -> Projector {
        self.spec = Some(path.as_ref().to_path_buf());
        self
    }

    /// Adds a projection written in Rust: it joins the spec of the table
    /// that describes its source entity.
    pub fn custom(mut self, projection: Arc<dyn CustomProjection>) -> Projector {
        self.custom.push(projection);
        self
    }

    /// Loads and compiles the spec with the projections written in Rust,
    /// as init does: for a team's own tests, or `main` before serving.
    /// Every problem is reported at once, naming the file or projection.
    pub fn load(&self) -> Result<SpecSet, SpecErrors> {
        let path = match &self.spec {
            Some(path) => path.clone(),
            None => match std::env::var_os(SPEC_VAR).filter(|p| !p.is_empty()) {
                Some(path) => PathBuf::from(path),
                None => {
                    return Err(SpecErrors(vec![crate::spec::SpecError {
                        file: SPEC_VAR.to_string(),
                        context: String::new(),
                        problem: format!("no spec: set {SPEC_VAR} or call Projector::spec(path)"),
                    }]))
                }
            },
        };
        SpecSet::load(&path).and_then(|set| set.with_custom(&self.custom))
    }
}

/// Serves `projector` as an AWS Lambda function until Lambda stops the
/// process: sets up JSON logs (`PROJECTOR_LOG_FORMAT=text` for text),
/// then runs the same init and invocation loop as the shipped bootstrap
/// (its variables: [`crate::lambda`]). Init problems are posted to the
/// Runtime API's `/init/error` and returned.
pub fn serve_lambda(projector: Projector) -> anyhow::Result<()> {
    let format = match std::env::var("PROJECTOR_LOG_FORMAT").as_deref() {
        Ok("text") => LogFormat::Text,
        _ => LogFormat::Json,
    };
    crate::logging::init(format);
    crate::lambda::serve(projector.spec, projector.custom)
}
