//! `register`, `unregister` and `specs`: a service's spec stored in the
//! table's registry, served by the table's workers (see
//! [`crate::control::register`]).

use std::io::Write;
use std::path::Path;

use super::{ChangeArgs, Outcome, OutputFormat};

impl ChangeArgs {
    /// The deployment a registration is judged against: its home region.
    fn deployment(&self) -> crate::global::Deployment {
        crate::global::Deployment {
            home_region: self.home_region.clone(),
            ..Default::default()
        }
    }
}
use crate::control::{Change, Planned, RegisterError, Registration, Registrations};

/// Who makes a change: `--by`, else the OS user.
fn who(by: Option<String>) -> String {
    by.or_else(|| std::env::var("USER").ok())
        .or_else(|| std::env::var("USERNAME").ok())
        .filter(|name| !name.trim().is_empty())
        .unwrap_or_else(|| "unknown".to_string())
}

/// The registrations of `table`, refusing outside a global table's home
/// region (`verb` writes): the spec `guard` is what the worker will run.
async fn open(
    table: &str,
    deployment: Option<(&crate::global::Deployment, &str, crate::spec::Spec)>,
) -> anyhow::Result<Registrations> {
    let config = crate::dynamo::client::load_config().await?;
    let dynamodb = crate::dynamo::client::dynamodb(&config);
    let registrations = Registrations::of_table(&dynamodb, table).await?;
    if let Some((deployment, verb, spec)) = deployment {
        let c = crate::control::Connection {
            spec: std::sync::Arc::new(spec.clone()),
            file_spec: std::sync::Arc::new(spec),
            table: table.to_string(),
            config,
            dynamodb,
            consumer: None,
            registered: None,
        };
        crate::global::require_home(&c, deployment, verb).await?;
    }
    Ok(registrations)
}

/// `register --spec FILE --table T`.
pub async fn register(spec: &Path, args: ChangeArgs) -> anyhow::Result<Outcome> {
    let (table, dry_run, by, format) = (
        args.table.clone(),
        args.dry_run,
        args.by.clone(),
        args.format,
    );
    let deployment = args.deployment();
    let label = spec.display().to_string();
    let text = match std::fs::read(spec) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(_) => {
                eprintln!("register refused: {label}: the spec is not UTF-8 text");
                return Ok(Outcome::Found);
            }
        },
        Err(error) => anyhow::bail!("cannot read the spec file {label}: {error}"),
    };
    let registrations = open(&table, None).await?;
    let service = match crate::control::admit(&label, &text, &table, registrations.keys()) {
        Ok(service) => service,
        Err(problems) => return Ok(refused("register", &problems)),
    };
    // The worker will run the spec; the home region's guard judges it.
    let guard_spec = match toml::from_str::<crate::spec::raw::RawSpec>(&text) {
        Ok(mut raw) => {
            raw.table.name = table.clone();
            crate::spec::Spec::compile(raw, &label, Vec::new())
        }
        Err(error) => Err(crate::spec::SpecErrors(vec![crate::spec::SpecError {
            file: label.clone(),
            context: String::new(),
            problem: format!("invalid spec TOML: {}", error.to_string().trim_end()),
        }])),
    };
    let guard_spec = match guard_spec {
        Ok(spec) => spec,
        Err(errors) => {
            let problems: Vec<String> = errors.0.iter().map(|e| e.to_string()).collect();
            return Ok(refused("register", &problems));
        }
    };
    if !dry_run {
        open(&table, Some((&deployment, "register", guard_spec))).await?;
    }
    let change = Change {
        table,
        text: Some((label, text)),
        service: Some(service),
        by: who(by),
        dry_run,
    };
    finish(
        crate::control::register(&registrations, &change).await,
        format,
    )
}

/// `unregister --service NAME --table T`.
pub async fn unregister(service: String, args: ChangeArgs) -> anyhow::Result<Outcome> {
    let (table, dry_run, by, format) = (
        args.table.clone(),
        args.dry_run,
        args.by.clone(),
        args.format,
    );
    let deployment = args.deployment();
    if let Err(problem) = crate::control::check_service_name(&service) {
        return Ok(refused("unregister", &[problem]));
    }
    let registrations = open(&table, None).await?;
    if !dry_run {
        let empty = crate::control::empty_spec(&table, registrations.keys());
        open(&table, Some((&deployment, "unregister", empty))).await?;
    }
    let change = Change {
        table,
        text: None,
        service: Some(service),
        by: who(by),
        dry_run,
    };
    finish(
        crate::control::register(&registrations, &change).await,
        format,
    )
}

fn refused(verb: &str, problems: &[String]) -> Outcome {
    eprintln!("{verb} refused:");
    for problem in problems {
        eprintln!("  {problem}");
    }
    eprintln!("nothing was stored");
    Outcome::Found
}

fn finish(result: Result<Planned, RegisterError>, format: OutputFormat) -> anyhow::Result<Outcome> {
    let planned = match result {
        Ok(planned) => planned,
        Err(RegisterError::Refused(problems)) => return Ok(refused("register", &problems)),
        Err(RegisterError::Failed(error)) => return Err(error),
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match format {
        OutputFormat::Json => writeln!(out, "{}", serde_json::to_string(&planned)?)?,
        OutputFormat::Text => print_planned(&mut out, &planned)?,
    }
    Ok(Outcome::Done)
}

fn print_planned(out: &mut impl Write, p: &Planned) -> std::io::Result<()> {
    let before = if p.previous_version == 0 {
        "not registered before".to_string()
    } else {
        format!("v{} registered now", p.previous_version)
    };
    writeln!(
        out,
        "{} {} on table {} (registry version {}; {before})",
        p.action, p.service, p.table, p.registry_version
    )?;
    for warning in &p.warnings {
        writeln!(out, "warning: {warning}")?;
    }
    if p.projections.is_empty() {
        writeln!(out, "  no projection changes")?;
    } else {
        let width = p
            .projections
            .iter()
            .map(|r| r.name.len())
            .max()
            .unwrap_or(0)
            .max(10);
        let service_width = p
            .projections
            .iter()
            .map(|r| r.service.len())
            .max()
            .unwrap_or(0)
            .max(7);
        writeln!(
            out,
            "  {:width$}  {:service_width$}  {:9}  {:11}  next",
            "projection", "service", "change", "then"
        )?;
        for row in &p.projections {
            writeln!(
                out,
                "  {:width$}  {:service_width$}  {:9}  {:11}  {}",
                row.name,
                row.service,
                row.change,
                row.state,
                row.next.as_deref().unwrap_or("-")
            )?;
        }
    }
    if p.unchanged {
        writeln!(
            out,
            "the text is what {} v{} registered: nothing to store",
            p.service, p.previous_version
        )?;
        return Ok(());
    }
    match (&p.stored, p.dry_run) {
        (_, true) => writeln!(
            out,
            "dry run: would store {} v{}; nothing was stored",
            p.service,
            p.previous_version + 1
        )?,
        (Some(stored), false) => {
            writeln!(
                out,
                "{}: {} v{} (registry version {}){}",
                if p.action == "register" {
                    "registered"
                } else {
                    "unregistered"
                },
                p.service,
                stored.version,
                stored.registry_version,
                if p.retries > 0 {
                    format!(
                        ", composed again with {} registration(s) that landed first",
                        p.retries
                    )
                } else {
                    String::new()
                }
            )?;
            writeln!(
                out,
                "the table's workers serve it within {} s (their registry poll); then run what `next` says, and `ddb-projector status --table {}`",
                crate::control::registry_poll().as_secs_f64(),
                p.table
            )?;
        }
        (None, false) => {}
    }
    Ok(())
}

/// `specs --table T [--service S] [--history] [--version N]`.
pub async fn specs(
    table: String,
    service: Option<String>,
    history: bool,
    version: Option<u64>,
    format: OutputFormat,
) -> anyhow::Result<Outcome> {
    let registrations = open(&table, None).await?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let Some(service) = service else {
        let registered = registrations.read().await?;
        match format {
            OutputFormat::Json => {
                let services: Vec<Registration> = registered
                    .services
                    .values()
                    .map(|r| Registration {
                        text: None,
                        ..r.clone()
                    })
                    .collect();
                writeln!(
                    out,
                    "{}",
                    serde_json::json!({
                        "table": table,
                        "registryVersion": registered.version,
                        "services": services,
                    })
                )?;
            }
            OutputFormat::Text => {
                writeln!(
                    out,
                    "table {table}: registry version {}, {} service(s) registered",
                    registered.version,
                    registered.services.len()
                )?;
                for r in registered.services.values() {
                    writeln!(
                        out,
                        "  {:24}  v{:<4}  {}  by {}",
                        r.service, r.version, r.at, r.by
                    )?;
                }
            }
        }
        return Ok(Outcome::Done);
    };
    let versions = registrations.history(&service).await?;
    if versions.is_empty() {
        eprintln!("service `{service}` was never registered for table `{table}`");
        return Ok(Outcome::Found);
    }
    if history {
        for r in &versions {
            match format {
                OutputFormat::Json => writeln!(
                    out,
                    "{}",
                    serde_json::to_string(&Registration {
                        text: None,
                        ..r.clone()
                    })?
                )?,
                OutputFormat::Text => writeln!(
                    out,
                    "v{:<4}  {}  by {:16}  registry version {}{}",
                    r.version,
                    r.at,
                    r.by,
                    r.registry_version,
                    if r.text.is_none() {
                        "  (unregistered)"
                    } else {
                        ""
                    }
                )?,
            }
        }
        return Ok(Outcome::Done);
    }
    let chosen = match version {
        Some(n) => versions.iter().find(|r| r.version == n),
        None => versions.last(),
    };
    let Some(chosen) = chosen else {
        eprintln!(
            "service `{service}` has no version {} (versions 1 to {})",
            version.unwrap_or_default(),
            versions.len()
        );
        return Ok(Outcome::Found);
    };
    match (format, &chosen.text) {
        (OutputFormat::Json, _) => writeln!(out, "{}", serde_json::to_string(chosen)?)?,
        (OutputFormat::Text, Some(text)) => write!(out, "{text}")?,
        (OutputFormat::Text, None) => {
            eprintln!(
                "service `{service}` v{} is its unregistration: it has no text",
                chosen.version
            );
            return Ok(Outcome::Found);
        }
    }
    Ok(Outcome::Done)
}
