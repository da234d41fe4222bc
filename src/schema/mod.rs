//! The schema a spec describes: the table, its indexes, the entities and
//! their key patterns, templates and conditions, and the compile context
//! every projection kind compiles its section in.
//!
//! Nothing here knows a projection kind: the kinds ([`crate::kinds`]) and
//! the spec ([`crate::spec`]) are built on it.

pub(crate) mod compile;
pub mod raw;
pub mod template;

use std::collections::HashMap;
use std::fmt;

use crate::record::{AttributeValue, Attributes, Item, ItemKey, ValueRef};
pub(crate) use compile::{fingerprint, suggest, Compiler};
pub use template::{Bindings, KeyPattern, RenderError, Template, TemplateError};

/// Index of an entity in a compiled spec's entities.
pub type EntityId = usize;
/// Index of a projection in a compiled spec's projections.
pub type ProjectionId = usize;

/// One problem in a spec; [`SpecErrors`] carries all of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    /// The file (or label) the spec came from.
    pub file: String,
    /// Which part: `table`, `entity `email``, `projection `followers``.
    pub context: String,
    /// What is wrong and how to fix it.
    pub problem: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.context.is_empty() {
            write!(f, "{}: {}", self.file, self.problem)
        } else {
            write!(f, "{}: {}: {}", self.file, self.context, self.problem)
        }
    }
}

/// Every problem found while loading or compiling a spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SpecErrors(pub Vec<SpecError>);

impl fmt::Display for SpecErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{error}")?;
        }
        if n > 1 {
            write!(f, "\n({n} problems)")?;
        }
        Ok(())
    }
}

/// The table a spec describes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSpec {
    /// Default table name.
    pub name: String,
    /// Partition key attribute.
    pub partition_key: String,
    /// Sort key attribute, if the table has one.
    pub sort_key: Option<String>,
    /// TTL attribute, if any.
    pub ttl_attribute: Option<String>,
    /// Global secondary indexes.
    pub gsis: Vec<Gsi>,
}

/// A global secondary index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gsi {
    /// Index name.
    pub name: String,
    /// Partition key attribute.
    pub partition_key: String,
    /// Sort key attribute.
    pub sort_key: Option<String>,
}

impl TableSpec {
    /// The DynamoDB key of `key` in this table, as an item.
    pub fn key_item(&self, key: &ItemKey) -> Item {
        let mut item = Item::default();
        item.insert(
            self.partition_key.clone(),
            AttributeValue::S(key.pk.clone()),
        );
        if let (Some(name), Some(sk)) = (&self.sort_key, &key.sk) {
            item.insert(name.clone(), AttributeValue::S(sk.clone()));
        }
        item
    }

    /// The string key of an item or key map, if its key attributes are strings.
    pub fn item_key<A: Attributes + ?Sized>(&self, item: &A) -> Option<ItemKey> {
        let pk = item.attribute(&self.partition_key)?.as_str()?.to_string();
        let sk = match &self.sort_key {
            Some(name) => Some(item.attribute(name)?.as_str()?.to_string()),
            None => None,
        };
        Some(ItemKey { pk, sk })
    }

    /// Whether `name` is one of the table's key attributes.
    pub fn is_key_attribute(&self, name: &str) -> bool {
        name == self.partition_key || self.sort_key.as_deref() == Some(name)
    }

    /// The key attributes of `item`, whatever its value type (an SDK
    /// item's key converts safely even when other attributes would not).
    pub fn key_attributes<V: Clone>(&self, item: &HashMap<String, V>) -> HashMap<String, V> {
        item.iter()
            .filter(|(name, _)| self.is_key_attribute(name))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect()
    }
}

/// A named entity type, identified by its key patterns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entity {
    /// Entity name (`email`).
    pub name: String,
    /// Partition key pattern.
    pub pk: KeyPattern,
    /// Sort key pattern (tables with a sort key).
    pub sk: Option<KeyPattern>,
}

impl Entity {
    /// All key variables, partition key first.
    pub fn vars(&self) -> impl Iterator<Item = &str> {
        self.pk
            .vars()
            .iter()
            .chain(self.sk.iter().flat_map(|sk| sk.vars()))
            .map(String::as_str)
    }

    /// Renders this entity's key from bound variables.
    pub fn render_key(&self, bindings: &[(&str, &str)]) -> Option<ItemKey> {
        Some(ItemKey {
            pk: self.pk.render(bindings)?,
            sk: match &self.sk {
                Some(sk) => Some(sk.render(bindings)?),
                None => None,
            },
        })
    }
}

/// A condition: each attribute equals a value (all must hold).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Condition(pub Vec<(String, AttributeValue)>);

impl Condition {
    /// Whether the item satisfies the condition (`None` never does).
    pub fn holds<A: Attributes + ?Sized>(&self, item: Option<&A>) -> bool {
        let Some(item) = item else { return false };
        self.0
            .iter()
            .all(|(name, want)| item.attribute(name).is_some_and(|have| have.equals(want)))
    }

    /// Whether the condition is empty (always holds for existing items).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Equality as DynamoDB sees it: numbers compare by value.
pub fn values_equal(a: &AttributeValue, b: &AttributeValue) -> bool {
    ValueRef::from(a).equals(b)
}
