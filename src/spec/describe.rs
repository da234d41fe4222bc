//! How a compiled spec describes itself: the summary `check` prints and
//! one line per projection and invariant.

use super::{Condition, Invariant, InvariantKind, Projection, Spec};

impl Spec {
    /// A short multi-line summary for `check`.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let t = &self.table;
        out.push_str(&format!(
            "service {} - table {} (PK {}{})\n",
            self.service,
            t.name,
            t.partition_key,
            t.sort_key
                .as_ref()
                .map(|s| format!(", SK {s}"))
                .unwrap_or_default()
        ));
        if self.services.is_composite() {
            for (service, file) in &self.services.files {
                out.push_str(&format!("  registered by {service} ({file})\n"));
            }
        }
        for gsi in &t.gsis {
            out.push_str(&format!(
                "  index {} ({}{})\n",
                gsi.name,
                gsi.partition_key,
                gsi.sort_key
                    .as_ref()
                    .map(|s| format!(", {s}"))
                    .unwrap_or_default()
            ));
        }
        if let Some(ttl) = &t.ttl_attribute {
            out.push_str(&format!("  ttl attribute {ttl}\n"));
        }
        out.push_str(&format!("{} entities\n", self.entities.len()));
        for entity in &self.entities {
            out.push_str(&format!(
                "  {:<16} {} / {}\n",
                entity.name,
                entity.pk,
                entity.sk.as_ref().map(|s| s.as_str()).unwrap_or("-")
            ));
        }
        out.push_str(&format!("{} projections\n", self.projections.len()));
        for projection in &self.projections {
            let service = if self.services.is_composite() {
                format!(" [{}]", self.service_of(&projection.name))
            } else {
                String::new()
            };
            out.push_str(&format!(
                "  {:<28} {:<13} {}{service}\n",
                projection.name,
                projection.kind_name(),
                self.describe(projection)
            ));
        }
        if !self.invariants.is_empty() {
            out.push_str(&format!("{} invariants\n", self.invariants.len()));
            for invariant in &self.invariants {
                out.push_str(&format!(
                    "  {:<28} {:<13} {}\n",
                    invariant.name,
                    invariant.kind_name(),
                    self.describe_invariant(invariant)
                ));
            }
        }
        out
    }

    /// One line saying what an invariant requires.
    pub fn describe_invariant(&self, invariant: &Invariant) -> String {
        let entity = &self.entities[invariant.entity].name;
        let cond = |c: &Condition| {
            c.0.iter()
                .map(|(k, v)| format!("{k} = {}", crate::record::value_to_json(v)))
                .collect::<Vec<_>>()
                .join(" and ")
        };
        match &invariant.kind {
            InvariantKind::Count {
                when,
                exactly,
                repair,
            } => format!(
                "{} `{entity}` per partition with {}{}",
                if *exactly {
                    "exactly one"
                } else {
                    "at most one"
                },
                cond(when),
                repair
                    .map(|r| format!(" (repair: {})", r.as_str()))
                    .unwrap_or_default()
            ),
            InvariantKind::Implies { premise, then } => {
                format!("`{entity}` with {} has {}", cond(premise), cond(then))
            }
            InvariantKind::Unique {
                index,
                attribute,
                template,
                ..
            } => format!("`{entity}` {attribute} = {template} in {index} has one owner"),
        }
    }

    fn describe(&self, projection: &Projection) -> String {
        projection.kind.dispatch().describe(self)
    }
}
