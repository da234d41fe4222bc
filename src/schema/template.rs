//! Templates (`EMAIL#{lower(trim(email))}`) and key patterns (`USER#{userId}`).
//!
//! Both are parsed once when a spec is compiled. A [`KeyPattern`] is a
//! template with bare variables only: it can both match a key (binding its
//! variables) and render one. A [`Template`] may apply transforms and reads
//! variables from the key and attributes from the item.

use std::borrow::Cow;
use std::fmt;

use crate::record::{AttributeValue, Attributes, ValueRef};

/// The transforms a template may apply, for error messages.
pub const TRANSFORMS: &[&str] = &["lower", "upper", "trim", "pad"];

/// Why a template or key pattern could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// `{` without `}`.
    #[error("`{{` at byte {0} is never closed (write `{{{{` for a literal brace)")]
    Unclosed(usize),
    /// `}` without `{`.
    #[error("`}}` at byte {0} has no opening `{{` (write `}}}}` for a literal brace)")]
    Unopened(usize),
    /// `{}` or a malformed expression.
    #[error("bad expression `{{{expr}}}`: {why}")]
    BadExpr {
        /// The expression text.
        expr: String,
        /// What is wrong with it.
        why: String,
    },
    /// A function that is not a transform.
    #[error("unknown transform `{name}` (known: {})", TRANSFORMS.join(", "))]
    UnknownTransform {
        /// The function name used.
        name: String,
    },
    /// Transforms in a key pattern.
    #[error("key patterns take bare variables only, not `{{{0}}}`")]
    TransformInPattern(String),
    /// `{a}{b}`: the boundary between the two cannot be found.
    #[error("variables `{{{0}}}` and `{{{1}}}` must be separated by literal text")]
    AdjacentVariables(String, String),
    /// The same variable twice in one pattern.
    #[error("variable `{{{0}}}` appears twice")]
    RepeatedVariable(String),
}

/// Why a template could not be rendered for one item.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The attribute is absent from the item.
    #[error("attribute `{0}` is missing")]
    Missing(String),
    /// The attribute has a type a template cannot render.
    #[error("attribute `{name}` is {found}, expected a string or a number")]
    WrongType {
        /// Attribute name.
        name: String,
        /// The DynamoDB type found (`M`, `L`, ...).
        found: &'static str,
    },
    /// `pad` of something that is not a non-negative integer that fits.
    #[error("pad({name}, {width}): {why}")]
    Pad {
        /// Attribute name.
        name: String,
        /// The requested width.
        width: usize,
        /// What is wrong with the value.
        why: String,
    },
}

/// The DynamoDB type name of a value, for messages.
pub fn type_name(value: &AttributeValue) -> &'static str {
    match value {
        AttributeValue::S(_) => "a string (S)",
        AttributeValue::N(_) => "a number (N)",
        AttributeValue::Bool(_) => "a boolean (BOOL)",
        AttributeValue::B(_) => "binary (B)",
        AttributeValue::Null(_) => "null (NULL)",
        AttributeValue::M(_) => "a map (M)",
        AttributeValue::L(_) => "a list (L)",
        AttributeValue::Ss(_) => "a string set (SS)",
        AttributeValue::Ns(_) => "a number set (NS)",
        AttributeValue::Bs(_) => "a binary set (BS)",
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Expr {
    Var(String),
    Lower(Box<Expr>),
    Upper(Box<Expr>),
    Trim(Box<Expr>),
    Pad(Box<Expr>, usize),
}

impl Expr {
    fn var(&self) -> &str {
        match self {
            Expr::Var(name) => name,
            Expr::Lower(inner) | Expr::Upper(inner) | Expr::Trim(inner) | Expr::Pad(inner, _) => {
                inner.var()
            }
        }
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Var(name) => f.write_str(name),
            Expr::Lower(inner) => write!(f, "lower({inner})"),
            Expr::Upper(inner) => write!(f, "upper({inner})"),
            Expr::Trim(inner) => write!(f, "trim({inner})"),
            Expr::Pad(inner, width) => write!(f, "pad({inner}, {width})"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Lit(String),
    Expr(Expr),
}

fn split_parts(text: &str) -> Result<Vec<(usize, Part)>, TemplateError> {
    let mut parts = Vec::new();
    let mut literal = String::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'{' if bytes.get(i + 1) == Some(&b'{') => {
                literal.push('{');
                i += 2;
            }
            b'}' if bytes.get(i + 1) == Some(&b'}') => {
                literal.push('}');
                i += 2;
            }
            b'{' => {
                let close = text[i..].find('}').ok_or(TemplateError::Unclosed(i))? + i;
                if !literal.is_empty() {
                    parts.push((i, Part::Lit(std::mem::take(&mut literal))));
                }
                let expr = &text[i + 1..close];
                // Name the whole expression, not the nested part at fault.
                let parsed = parse_expr(expr, 0).map_err(|error| match error {
                    TemplateError::BadExpr { why, .. } => TemplateError::BadExpr {
                        expr: expr.to_string(),
                        why,
                    },
                    other => other,
                })?;
                parts.push((i, Part::Expr(parsed)));
                i = close + 1;
            }
            b'}' => return Err(TemplateError::Unopened(i)),
            _ => {
                // Copy one whole UTF-8 character.
                let ch = text[i..].chars().next().expect("in bounds");
                literal.push(ch);
                i += ch.len_utf8();
            }
        }
    }
    if !literal.is_empty() {
        parts.push((i, Part::Lit(literal)));
    }
    Ok(parts)
}

/// How deep transforms may nest (`lower(trim(email))` is 2). There are
/// four transforms, so deeper nesting only repeats them; without a limit a
/// template of thousands of nested calls took time quadratic in its length
/// to parse (140 KB: 40 s), one level of recursion per call.
const MAX_NESTING: usize = 8;

fn parse_expr(text: &str, depth: usize) -> Result<Expr, TemplateError> {
    let bad = |why: &str| TemplateError::BadExpr {
        expr: text.to_string(),
        why: why.to_string(),
    };
    let text_trimmed = text.trim();
    if text_trimmed.is_empty() {
        return Err(bad("it is empty"));
    }
    if depth >= MAX_NESTING && text_trimmed.contains('(') {
        return Err(bad(&format!("transforms nest at most {MAX_NESTING} deep")));
    }
    let Some(open) = text_trimmed.find('(') else {
        if !is_name(text_trimmed) {
            return Err(bad("a variable name is letters, digits, `_`, `-` and `.`"));
        }
        return Ok(Expr::Var(text_trimmed.to_string()));
    };
    if !text_trimmed.ends_with(')') {
        return Err(bad("missing `)`"));
    }
    let name = text_trimmed[..open].trim();
    let inner = &text_trimmed[open + 1..text_trimmed.len() - 1];
    let (arg, extra) = split_top_level_comma(inner);
    let arg = parse_expr(arg, depth + 1)?;
    match (name, extra) {
        ("lower", None) => Ok(Expr::Lower(Box::new(arg))),
        ("upper", None) => Ok(Expr::Upper(Box::new(arg))),
        ("trim", None) => Ok(Expr::Trim(Box::new(arg))),
        ("pad", Some(width)) => {
            let width: usize = width
                .trim()
                .parse()
                .map_err(|_| bad("pad takes a width: pad(score, 4)"))?;
            if width == 0 || width > 40 {
                return Err(bad("pad width must be between 1 and 40"));
            }
            Ok(Expr::Pad(Box::new(arg), width))
        }
        ("pad", None) => Err(bad("pad takes a width: pad(score, 4)")),
        ("lower" | "upper" | "trim", Some(_)) => Err(bad("this transform takes one argument")),
        _ => Err(TemplateError::UnknownTransform {
            name: name.to_string(),
        }),
    }
}

fn split_top_level_comma(text: &str) -> (&str, Option<&str>) {
    let mut depth = 0i32;
    for (i, ch) in text.char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => return (&text[..i], Some(&text[i + 1..])),
            _ => {}
        }
    }
    (text, None)
}

fn is_name(text: &str) -> bool {
    !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// Variables bound by matching a key pattern: `(name, value)` pairs.
pub type Bindings<'a> = Vec<(&'a str, &'a str)>;

/// Looks a variable up in key bindings.
pub fn lookup<'a>(bindings: &[(&str, &'a str)], name: &str) -> Option<&'a str> {
    bindings.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

/// A key pattern such as `USER#{userId}`: literals and bare variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPattern {
    source: String,
    /// Alternating pieces; variables are never adjacent.
    pieces: Vec<Piece>,
    vars: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Lit(String),
    Var(String),
}

impl KeyPattern {
    /// Parses a key pattern.
    pub fn parse(text: &str) -> Result<KeyPattern, TemplateError> {
        let mut pieces = Vec::new();
        let mut vars: Vec<String> = Vec::new();
        for (_, part) in split_parts(text)? {
            match part {
                Part::Lit(lit) => pieces.push(Piece::Lit(lit)),
                Part::Expr(Expr::Var(name)) => {
                    if let Some(Piece::Var(prev)) = pieces.last() {
                        return Err(TemplateError::AdjacentVariables(prev.clone(), name));
                    }
                    if vars.contains(&name) {
                        return Err(TemplateError::RepeatedVariable(name));
                    }
                    vars.push(name.clone());
                    pieces.push(Piece::Var(name));
                }
                Part::Expr(other) => {
                    return Err(TemplateError::TransformInPattern(other.to_string()))
                }
            }
        }
        Ok(KeyPattern {
            source: text.to_string(),
            pieces,
            vars,
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// The variables, in order.
    pub fn vars(&self) -> &[String] {
        &self.vars
    }

    /// The literal text before the first variable.
    pub fn literal_prefix(&self) -> &str {
        match self.pieces.first() {
            Some(Piece::Lit(lit)) => lit,
            _ => "",
        }
    }

    /// The literal text after the last variable.
    pub fn literal_suffix(&self) -> &str {
        match self.pieces.last() {
            Some(Piece::Lit(lit)) if self.pieces.len() > 1 || self.vars.is_empty() => lit,
            _ => "",
        }
    }

    /// Whether the pattern is plain text.
    pub fn is_literal(&self) -> bool {
        self.vars.is_empty()
    }

    /// Matches `value`, pushing the bound variables onto `out`.
    ///
    /// Each variable takes at least one character and stops at the first
    /// occurrence of the literal that follows it; the last one takes the rest.
    /// On a mismatch `out` is restored to its length on entry.
    pub fn match_into<'p, 'v>(&'p self, value: &'v str, out: &mut Bindings<'v>) -> bool
    where
        'p: 'v,
    {
        let start_len = out.len();
        let mut rest = value;
        let mut i = 0;
        while i < self.pieces.len() {
            match &self.pieces[i] {
                Piece::Lit(lit) => {
                    if !rest.starts_with(lit.as_str()) {
                        out.truncate(start_len);
                        return false;
                    }
                    rest = &rest[lit.len()..];
                }
                Piece::Var(name) => {
                    // A variable takes at least one character.
                    let first = rest.chars().next().map_or(0, char::len_utf8);
                    let end = match self.pieces.get(i + 1) {
                        Some(Piece::Lit(next)) if first > 0 => {
                            match rest[first..].find(next.as_str()) {
                                Some(pos) => pos + first,
                                None => {
                                    out.truncate(start_len);
                                    return false;
                                }
                            }
                        }
                        _ => rest.len(),
                    };
                    if end == 0 || !rest.is_char_boundary(end) {
                        out.truncate(start_len);
                        return false;
                    }
                    out.push((name.as_str(), &rest[..end]));
                    rest = &rest[end..];
                }
            }
            i += 1;
        }
        if rest.is_empty() {
            true
        } else {
            out.truncate(start_len);
            false
        }
    }

    /// Renders the pattern from bound variables; `None` if one is unbound.
    pub fn render(&self, bindings: &[(&str, &str)]) -> Option<String> {
        let mut out = String::with_capacity(self.source.len() + 16);
        for piece in &self.pieces {
            match piece {
                Piece::Lit(lit) => out.push_str(lit),
                Piece::Var(name) => out.push_str(lookup(bindings, name)?),
            }
        }
        Some(out)
    }

    /// Conservatively decides whether some value could match both patterns.
    ///
    /// Literal patterns are compared exactly; otherwise the literal prefixes
    /// and suffixes must be compatible. `false` is a proof of disjointness.
    pub fn could_overlap(&self, other: &KeyPattern) -> bool {
        if self.is_literal() && other.is_literal() {
            return self.source == other.source;
        }
        if self.is_literal() {
            let mut scratch = Vec::new();
            return other.match_into(self.literal_prefix(), &mut scratch);
        }
        if other.is_literal() {
            return other.could_overlap(self);
        }
        let compatible = |a: &str, b: &str, prefix: bool| {
            if prefix {
                a.starts_with(b) || b.starts_with(a)
            } else {
                a.ends_with(b) || b.ends_with(a)
            }
        };
        compatible(self.literal_prefix(), other.literal_prefix(), true)
            && compatible(self.literal_suffix(), other.literal_suffix(), false)
    }
}

impl fmt::Display for KeyPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// A value template: literal text and expressions over key variables and
/// item attributes, such as `SCORE#{pad(score, 4)}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    source: String,
    parts: Vec<Part>,
}

impl Template {
    /// Parses a template.
    pub fn parse(text: &str) -> Result<Template, TemplateError> {
        let parts = split_parts(text)?
            .into_iter()
            .map(|(_, part)| part)
            .collect();
        Ok(Template {
            source: text.to_string(),
            parts,
        })
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// The names the template reads (key variables or attributes).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|part| match part {
            Part::Expr(expr) => Some(expr.var()),
            Part::Lit(_) => None,
        })
    }

    /// `Some(name)` when the template is exactly `{name}`: such a template
    /// copies the attribute's value with its type instead of rendering text.
    pub fn single_var(&self) -> Option<&str> {
        match self.parts.as_slice() {
            [Part::Expr(Expr::Var(name))] => Some(name),
            _ => None,
        }
    }

    /// Renders the template. Names resolve to key variables first, then to
    /// attributes of `item`.
    pub fn render<A: Attributes + ?Sized>(
        &self,
        bindings: &[(&str, &str)],
        item: Option<&A>,
    ) -> Result<String, RenderError> {
        let mut out = String::with_capacity(self.source.len() + 24);
        for part in &self.parts {
            match part {
                Part::Lit(lit) => out.push_str(lit),
                Part::Expr(expr) => {
                    let value = eval(expr, bindings, item)?;
                    out.push_str(&value);
                }
            }
        }
        Ok(out)
    }

    /// Evaluates the template to an attribute value: a `{name}` template
    /// copies the value as it is (any type); others render a string.
    pub fn value<A: Attributes + ?Sized>(
        &self,
        bindings: &[(&str, &str)],
        item: Option<&A>,
    ) -> Result<AttributeValue, RenderError> {
        if let Some(name) = self.single_var() {
            if let Some(value) = lookup(bindings, name) {
                return Ok(AttributeValue::S(value.to_string()));
            }
            return item
                .and_then(|item| item.attribute(name))
                .map(ValueRef::to_value)
                .ok_or_else(|| RenderError::Missing(name.to_string()));
        }
        self.render(bindings, item).map(AttributeValue::S)
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

fn eval<'a, A: Attributes + ?Sized>(
    expr: &Expr,
    bindings: &[(&str, &'a str)],
    item: Option<&'a A>,
) -> Result<Cow<'a, str>, RenderError> {
    match expr {
        Expr::Var(name) => {
            if let Some(value) = lookup(bindings, name) {
                return Ok(Cow::Borrowed(value));
            }
            match item.and_then(|item| item.attribute(name.as_str())) {
                None => Err(RenderError::Missing(name.clone())),
                Some(ValueRef::S(s)) => Ok(Cow::Borrowed(s)),
                Some(ValueRef::N(n)) => Ok(Cow::Borrowed(n)),
                Some(ValueRef::Bool(b)) => Ok(Cow::Borrowed(if b { "true" } else { "false" })),
                Some(other) => Err(RenderError::WrongType {
                    name: name.clone(),
                    found: type_name(&other.to_value()),
                }),
            }
        }
        Expr::Lower(inner) => {
            let value = eval(inner, bindings, item)?;
            if value.chars().any(char::is_uppercase) {
                Ok(Cow::Owned(value.to_lowercase()))
            } else {
                Ok(value)
            }
        }
        Expr::Upper(inner) => {
            let value = eval(inner, bindings, item)?;
            if value.chars().any(char::is_lowercase) {
                Ok(Cow::Owned(value.to_uppercase()))
            } else {
                Ok(value)
            }
        }
        Expr::Trim(inner) => match eval(inner, bindings, item)? {
            Cow::Borrowed(value) => Ok(Cow::Borrowed(value.trim())),
            Cow::Owned(value) => Ok(Cow::Owned(value.trim().to_string())),
        },
        Expr::Pad(inner, width) => {
            let value = eval(inner, bindings, item)?;
            let pad_error = |why: String| RenderError::Pad {
                name: inner.var().to_string(),
                width: *width,
                why,
            };
            let digits = value.trim();
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(pad_error(format!(
                    "`{digits}` is not a non-negative whole number"
                )));
            }
            let digits = digits.trim_start_matches('0');
            let digits = if digits.is_empty() { "0" } else { digits };
            if digits.len() > *width {
                return Err(pad_error(format!(
                    "{digits} has more than {width} digits and would sort wrongly"
                )));
            }
            Ok(Cow::Owned(format!("{digits:0>width$}", width = *width)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Item;

    fn item(pairs: &[(&str, AttributeValue)]) -> Item {
        let mut item = Item::default();
        for (k, v) in pairs {
            item.insert(k.to_string(), v.clone());
        }
        item
    }

    #[test]
    fn key_pattern_matches_and_binds() {
        let pattern = KeyPattern::parse("USER#{userId}").unwrap();
        let mut out = Vec::new();
        assert!(pattern.match_into("USER#abc-123", &mut out));
        assert_eq!(out, vec![("userId", "abc-123")]);
        out.clear();
        assert!(!pattern.match_into("USER#", &mut out));
        assert!(!pattern.match_into("USERS#x", &mut out));
        assert!(out.is_empty());
    }

    #[test]
    fn key_pattern_with_two_variables_splits_at_the_literal() {
        let pattern = KeyPattern::parse("STATUS#{status}#CAMPAIGN#{campaignId}").unwrap();
        let mut out = Vec::new();
        assert!(pattern.match_into("STATUS#ENABLED#CAMPAIGN#c-1", &mut out));
        assert_eq!(out, vec![("status", "ENABLED"), ("campaignId", "c-1")]);
        assert_eq!(pattern.render(&out).unwrap(), "STATUS#ENABLED#CAMPAIGN#c-1");
    }

    #[test]
    fn literal_pattern_matches_exactly() {
        let pattern = KeyPattern::parse("PROFILE").unwrap();
        let mut out = Vec::new();
        assert!(pattern.match_into("PROFILE", &mut out));
        assert!(!pattern.match_into("PROFILES", &mut out));
    }

    #[test]
    fn pattern_errors_are_specific() {
        assert_eq!(
            KeyPattern::parse("A#{a}{b}").unwrap_err(),
            TemplateError::AdjacentVariables("a".into(), "b".into())
        );
        assert!(matches!(
            KeyPattern::parse("A#{lower(a)}").unwrap_err(),
            TemplateError::TransformInPattern(_)
        ));
        assert_eq!(
            KeyPattern::parse("A#{a").unwrap_err(),
            TemplateError::Unclosed(2)
        );
        assert!(matches!(
            Template::parse("{shout(a)}").unwrap_err(),
            TemplateError::UnknownTransform { name } if name == "shout"
        ));
    }

    #[test]
    fn overlap_is_detected_conservatively() {
        let follows = KeyPattern::parse("FOLLOWS#{b}").unwrap();
        let followed = KeyPattern::parse("FOLLOWED_BY#{a}").unwrap();
        assert!(!follows.could_overlap(&followed));
        let any = KeyPattern::parse("{x}").unwrap();
        assert!(any.could_overlap(&follows));
        let profile = KeyPattern::parse("PROFILE").unwrap();
        assert!(!profile.could_overlap(&follows));
        assert!(profile.could_overlap(&KeyPattern::parse("PRO{x}").unwrap()));
    }

    #[test]
    fn templates_render_with_transforms() {
        let t = Template::parse("EMAIL#{lower(trim(email))}").unwrap();
        let it = item(&[("email", AttributeValue::S("  Sam@X.org ".into()))]);
        assert_eq!(t.render(&[], Some(&it)).unwrap(), "EMAIL#sam@x.org");
        let t = Template::parse("SCORE#{pad(score, 4)}").unwrap();
        let it = item(&[("score", AttributeValue::N("850".into()))]);
        assert_eq!(t.render(&[], Some(&it)).unwrap(), "SCORE#0850");
    }

    #[test]
    fn pad_refuses_values_that_would_sort_wrongly() {
        let t = Template::parse("{pad(score, 4)}").unwrap();
        for bad in ["12345", "-5", "8.5"] {
            let it = item(&[("score", AttributeValue::N(bad.into()))]);
            assert!(
                matches!(t.render(&[], Some(&it)), Err(RenderError::Pad { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn key_variables_win_over_attributes() {
        let t = Template::parse("USER#{userId}").unwrap();
        let it = item(&[("userId", AttributeValue::S("from-attr".into()))]);
        assert_eq!(
            t.render(&[("userId", "from-key")], Some(&it)).unwrap(),
            "USER#from-key"
        );
    }

    #[test]
    fn missing_and_mistyped_attributes_are_errors() {
        let t = Template::parse("EMAIL#{email}").unwrap();
        assert_eq!(
            t.render(&[], Some(&Item::default())),
            Err(RenderError::Missing("email".into()))
        );
        let it = item(&[("email", AttributeValue::L(vec![]))]);
        assert!(matches!(
            t.render(&[], Some(&it)),
            Err(RenderError::WrongType { .. })
        ));
    }

    #[test]
    fn single_variable_templates_copy_typed_values() {
        let t = Template::parse("{isPrimary}").unwrap();
        let it = item(&[("isPrimary", AttributeValue::Bool(true))]);
        assert_eq!(t.value(&[], Some(&it)).unwrap(), AttributeValue::Bool(true));
    }
}
