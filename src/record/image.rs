//! [`Image`]: the attributes of a changed item, stored compactly.
//!
//! A record carries up to three images (keys, old, new). Stored as
//! `HashMap<String, AttributeValue>` each attribute costs two allocations
//! and a hash, which made decoding the largest cost of the pipeline. An
//! image keeps every name and every string or number value in one text
//! buffer, and a list of entries pointing into it: two allocations per
//! image, whatever its size. Lists, maps, sets and binaries (rare in
//! stream images, never read by a template) keep their `AttributeValue`.
//!
//! Readers see [`ValueRef`]s: `S`, `N`, `BOOL` and `NULL` borrowed from
//! the buffer, anything else as the `AttributeValue` itself. The
//! [`Attributes`] trait gives templates and conditions one way to read an
//! image and an [`Item`] read from the table.
//!
//! On the wire an image is the DynamoDB JSON map (`{"email": {"S": ...}}`),
//! exactly as `serde_dynamo::Item`: a dead letter written before images
//! existed reads back unchanged.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

use super::{AttributeValue, Item};

/// Where a name or a value lies in an image's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    start: u32,
    end: u32,
}

/// One attribute's value as stored.
#[derive(Debug, Clone)]
enum Slot {
    S(Span),
    N(Span),
    Bool(bool),
    Null(bool),
    Other(Box<AttributeValue>),
}

/// The attributes of an item, as a stream record or a scan carries them.
#[derive(Clone, Default)]
pub struct Image {
    text: String,
    entries: Vec<(Span, Slot)>,
}

/// An attribute value read from an [`Image`] or an [`Item`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ValueRef<'a> {
    /// A string (`S`).
    S(&'a str),
    /// A number (`N`), as DynamoDB wrote it.
    N(&'a str),
    /// A boolean (`BOOL`).
    Bool(bool),
    /// `NULL`.
    Null(bool),
    /// A binary, list, map or set.
    Other(&'a AttributeValue),
}

impl<'a> From<&'a AttributeValue> for ValueRef<'a> {
    fn from(value: &'a AttributeValue) -> ValueRef<'a> {
        match value {
            AttributeValue::S(text) => ValueRef::S(text),
            AttributeValue::N(number) => ValueRef::N(number),
            AttributeValue::Bool(flag) => ValueRef::Bool(*flag),
            AttributeValue::Null(flag) => ValueRef::Null(*flag),
            other => ValueRef::Other(other),
        }
    }
}

impl<'a> ValueRef<'a> {
    /// The value as an owned `AttributeValue`.
    pub fn to_value(self) -> AttributeValue {
        match self {
            ValueRef::S(text) => AttributeValue::S(text.to_string()),
            ValueRef::N(number) => AttributeValue::N(number.to_string()),
            ValueRef::Bool(flag) => AttributeValue::Bool(flag),
            ValueRef::Null(flag) => AttributeValue::Null(flag),
            ValueRef::Other(value) => value.clone(),
        }
    }

    /// The text of a string value.
    pub fn as_str(self) -> Option<&'a str> {
        match self {
            ValueRef::S(text) => Some(text),
            _ => None,
        }
    }

    /// Equality as DynamoDB sees it: numbers compare by value.
    pub fn equals(self, other: &AttributeValue) -> bool {
        match (self, other) {
            (ValueRef::S(a), AttributeValue::S(b)) => a == b,
            (ValueRef::N(a), AttributeValue::N(b)) => a == b || numbers_equal(a, b),
            (ValueRef::Bool(a), AttributeValue::Bool(b)) => a == *b,
            (ValueRef::Null(a), AttributeValue::Null(b)) => a == *b,
            (ValueRef::Other(a), b) => a == b,
            _ => false,
        }
    }
}

/// A DynamoDB number as sign, significant digits and the power of ten of
/// the first one: `-12.50` and `-1.25E1` are both `(true, "125", 2)`.
/// Exact for DynamoDB's 38 digits, which an `f64` is not (a nanosecond
/// timestamp's last digits vanish in one).
fn decimal(text: &str) -> Option<(bool, String, i64)> {
    let text = text.trim();
    let (negative, rest) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(at) => (&rest[..at], rest[at + 1..].parse::<i64>().ok()?),
        None => (rest, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if whole.is_empty() && fraction.is_empty()
        || !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let digits: String = whole.chars().chain(fraction.chars()).collect();
    let leading = digits.len() - digits.trim_start_matches('0').len();
    let significant = digits.trim_matches('0');
    if significant.is_empty() {
        return Some((false, String::new(), 0));
    }
    let first = whole.len() as i64 - leading as i64 + exponent;
    Some((negative, significant.to_string(), first))
}

/// Whether two DynamoDB numbers are the same value.
fn numbers_equal(a: &str, b: &str) -> bool {
    match (decimal(a), decimal(b)) {
        (Some(x), Some(y)) => x == y,
        _ => false,
    }
}

/// Something attributes can be read from by name: an [`Image`] or an
/// [`Item`].
pub trait Attributes {
    /// The attribute called `name`, if the item has it.
    fn attribute(&self, name: &str) -> Option<ValueRef<'_>>;
}

impl Attributes for Image {
    fn attribute(&self, name: &str) -> Option<ValueRef<'_>> {
        self.get(name)
    }
}

impl Attributes for Item {
    fn attribute(&self, name: &str) -> Option<ValueRef<'_>> {
        self.get(name).map(ValueRef::from)
    }
}

/// The largest image text an [`Image`] can hold (offsets are 32-bit; an
/// item is at most 400 KB).
const MAX_TEXT: usize = u32::MAX as usize;

impl Image {
    /// An image without attributes.
    pub fn new() -> Image {
        Image::default()
    }

    fn with_capacity(entries: usize, text: usize) -> Image {
        Image {
            text: String::with_capacity(text),
            entries: Vec::with_capacity(entries),
        }
    }

    fn text_of(&self, span: Span) -> &str {
        &self.text[span.start as usize..span.end as usize]
    }

    /// Appends `text` to the buffer; `None` past [`MAX_TEXT`].
    fn push_text(&mut self, text: &str) -> Option<Span> {
        let start = self.text.len();
        if start + text.len() > MAX_TEXT {
            return None;
        }
        self.text.push_str(text);
        Some(Span {
            start: start as u32,
            end: self.text.len() as u32,
        })
    }

    fn value_of<'a>(&'a self, slot: &'a Slot) -> ValueRef<'a> {
        match slot {
            Slot::S(span) => ValueRef::S(self.text_of(*span)),
            Slot::N(span) => ValueRef::N(self.text_of(*span)),
            Slot::Bool(flag) => ValueRef::Bool(*flag),
            Slot::Null(flag) => ValueRef::Null(*flag),
            Slot::Other(value) => ValueRef::Other(value),
        }
    }

    fn position(&self, name: &str) -> Option<usize> {
        // Lengths first, from the spans alone: slicing the text for each
        // entry would read it (a `str` slice checks char boundaries).
        let name = name.as_bytes();
        let text = self.text.as_bytes();
        self.entries.iter().position(|(span, _)| {
            (span.end - span.start) as usize == name.len()
                && text[span.start as usize..span.end as usize] == *name
        })
    }

    /// The attribute called `name`.
    pub fn get(&self, name: &str) -> Option<ValueRef<'_>> {
        let index = self.position(name)?;
        Some(self.value_of(&self.entries[index].1))
    }

    /// Whether the image has an attribute called `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.position(name).is_some()
    }

    /// The number of attributes.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the image has no attribute.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The attributes, in the order they were written.
    pub fn iter(&self) -> impl Iterator<Item = (&str, ValueRef<'_>)> + '_ {
        self.entries
            .iter()
            .map(|(name, slot)| (self.text_of(*name), self.value_of(slot)))
    }

    /// Sets an attribute, replacing any value it had.
    ///
    /// # Panics
    ///
    /// When the image's text would pass 4 GiB (an item is at most 400 KB).
    pub fn insert(&mut self, name: &str, value: ValueRef<'_>) {
        let slot = self.slot(value).expect("an image under 4 GiB");
        match self.position(name) {
            Some(index) => self.entries[index].1 = slot,
            None => {
                let name = self.push_text(name).expect("an image under 4 GiB");
                self.entries.push((name, slot));
            }
        }
    }

    fn slot(&mut self, value: ValueRef<'_>) -> Option<Slot> {
        Some(match value {
            ValueRef::S(text) => Slot::S(self.push_text(text)?),
            ValueRef::N(number) => Slot::N(self.push_text(number)?),
            ValueRef::Bool(flag) => Slot::Bool(flag),
            ValueRef::Null(flag) => Slot::Null(flag),
            ValueRef::Other(value) => Slot::Other(Box::new(value.clone())),
        })
    }

    /// The image as an `Item`.
    pub fn to_item(&self) -> Item {
        let mut item = Item::default();
        for (name, value) in self.iter() {
            item.insert(name.to_string(), value.to_value());
        }
        item
    }

    /// Keeps the last of attributes written more than once, as a map
    /// read from JSON does.
    fn dedupe(&mut self) {
        if self.entries.len() < 2 {
            return;
        }
        let mut seen = std::collections::HashSet::with_capacity(self.entries.len());
        let mut keep = vec![false; self.entries.len()];
        for (index, (name, _)) in self.entries.iter().enumerate().rev() {
            keep[index] = seen.insert(&self.text[name.start as usize..name.end as usize]);
        }
        if keep.iter().all(|kept| *kept) {
            return;
        }
        let mut index = 0;
        self.entries.retain(|_| {
            index += 1;
            keep[index - 1]
        });
    }

    /// Whether some name is written twice (cheap when none is: names are
    /// first told apart by a 64-bit filter of their length and last bytes).
    fn has_duplicates(&self) -> bool {
        let mut seen = 0u64;
        for (index, (name, _)) in self.entries.iter().enumerate() {
            let text = self.text_of(*name).as_bytes();
            let byte = |back: usize| usize::from(text[text.len().saturating_sub(back)..][0]);
            let hash = match text.len() {
                0 => 0,
                len => len * 13 + byte(2) * 3 + byte(1),
            };
            let bit = 1u64 << (hash % 64);
            if seen & bit != 0
                && self.entries[..index]
                    .iter()
                    .any(|(other, _)| self.text_of(*other).as_bytes() == text)
            {
                return true;
            }
            seen |= bit;
        }
        false
    }
}

impl From<&Item> for Image {
    fn from(item: &Item) -> Image {
        let mut image = Image::with_capacity(item.len(), 16 * item.len());
        for (name, value) in item.iter() {
            image.insert(name, ValueRef::from(value));
        }
        image
    }
}

impl From<Item> for Image {
    fn from(item: Item) -> Image {
        Image::from(&item)
    }
}

impl From<Image> for Item {
    fn from(image: Image) -> Item {
        image.to_item()
    }
}

impl PartialEq for Image {
    /// Equal when both have the same attributes with the same values (as
    /// written: `"1.0"` and `"1"` differ), in any order.
    fn eq(&self, other: &Image) -> bool {
        self.len() == other.len()
            && self
                .iter()
                .all(|(name, value)| other.get(name) == Some(value))
    }
}

impl fmt::Debug for Image {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// One value in DynamoDB JSON: `{"S": "..."}`.
struct Tagged<'a>(ValueRef<'a>);

impl Serialize for Tagged<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let (tag, text) = match self.0 {
            ValueRef::S(text) => ("S", text),
            ValueRef::N(number) => ("N", number),
            ValueRef::Bool(flag) => {
                let mut map = serializer.serialize_map(Some(1))?;
                map.serialize_entry("BOOL", &flag)?;
                return map.end();
            }
            ValueRef::Null(flag) => {
                let mut map = serializer.serialize_map(Some(1))?;
                map.serialize_entry("NULL", &flag)?;
                return map.end();
            }
            ValueRef::Other(value) => return value.serialize(serializer),
        };
        let mut map = serializer.serialize_map(Some(1))?;
        map.serialize_entry(tag, text)?;
        map.end()
    }
}

impl Serialize for Image {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.len()))?;
        for (name, value) in self.iter() {
            map.serialize_entry(name, &Tagged(value))?;
        }
        map.end()
    }
}

/// Reads a string into the image's text.
struct TextSeed<'b>(&'b mut Image);

impl<'de> DeserializeSeed<'de> for TextSeed<'_> {
    type Value = Span;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Span, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for TextSeed<'_> {
    type Value = Span;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Span, E> {
        self.0
            .push_text(text)
            .ok_or_else(|| E::custom("the image is larger than 4 GiB"))
    }
}

/// A value's type tag; all but the four scalar types are read by
/// `serde_dynamo`.
enum Tag<'a> {
    S,
    N,
    Bool,
    Null,
    Other(std::borrow::Cow<'a, str>),
}

impl<'de> Deserialize<'de> for Tag<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Tag<'de>, D::Error> {
        struct TagVisitor;
        impl<'de> Visitor<'de> for TagVisitor {
            type Value = Tag<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a DynamoDB type tag")
            }

            fn visit_borrowed_str<E: de::Error>(self, tag: &'de str) -> Result<Tag<'de>, E> {
                Ok(Tag::from_str(tag).unwrap_or(Tag::Other(tag.into())))
            }

            fn visit_str<E: de::Error>(self, tag: &str) -> Result<Tag<'de>, E> {
                Ok(Tag::from_str(tag).unwrap_or_else(|| Tag::Other(tag.to_string().into())))
            }
        }
        deserializer.deserialize_str(TagVisitor)
    }
}

impl Tag<'_> {
    fn from_str(tag: &str) -> Option<Tag<'static>> {
        Some(match tag {
            "S" => Tag::S,
            "N" => Tag::N,
            "BOOL" => Tag::Bool,
            "NULL" => Tag::Null,
            _ => return None,
        })
    }
}

/// What a DynamoDB JSON value is (serde_dynamo's words).
const ONE_VALUE: &str =
    r#"an object with a single key "N", "S", "BOOL", "B", "NULL", "M", "L", "SS", "NS", or "BS""#;

/// The type tag of a `{"TAG": value}`, with serde_dynamo's message when
/// there is none.
fn first_tag<'de, A: MapAccess<'de>>(map: &mut A) -> Result<Tag<'de>, A::Error> {
    map.next_key::<Tag>()?
        .ok_or_else(|| de::Error::custom("Expected exactly one key in the object, found none"))
}

/// Refuses a second key in a `{"TAG": value}`, as serde_dynamo does.
fn no_more_keys<'de, A: MapAccess<'de>>(map: &mut A) -> Result<(), A::Error> {
    match map.next_key::<IgnoredAny>()? {
        Some(_) => Err(de::Error::custom(
            "Expected exactly one key in the object, found multiple keys",
        )),
        None => Ok(()),
    }
}

/// Reads one `{"TAG": value}` into the image.
struct ValueSeed<'b>(&'b mut Image);

impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
    type Value = Slot;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Slot, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_> {
    type Value = Slot;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(ONE_VALUE)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Slot, A::Error> {
        let tag = first_tag(&mut map)?;
        let slot = match tag {
            Tag::S => Slot::S(map.next_value_seed(TextSeed(self.0))?),
            Tag::N => Slot::N(map.next_value_seed(TextSeed(self.0))?),
            Tag::Bool => Slot::Bool(map.next_value()?),
            Tag::Null => Slot::Null(map.next_value()?),
            Tag::Other(tag) => return other_value(tag, map, 0).map(|v| Slot::Other(Box::new(v))),
        };
        no_more_keys(&mut map)?;
        Ok(slot)
    }
}

/// How deep maps and lists may nest: DynamoDB's own limit. Deeper values
/// are refused here (bounding recursion whatever the parser allows) and go
/// the slow way.
pub(crate) const MAX_NESTING: usize = 32;

/// Reads a value whose tag is not one of the four scalars: maps and lists
/// here, counting their depth; anything else by `serde_dynamo`, the tag
/// given back to it first.
fn other_value<'de, A: MapAccess<'de>>(
    tag: std::borrow::Cow<'_, str>,
    mut map: A,
    depth: usize,
) -> Result<AttributeValue, A::Error> {
    let value = match &*tag {
        "M" | "L" if depth >= MAX_NESTING => {
            return Err(de::Error::custom(format!(
                "maps and lists nest more than {MAX_NESTING} levels deep"
            )))
        }
        "M" => AttributeValue::M(map.next_value_seed(NestedMap(depth + 1))?),
        "L" => AttributeValue::L(map.next_value_seed(NestedList(depth + 1))?),
        _ => {
            let rest = TaggedRest {
                tag: Some(tag),
                map: &mut map,
            };
            return AttributeValue::deserialize(de::value::MapAccessDeserializer::new(rest));
        }
    };
    no_more_keys(&mut map)?;
    Ok(value)
}

/// A value inside a map or a list, at a depth.
struct Nested(usize);

impl<'de> DeserializeSeed<'de> for Nested {
    type Value = AttributeValue;

    fn deserialize<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<AttributeValue, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Nested {
    type Value = AttributeValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(ONE_VALUE)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<AttributeValue, A::Error> {
        let tag = first_tag(&mut map)?;
        let tag = match tag {
            Tag::S => "S".into(),
            Tag::N => "N".into(),
            Tag::Bool => "BOOL".into(),
            Tag::Null => "NULL".into(),
            Tag::Other(tag) => tag,
        };
        other_value(tag, map, self.0)
    }
}

/// The entries of an `M` value.
struct NestedMap(usize);

impl<'de> DeserializeSeed<'de> for NestedMap {
    type Value = std::collections::HashMap<String, AttributeValue>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for NestedMap {
    type Value = std::collections::HashMap<String, AttributeValue>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of names to DynamoDB values")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut entries = std::collections::HashMap::new();
        while let Some(name) = map.next_key::<String>()? {
            let value = map.next_value_seed(Nested(self.0))?;
            entries.insert(name, value);
        }
        Ok(entries)
    }
}

/// The elements of an `L` value.
struct NestedList(usize);

impl<'de> DeserializeSeed<'de> for NestedList {
    type Value = Vec<AttributeValue>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for NestedList {
    type Value = Vec<AttributeValue>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of DynamoDB values")
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut values = Vec::new();
        while let Some(value) = seq.next_element_seed(Nested(self.0))? {
            values.push(value);
        }
        Ok(values)
    }
}

/// A map whose first key was already read.
struct TaggedRest<'t, 'm, A> {
    tag: Option<std::borrow::Cow<'t, str>>,
    map: &'m mut A,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for TaggedRest<'_, '_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        match self.tag.take() {
            Some(tag) => seed
                .deserialize(de::value::StrDeserializer::<A::Error>::new(&tag))
                .map(Some),
            None => self.map.next_key_seed(seed),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
}

impl<'de> Deserialize<'de> for Image {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Image, D::Error> {
        Image::deserialize_sized(deserializer, 12, 256)
    }
}

impl Image {
    /// Reads an image into buffers sized for `entries` attributes and
    /// `text` bytes of names and values (a key map needs far less than an
    /// item image).
    pub(crate) fn deserialize_sized<'de, D: Deserializer<'de>>(
        deserializer: D,
        entries: usize,
        text: usize,
    ) -> Result<Image, D::Error> {
        struct ImageVisitor(usize, usize);
        impl<'de> Visitor<'de> for ImageVisitor {
            type Value = Image;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of attribute names to DynamoDB values")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Image, A::Error> {
                let mut image = Image::with_capacity(self.0, self.1);
                while let Some(name) = map.next_key_seed(TextSeed(&mut image))? {
                    let slot = map.next_value_seed(ValueSeed(&mut image))?;
                    image.entries.push((name, slot));
                }
                if image.has_duplicates() {
                    image.dedupe();
                }
                Ok(image)
            }
        }
        deserializer.deserialize_map(ImageVisitor(entries, text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> serde_json::Value {
        json!({
            "PK": {"S": "USER#u1"},
            "score": {"N": "0850"},
            "isPrimary": {"BOOL": true},
            "gone": {"NULL": true},
            "tags": {"SS": ["a", "b"]},
            "blob": {"B": "aGVsbG8="},
            "nested": {"M": {"x": {"L": [{"S": "y"}, {"N": "1"}]}}},
            "esc": {"S": "caf\u{e9} \"q\" \\ \n"},
        })
    }

    #[test]
    fn an_image_reads_what_serde_dynamo_reads_and_writes_it_back() {
        let image: Image = serde_json::from_value(sample()).unwrap();
        let item: Item = serde_json::from_value(sample()).unwrap();
        assert_eq!(image.to_item(), item);
        assert_eq!(Image::from(&item), image);
        assert_eq!(image.get("score"), Some(ValueRef::N("0850")));
        assert_eq!(image.get("isPrimary"), Some(ValueRef::Bool(true)));
        assert_eq!(
            image.get("esc").and_then(ValueRef::as_str),
            Some("café \"q\" \\ \n")
        );
        assert!(matches!(
            image.get("nested"),
            Some(ValueRef::Other(AttributeValue::M(_)))
        ));
        assert_eq!(image.get("absent"), None);
        // The wire form is serde_dynamo's.
        let written = serde_json::to_value(&image).unwrap();
        assert_eq!(written, serde_json::to_value(&item).unwrap());
        let text = serde_json::to_string(&image).unwrap();
        assert_eq!(serde_json::from_str::<Image>(&text).unwrap(), image);
        assert_eq!(sonic_rs::from_str::<Image>(&text).unwrap(), image);
    }

    #[test]
    fn a_name_written_twice_keeps_its_last_value_as_a_map_does() {
        let text = r#"{"a": {"S": "1"}, "b": {"S": "2"}, "a": {"N": "3"}}"#;
        let image: Image = serde_json::from_str(text).unwrap();
        let item: Item = serde_json::from_str(text).unwrap();
        assert_eq!(image.len(), 2);
        assert_eq!(image.get("a"), Some(ValueRef::N("3")));
        assert_eq!(image.to_item(), item);
    }

    #[test]
    fn bad_values_are_refused_with_serde_dynamos_messages() {
        for (text, message) in [
            (r#"{"a": {}}"#, "found none"),
            (r#"{"a": {"S": "x", "N": "1"}}"#, "found multiple keys"),
            (r#"{"a": {"X": "x"}}"#, "not a known DynamoDB prefix"),
            (r#"{"a": {"S": 1}}"#, "expected a string"),
            (r#"{"a": {"B": "%%%"}}"#, "base64"),
            (r#"{"a": "x"}"#, "single key"),
        ] {
            let error = serde_json::from_str::<Image>(text).unwrap_err().to_string();
            assert!(error.contains(message), "{text}: {error}");
            assert!(serde_json::from_str::<Item>(text).is_err(), "{text}");
        }
    }

    proptest::proptest! {
        /// Lookups find exactly the names an image has, however it was built.
        #[test]
        fn every_name_is_found_and_no_other(
            names in proptest::collection::btree_set("[a-zA-Z0-9#_]{0,8}", 0..40),
            others in proptest::collection::vec("[a-zA-Z0-9#_]{0,8}", 0..40),
        ) {
            let mut item = Item::default();
            for name in &names {
                item.insert(name.clone(), AttributeValue::S(name.clone()));
            }
            let text = serde_json::to_string(&item).unwrap();
            for image in [Image::from(&item), serde_json::from_str(&text).unwrap()] {
                for name in &names {
                    proptest::prop_assert_eq!(image.get(name), Some(ValueRef::S(name)));
                }
                for other in others.iter().filter(|other| !names.contains(*other)) {
                    proptest::prop_assert_eq!(image.get(other), None);
                }
            }
        }
    }

    /// `{"a": {"M": {"a": {"L": [ ... {"S": "x"} ... ]}}}}`, `depth` maps
    /// and lists deep.
    fn nested(depth: usize) -> String {
        let mut value = r#"{"S": "x"}"#.to_string();
        for level in 0..depth {
            value = if level % 2 == 0 {
                format!(r#"{{"M": {{"a": {value}}}}}"#)
            } else {
                format!(r#"{{"L": [{value}, {{"N": "1"}}]}}"#)
            };
        }
        format!(r#"{{"a": {value}}}"#)
    }

    #[test]
    fn maps_and_lists_nest_as_deep_as_dynamodb_allows_and_no_deeper() {
        let text = nested(MAX_NESTING);
        let image: Image = sonic_rs::from_str(&text).unwrap();
        assert_eq!(
            image.to_item(),
            serde_json::from_str::<Item>(&text).unwrap()
        );
        assert_eq!(serde_json::from_str::<Image>(&text).unwrap(), image);
        // One level more is refused (the record then goes the slow way), and
        // so is anything the parser would read, however deep.
        for depth in [MAX_NESTING + 1, 200, 250] {
            let error = sonic_rs::from_str::<Image>(&nested(depth))
                .unwrap_err()
                .to_string();
            assert!(
                error.contains("nest more than 32 levels"),
                "{depth}: {error}"
            );
        }
    }

    #[test]
    fn inserting_replaces_and_equality_ignores_order() {
        let mut a = Image::new();
        a.insert("x", ValueRef::S("1"));
        a.insert("y", ValueRef::Bool(false));
        a.insert("x", ValueRef::N("2"));
        let mut b = Image::new();
        b.insert("y", ValueRef::Bool(false));
        b.insert("x", ValueRef::N("2"));
        assert_eq!(a, b);
        assert_eq!(a.len(), 2);
        b.insert("x", ValueRef::N("2.0"));
        assert_ne!(a, b);
        assert!(ValueRef::N("2.0").equals(&AttributeValue::N("2".into())));
    }

    #[test]
    fn numbers_compare_by_value_exactly_to_38_digits() {
        let same = |a: &str, b: &str| ValueRef::N(a).equals(&AttributeValue::N(b.into()));
        assert!(same("12.50", "12.5"));
        assert!(same("-1.25E1", "-12.5"));
        assert!(same("0.00", "0"));
        assert!(same("-0", "0"));
        assert!(same("1e3", "1000"));
        assert!(same("007", "7"));
        // Beyond an f64's 17 digits.
        assert!(!same("1700000000000000001", "1700000000000000002"));
        assert!(!same(
            "1.2345678901234567890123456789012345678",
            "1.2345678901234567890123456789012345679"
        ));
        assert!(!same("12", "-12"));
        assert!(!same("0.1", "1"));
        assert!(!same("abc", "abc0"));
    }
}
