//! The floors of `src/`: modules import one another only downward.
//!
//! A tidy test in the style of rust-analyzer's: it reads every file of the
//! library the way the compiler would find it (from `src/lib.rs`, through
//! `mod` declarations, leaving out `#[cfg(test)]` items), collects the
//! paths of its `use` declarations, its code and its macro calls, resolves
//! each to the module that defines what it names (following `super::`,
//! `use` bindings, re-exports and globs) or to the outside crate it starts
//! with, and holds them to the rules of `ARCHITECTURE.md`:
//!
//! - the module map: every top-level module is a room on a floor, and a
//!   room may only use rooms on its own floor or below, never in a cycle;
//! - the pure floors name no I/O or SDK crate (but `decode`'s SDK files)
//!   and await nothing;
//! - the record model's `Item::from` and `AttributeValue::from` are called
//!   in `decode/sdk.rs`, and elsewhere only where the test lists them (on
//!   keys, and in `decode/scan.rs`);
//! - only `apply/markers.rs` and `prune` name counter records (`_ddbp#c`)
//!   other than to read them;
//! - only `cli` makes exit codes.
//!
//! A failure names the file, the line and the path. What a path names is
//! found from its words alone, without types: a conversion written
//! `.into()` or a constant spelled out in a `format!` string goes unseen.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::LazyLock;

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::spanned::Spanned;
use syn::visit::Visit;

use super::util::repo_path;

/// A module, as the path of names from the crate root (`["apply", "ctx"]`).
type ModulePath = Vec<String>;

/// What one module binds: its `use` names and the items it defines.
#[derive(Default)]
struct Module {
    /// `use` bindings: the name in scope, and the path it names (as
    /// written, resolved from this module).
    uses: BTreeMap<String, Vec<String>>,
    /// Glob imports (`use x::*`), as written.
    globs: Vec<Vec<String>>,
    /// Names of the items defined here (functions, types, constants...).
    items: BTreeSet<String>,
}

/// How a path is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Context {
    /// In a `use` declaration.
    Use,
    /// Read: the argument of `get` or `contains_key`, or compared with
    /// `==` or `!=`.
    Read,
    /// Anywhere else in code.
    Code,
}

/// Where something is written: the file (`src/plan/mod.rs`), the line and
/// the module the code is in.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Place {
    file: String,
    line: usize,
    module: ModulePath,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// A path written in the library's code, before resolution.
struct Written {
    at: Place,
    path: Vec<String>,
    context: Context,
}

/// An `async` or an `.await`.
struct Async {
    at: Place,
    what: &'static str,
}

/// A call `T::from(arg)`.
struct FromCall {
    at: Place,
    ty: Vec<String>,
    arg: String,
}

/// A string literal.
struct Literal {
    at: Place,
    value: String,
}

/// What a path names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// A module of the crate, and the item of it, when the path goes that
    /// far.
    Crate {
        module: ModulePath,
        item: Option<String>,
    },
    /// A path into another crate (`aws_sdk_dynamodb::types::AttributeValue`),
    /// re-exports followed.
    External(Vec<String>),
}

impl Target {
    /// The outside crate a path names.
    fn external_crate(&self) -> Option<&str> {
        match self {
            Target::External(path) => path.first().map(String::as_str),
            Target::Crate { .. } => None,
        }
    }
}

/// A path, where it is written and what it names.
struct Name<'g> {
    at: &'g Place,
    path: String,
    context: Context,
    target: &'g Target,
}

impl Name<'_> {
    fn module(&self) -> String {
        self.at.module.join("::")
    }
}

/// A use of one module by another, where it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Edge {
    /// The file, relative to the crate (`src/plan/mod.rs`).
    file: String,
    /// The line.
    line: usize,
    /// The path as written (`crate::lambda::event::table_from_stream_arn`).
    path: String,
    /// The module the code is in.
    from: String,
    /// The module that defines what the path names.
    to: String,
}

/// The library's modules and what their code names.
struct Graph {
    modules: BTreeMap<ModulePath, Module>,
    written: Vec<Written>,
    /// What each path of `written` names, when it names something outside
    /// the function it is in.
    targets: Vec<Option<Target>>,
    asyncs: Vec<Async>,
    from_calls: Vec<FromCall>,
    literals: Vec<Literal>,
}

/// Reads the files of the crate's `src/` (`src/...` to text).
fn read_sources() -> BTreeMap<String, String> {
    fn collect(dir: &std::path::Path, into: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).expect("the source folder reads") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                collect(&path, into);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let name = path
                    .strip_prefix(repo_path(""))
                    .expect("under the root")
                    .to_string_lossy()
                    .replace('\\', "/");
                into.insert(
                    name,
                    std::fs::read_to_string(&path).expect("a source file reads"),
                );
            }
        }
    }
    let mut files = BTreeMap::new();
    collect(&repo_path("src"), &mut files);
    files
}

/// The library of this crate, read once.
static LIBRARY: LazyLock<Graph> = LazyLock::new(|| graph_of(&read_sources()));

/// The graph of a library given as files (`src/...` to text).
fn graph_of(files: &BTreeMap<String, String>) -> Graph {
    graph_from(files, "src/lib.rs")
}

/// The graph of the crate whose root file is `root`.
fn graph_from(files: &BTreeMap<String, String>, root: &str) -> Graph {
    let mut graph = Graph {
        modules: BTreeMap::new(),
        written: Vec::new(),
        targets: Vec::new(),
        asyncs: Vec::new(),
        from_calls: Vec::new(),
        literals: Vec::new(),
    };
    read_module_file(files, root, Vec::new(), "src", &mut graph);
    graph.targets = graph
        .written
        .iter()
        .map(|written| graph.resolve(&written.at.module, &written.path, 0))
        .collect();
    graph
}

/// Reads the file of module `module`; `dir` is where its `mod x;` files are.
fn read_module_file(
    files: &BTreeMap<String, String>,
    file: &str,
    module: ModulePath,
    dir: &str,
    graph: &mut Graph,
) {
    let text = files
        .get(file)
        .unwrap_or_else(|| panic!("{file} is declared but not found"));
    let parsed = syn::parse_file(text).unwrap_or_else(|error| panic!("{file}: {error}"));
    read_items(files, file, &parsed.items, module, dir, graph);
}

fn read_items(
    files: &BTreeMap<String, String>,
    file: &str,
    items: &[syn::Item],
    module: ModulePath,
    dir: &str,
    graph: &mut Graph,
) {
    let entry = graph.modules.entry(module.clone()).or_default();
    for item in items {
        if is_test_only(item_attrs(item)) {
            continue;
        }
        if let Some(name) = item_name(item) {
            entry.items.insert(name);
        }
        if let syn::Item::Use(u) = item {
            for (name, path, _) in use_leaves(&u.tree) {
                match name {
                    Some(name) => {
                        entry.uses.insert(name, path);
                    }
                    None => entry.globs.push(path),
                }
            }
        }
    }
    for item in items {
        match item {
            _ if is_test_only(item_attrs(item)) => {}
            syn::Item::Mod(m) => {
                let name = m.ident.to_string();
                let mut child = module.clone();
                child.push(name.clone());
                let child_dir = format!("{dir}/{name}");
                match &m.content {
                    Some((_, inner)) => read_items(files, file, inner, child, &child_dir, graph),
                    None => {
                        let flat = format!("{dir}/{name}.rs");
                        let nested = format!("{dir}/{name}/mod.rs");
                        let found = if files.contains_key(&flat) {
                            flat
                        } else {
                            nested
                        };
                        read_module_file(files, &found, child, &child_dir, graph);
                    }
                }
            }
            other => Reader {
                graph,
                file,
                module: &module,
                scopes: Vec::new(),
                reading: false,
            }
            .visit_item(other),
        }
    }
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

fn item_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        syn::Item::Mod(i) => &i.ident,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::TraitAlias(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

/// Whether attributes hold a `#[cfg(...)]` that only tests satisfy.
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| match &attr.meta {
        syn::Meta::List(list) if attr.path().is_ident("cfg") => {
            let tokens = list.tokens.to_string();
            tokens
                .split(|c: char| !c.is_alphanumeric() && c != '_')
                .any(|w| w == "test")
                && !tokens.contains("not")
        }
        _ => false,
    })
}

/// The leaves of a `use` tree: the name each binds (`None` for a glob),
/// the path it names and its line.
fn use_leaves(tree: &syn::UseTree) -> Vec<(Option<String>, Vec<String>, usize)> {
    fn walk(
        tree: &syn::UseTree,
        mut prefix: Vec<String>,
        out: &mut Vec<(Option<String>, Vec<String>, usize)>,
    ) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                walk(&p.tree, prefix, out);
            }
            syn::UseTree::Name(n) => {
                let name = n.ident.to_string();
                let line = line_of(n.ident.span());
                if name == "self" {
                    out.push((prefix.last().cloned(), prefix, line));
                } else {
                    prefix.push(name.clone());
                    out.push((Some(name), prefix, line));
                }
            }
            syn::UseTree::Rename(r) => {
                let name = r.ident.to_string();
                if name != "self" {
                    prefix.push(name);
                }
                out.push((Some(r.rename.to_string()), prefix, line_of(r.ident.span())));
            }
            syn::UseTree::Glob(g) => out.push((None, prefix, line_of(g.star_token.span))),
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    walk(tree, prefix.clone(), out);
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(tree, Vec::new(), &mut out);
    out
}

fn line_of(span: Span) -> usize {
    span.start().line
}

/// Collects what an item of one module writes: its paths (with the `use`
/// declarations of blocks applied), `async`s and `.await`s, `from` calls
/// and string literals. Nested `#[cfg(test)]` items are left out.
struct Reader<'a> {
    graph: &'a mut Graph,
    file: &'a str,
    module: &'a ModulePath,
    /// The `use` bindings of the blocks the reader is in, innermost last.
    scopes: Vec<BTreeMap<String, Vec<String>>>,
    /// Whether the path being visited is read (see [`Context::Read`]).
    reading: bool,
}

impl Reader<'_> {
    fn place(&self, span: Span) -> Place {
        Place {
            file: self.file.to_string(),
            line: line_of(span),
            module: self.module.clone(),
        }
    }

    /// A path as the module sees it: a name bound by a block's `use`
    /// replaced by what it names.
    fn in_module(&self, mut path: Vec<String>) -> Vec<String> {
        if let Some(bound) = self.scopes.iter().rev().find_map(|s| s.get(&path[0])) {
            path.splice(0..1, bound.iter().cloned());
        }
        path
    }

    fn write(&mut self, span: Span, path: Vec<String>, context: Context) {
        if path.len() == 1 && matches!(path[0].as_str(), "crate" | "super" | "self") {
            // `self.x`, `pub(crate)`: no item.
            return;
        }
        let written = Written {
            at: self.place(span),
            path: self.in_module(path),
            context,
        };
        self.graph.written.push(written);
    }

    fn mark(&mut self, span: Span, what: &'static str) {
        let at = self.place(span);
        self.graph.asyncs.push(Async { at, what });
    }

    /// Visits `expr`, read when it is a path (behind any `&`).
    fn visit_maybe_read(&mut self, expr: &syn::Expr, read: bool) {
        let mut inner = expr;
        while let syn::Expr::Reference(r) = inner {
            inner = &r.expr;
        }
        let was = self.reading;
        self.reading = read && matches!(inner, syn::Expr::Path(_));
        self.visit_expr(expr);
        self.reading = was;
    }

    /// Paths, `async` and `await` in a macro's tokens: an identifier,
    /// followed by `::` and identifiers or not.
    fn scan_tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let colons = |j: usize| {
            matches!(
                (trees.get(j), trees.get(j + 1), trees.get(j + 2)),
                (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)), Some(TokenTree::Ident(_)))
                    if a.as_char() == ':' && b.as_char() == ':'
            )
        };
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(group) => self.scan_tokens(group.stream()),
                TokenTree::Ident(ident) if ident == "async" => self.mark(ident.span(), "async"),
                TokenTree::Ident(ident) if ident == "await" => self.mark(ident.span(), ".await"),
                TokenTree::Ident(ident) => {
                    let mut names = vec![ident.to_string()];
                    let mut next = i + 1;
                    while let Some(TokenTree::Ident(name)) = colons(next).then(|| &trees[next + 2])
                    {
                        names.push(name.to_string());
                        next += 3;
                    }
                    self.write(ident.span(), names, Context::Code);
                    i = next;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Reader<'_> {
    fn visit_path(&mut self, path: &'ast syn::Path) {
        let names: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if let Some(first) = path.segments.first() {
            let context = if self.reading {
                Context::Read
            } else {
                Context::Code
            };
            self.write(first.ident.span(), names, context);
        }
        self.reading = false;
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        self.scan_tokens(mac.tokens.clone());
    }

    fn visit_item(&mut self, item: &'ast syn::Item) {
        if is_test_only(item_attrs(item)) {
            return;
        }
        if let syn::Item::Use(u) = item {
            for (_, path, line) in use_leaves(&u.tree) {
                let at = Place {
                    file: self.file.to_string(),
                    line,
                    module: self.module.clone(),
                };
                self.graph.written.push(Written {
                    at,
                    path,
                    context: Context::Use,
                });
            }
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_block(&mut self, block: &'ast syn::Block) {
        let mut scope = BTreeMap::new();
        for stmt in &block.stmts {
            if let syn::Stmt::Item(syn::Item::Use(u)) = stmt {
                if !is_test_only(&u.attrs) {
                    for (name, path, _) in use_leaves(&u.tree) {
                        if let Some(name) = name {
                            scope.insert(name, path);
                        }
                    }
                }
            }
        }
        self.scopes.push(scope);
        syn::visit::visit_block(self, block);
        self.scopes.pop();
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs: &[syn::Attribute] = match item {
            syn::ImplItem::Const(i) => &i.attrs,
            syn::ImplItem::Fn(i) => &i.attrs,
            syn::ImplItem::Type(i) => &i.attrs,
            syn::ImplItem::Macro(i) => &i.attrs,
            _ => &[],
        };
        if !is_test_only(attrs) {
            syn::visit::visit_impl_item(self, item);
        }
    }

    fn visit_trait_item(&mut self, item: &'ast syn::TraitItem) {
        let attrs: &[syn::Attribute] = match item {
            syn::TraitItem::Const(i) => &i.attrs,
            syn::TraitItem::Fn(i) => &i.attrs,
            syn::TraitItem::Type(i) => &i.attrs,
            syn::TraitItem::Macro(i) => &i.attrs,
            _ => &[],
        };
        if !is_test_only(attrs) {
            syn::visit::visit_trait_item(self, item);
        }
    }

    fn visit_variant(&mut self, variant: &'ast syn::Variant) {
        if !is_test_only(&variant.attrs) {
            syn::visit::visit_variant(self, variant);
        }
    }

    fn visit_field(&mut self, field: &'ast syn::Field) {
        if !is_test_only(&field.attrs) {
            syn::visit::visit_field(self, field);
        }
    }

    fn visit_field_value(&mut self, field: &'ast syn::FieldValue) {
        if !is_test_only(&field.attrs) {
            syn::visit::visit_field_value(self, field);
        }
    }

    fn visit_arm(&mut self, arm: &'ast syn::Arm) {
        if !is_test_only(&arm.attrs) {
            syn::visit::visit_arm(self, arm);
        }
    }

    fn visit_local(&mut self, local: &'ast syn::Local) {
        if !is_test_only(&local.attrs) {
            syn::visit::visit_local(self, local);
        }
    }

    fn visit_stmt_macro(&mut self, mac: &'ast syn::StmtMacro) {
        if !is_test_only(&mac.attrs) {
            syn::visit::visit_stmt_macro(self, mac);
        }
    }

    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {
        // `pub(super)` names where an item is seen, not what it uses.
    }

    fn visit_attribute(&mut self, attr: &'ast syn::Attribute) {
        // Only the attribute's name (`tokio::main`): doc comments and
        // derives name no module.
        self.visit_path(attr.path());
    }

    fn visit_signature(&mut self, sig: &'ast syn::Signature) {
        if let Some(token) = &sig.asyncness {
            self.mark(token.span, "async fn");
        }
        syn::visit::visit_signature(self, sig);
    }

    fn visit_expr_async(&mut self, block: &'ast syn::ExprAsync) {
        self.mark(block.async_token.span, "async block");
        syn::visit::visit_expr_async(self, block);
    }

    fn visit_expr_closure(&mut self, closure: &'ast syn::ExprClosure) {
        if let Some(token) = &closure.asyncness {
            self.mark(token.span, "async closure");
        }
        syn::visit::visit_expr_closure(self, closure);
    }

    fn visit_expr_await(&mut self, expr: &'ast syn::ExprAwait) {
        self.mark(expr.await_token.span, ".await");
        syn::visit::visit_expr_await(self, expr);
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        let read = call.method == "get" || call.method == "contains_key";
        self.visit_expr(&call.receiver);
        if let Some(turbofish) = &call.turbofish {
            self.visit_angle_bracketed_generic_arguments(turbofish);
        }
        for arg in &call.args {
            self.visit_maybe_read(arg, read);
        }
    }

    fn visit_expr_binary(&mut self, expr: &'ast syn::ExprBinary) {
        let read = matches!(expr.op, syn::BinOp::Eq(_) | syn::BinOp::Ne(_));
        self.visit_maybe_read(&expr.left, read);
        self.visit_maybe_read(&expr.right, read);
    }

    fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
        if let (syn::Expr::Path(func), 1) = (&*call.func, call.args.len()) {
            let names: Vec<String> = func
                .path
                .segments
                .iter()
                .map(|s| s.ident.to_string())
                .collect();
            if func.qself.is_none() && names.len() > 1 && names.last().is_some_and(|n| n == "from")
            {
                let from_call = FromCall {
                    at: self.place(func.path.span()),
                    ty: self.in_module(names[..names.len() - 1].to_vec()),
                    arg: call.args[0].span().source_text().unwrap_or_default(),
                };
                self.graph.from_calls.push(from_call);
            }
        }
        syn::visit::visit_expr_call(self, call);
    }

    fn visit_lit_str(&mut self, lit: &'ast syn::LitStr) {
        let literal = Literal {
            at: self.place(lit.span()),
            value: lit.value(),
        };
        self.graph.literals.push(literal);
    }
}

/// What a name is bound to in a module.
enum Found {
    /// A child module.
    Child(ModulePath),
    /// An item defined in this module (or one a glob brings).
    Item(ModulePath),
    /// A `use` binding, written in that module.
    Bound(ModulePath, Vec<String>),
}

impl Graph {
    /// Every module of the library.
    fn modules(&self) -> Vec<String> {
        self.modules.keys().map(|m| m.join("::")).collect()
    }

    /// Every path written, resolved; paths naming nothing outside the
    /// function they are in (locals, `Self`, type parameters) are left out.
    fn names(&self) -> impl Iterator<Item = Name<'_>> {
        self.written
            .iter()
            .zip(&self.targets)
            .filter_map(|(written, target)| {
                Some(Name {
                    at: &written.at,
                    path: written.path.join("::"),
                    context: written.context,
                    target: target.as_ref()?,
                })
            })
    }

    /// Every use of one module by another, resolved.
    fn edges(&self) -> Vec<Edge> {
        self.names()
            .filter_map(|name| match name.target {
                Target::Crate { module, .. } => Some(Edge {
                    file: name.at.file.clone(),
                    line: name.at.line,
                    from: name.module(),
                    to: module.join("::"),
                    path: name.path,
                }),
                Target::External(_) => None,
            })
            .collect()
    }

    /// What `path` names, seen from `module`.
    fn resolve(&self, module: &ModulePath, path: &[String], depth: usize) -> Option<Target> {
        if depth > 32 || path.is_empty() {
            return None;
        }
        match path[0].as_str() {
            "crate" => self.walk(Vec::new(), &path[1..], depth),
            "self" => self.walk(module.clone(), &path[1..], depth),
            "super" => {
                let mut at = module.clone();
                let mut rest = path;
                while rest.first().is_some_and(|s| s == "super") {
                    at.pop()?;
                    rest = &rest[1..];
                }
                self.walk(at, rest, depth)
            }
            first => match self.lookup(module, first, depth) {
                // A module is no value: a lone name is a local.
                Some(Found::Child(child)) if path.len() > 1 => self.walk(child, &path[1..], depth),
                Some(Found::Child(_)) => None,
                Some(Found::Item(at)) => Some(Target::Crate {
                    module: at,
                    item: Some(first.to_string()),
                }),
                Some(Found::Bound(at, bound)) => self.follow(&at, bound, &path[1..], depth),
                // Another crate; a lone name or a capital is a local, a
                // prelude name, `Self` or a type parameter.
                None if path.len() > 1 && first.starts_with(|c: char| c.is_lowercase()) => {
                    Some(Target::External(path.to_vec()))
                }
                None => None,
            },
        }
    }

    /// The path a `use` binding names, followed by `rest`.
    fn follow(
        &self,
        at: &ModulePath,
        mut bound: Vec<String>,
        rest: &[String],
        depth: usize,
    ) -> Option<Target> {
        let outside = bound.len() == 1; // `use serde_json;`
        bound.extend(rest.iter().cloned());
        if outside {
            return Some(Target::External(bound));
        }
        self.resolve(at, &bound, depth + 1)
    }

    /// What `name` is in module `at`: a child, an item, a `use` binding,
    /// or one of these in a module a glob of `at` imports.
    fn lookup(&self, at: &ModulePath, name: &str, depth: usize) -> Option<Found> {
        let module = self.modules.get(at)?;
        if module.items.contains(name) {
            // Modules are items too.
            let mut child = at.clone();
            child.push(name.to_string());
            return Some(if self.modules.contains_key(&child) {
                Found::Child(child)
            } else {
                Found::Item(at.clone())
            });
        }
        if let Some(bound) = module.uses.get(name) {
            return Some(Found::Bound(at.clone(), bound.clone()));
        }
        if depth > 32 {
            return None;
        }
        module
            .globs
            .iter()
            .find_map(|glob| match self.resolve(at, glob, depth + 1)? {
                Target::Crate { module, item: None } => self.lookup(&module, name, depth + 1),
                _ => None,
            })
    }

    /// Walks `rest` down from module `at`; a name found nowhere is taken
    /// to be made in `at` (by a macro, say).
    fn walk(&self, mut at: ModulePath, rest: &[String], depth: usize) -> Option<Target> {
        for (i, name) in rest.iter().enumerate() {
            match self.lookup(&at, name, depth) {
                Some(Found::Child(child)) => at = child,
                Some(Found::Item(module)) => {
                    return Some(Target::Crate {
                        module,
                        item: Some(name.clone()),
                    })
                }
                Some(Found::Bound(module, bound)) => {
                    return self.follow(&module, bound, &rest[i + 1..], depth)
                }
                None => break,
            }
        }
        Some(Target::Crate {
            module: at,
            item: None,
        })
    }
}

/// A room of the module map: a module and everything under it that is not
/// a room of its own.
#[derive(Debug, Clone)]
struct Room {
    /// `control::leases`.
    module: String,
    /// Its floor: 0 is the ground.
    floor: u32,
}

/// Reads the module map: the table of `ARCHITECTURE.md` headed
/// `| floor | module | ... |`, one row per room.
fn read_map(text: &str) -> Vec<Room> {
    let mut rooms = Vec::new();
    let mut in_map = false;
    for line in text.lines() {
        if !line.trim_start().starts_with('|') {
            in_map = false;
            continue;
        }
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        if cells.len() >= 2 && cells[0] == "floor" && cells[1] == "module" {
            in_map = true;
            continue;
        }
        if !in_map || cells[0].starts_with('-') {
            continue;
        }
        let floor = cells[0]
            .parse()
            .unwrap_or_else(|_| panic!("module map row `{line}`: the floor is not a number"));
        for module in cells[1].split(',') {
            let module = module.trim().trim_matches('`').trim_start_matches("src/");
            let module = module
                .trim_end_matches('/')
                .trim_end_matches(".rs")
                .replace('/', "::");
            rooms.push(Room { module, floor });
        }
    }
    rooms
}

/// What breaks the floors.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Problem {
    /// A top-level module the map does not list.
    Unmapped(String),
    /// A room the map lists that is not a module.
    NoSuchModule(String),
    /// A use of a room on a higher floor.
    Upward {
        /// Where.
        edge: Edge,
        /// The rooms, the user's and the used, with their floors.
        rooms: [(String, u32); 2],
    },
    /// Rooms that use one another in a circle, and the uses closing it.
    Cycle(Vec<String>, Vec<Edge>),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Unmapped(module) => write!(
                f,
                "module `{module}` is not in ARCHITECTURE.md's module map: give it a floor"
            ),
            Problem::NoSuchModule(module) => {
                write!(
                    f,
                    "the module map lists `{module}`, which is no module of src/"
                )
            }
            Problem::Upward {
                edge,
                rooms: [(from, floor), (to, above)],
            } => write!(
                f,
                "{}:{}: `{}` in `{}` (room `{from}`, floor {floor}) uses `{}` (room `{to}`, \
                 floor {above}): a floor above",
                edge.file, edge.line, edge.path, edge.from, edge.to
            ),
            Problem::Cycle(rooms, edges) => {
                write!(f, "rooms in a cycle: {}", rooms.join(", "))?;
                for edge in edges {
                    write!(
                        f,
                        "\n  {}:{}: `{}` ({} uses {})",
                        edge.file, edge.line, edge.path, edge.from, edge.to
                    )?;
                }
                Ok(())
            }
        }
    }
}

/// Whether `module` is `room` or inside it.
fn is_in(module: &str, room: &str) -> bool {
    module == room
        || room.is_empty()
        || module
            .strip_prefix(room)
            .is_some_and(|rest| rest.starts_with("::"))
}

/// The room a module belongs to: the longest room of the map it is in.
fn room_of<'a>(rooms: &'a [Room], module: &str) -> Option<&'a Room> {
    rooms
        .iter()
        .filter(|room| is_in(module, &room.module))
        .max_by_key(|room| room.module.len())
}

/// Holds the graph against the map.
fn check(graph: &Graph, rooms: &[Room]) -> Vec<Problem> {
    let mut problems = Vec::new();
    let modules = graph.modules();
    for module in &modules {
        if !module.contains("::")
            && !module.is_empty()
            && !rooms.iter().any(|r| &r.module == module)
        {
            problems.push(Problem::Unmapped(module.clone()));
        }
    }
    for room in rooms {
        if !modules.contains(&room.module) {
            problems.push(Problem::NoSuchModule(room.module.clone()));
        }
    }
    let mut between: BTreeMap<(String, String), Vec<Edge>> = BTreeMap::new();
    for edge in graph.edges() {
        if edge.from.is_empty() {
            // The crate root declares the rooms and re-exports their faces.
            continue;
        }
        let (Some(from), Some(to)) = (room_of(rooms, &edge.from), room_of(rooms, &edge.to)) else {
            continue;
        };
        if from.module == to.module {
            continue;
        }
        if to.floor > from.floor {
            problems.push(Problem::Upward {
                edge: edge.clone(),
                rooms: [
                    (from.module.clone(), from.floor),
                    (to.module.clone(), to.floor),
                ],
            });
        }
        between
            .entry((from.module.clone(), to.module.clone()))
            .or_default()
            .push(edge);
    }
    for cycle in cycles(&between) {
        let edges = between
            .iter()
            .filter(|((a, b), _)| cycle.contains(a) && cycle.contains(b))
            .map(|(_, edges)| edges[0].clone())
            .collect();
        problems.push(Problem::Cycle(cycle, edges));
    }
    problems
}

/// The strongly connected sets of more than one room (Tarjan's algorithm).
fn cycles(between: &BTreeMap<(String, String), Vec<Edge>>) -> Vec<Vec<String>> {
    let nodes: BTreeSet<&String> = between.keys().flat_map(|(a, b)| [a, b]).collect();
    let nodes: Vec<&String> = nodes.into_iter().collect();
    let index_of = |name: &String| nodes.iter().position(|n| *n == name).expect("a node");
    let mut next: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (a, b) in between.keys() {
        next[index_of(a)].push(index_of(b));
    }
    struct Tarjan<'a> {
        next: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        stack: Vec<usize>,
        on_stack: Vec<bool>,
        counter: usize,
        found: Vec<Vec<usize>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: usize) {
            self.index[v] = Some(self.counter);
            self.low[v] = self.counter;
            self.counter += 1;
            self.stack.push(v);
            self.on_stack[v] = true;
            let next = self.next;
            for &w in &next[v] {
                match self.index[w] {
                    None => {
                        self.visit(w);
                        self.low[v] = self.low[v].min(self.low[w]);
                    }
                    Some(index) if self.on_stack[w] => self.low[v] = self.low[v].min(index),
                    Some(_) => {}
                }
            }
            if Some(self.low[v]) == self.index[v] {
                let mut set = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack[w] = false;
                    set.push(w);
                    if w == v {
                        break;
                    }
                }
                if set.len() > 1 {
                    self.found.push(set);
                }
            }
        }
    }
    let mut tarjan = Tarjan {
        next: &next,
        index: vec![None; nodes.len()],
        low: vec![0; nodes.len()],
        stack: Vec::new(),
        on_stack: vec![false; nodes.len()],
        counter: 0,
        found: Vec::new(),
    };
    for v in 0..nodes.len() {
        if tarjan.index[v].is_none() {
            tarjan.visit(v);
        }
    }
    tarjan
        .found
        .into_iter()
        .map(|set| {
            let mut names: Vec<String> = set.into_iter().map(|i| nodes[i].clone()).collect();
            names.sort();
            names
        })
        .collect()
}

/// A place that breaks a rule, and how.
struct Finding {
    at: Place,
    what: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.at, self.what)
    }
}

/// The rooms that send no request and await nothing.
const PURE: [&str; 9] = [
    "record",
    "schema",
    "decode",
    "effect",
    "kinds",
    "spec",
    "plan",
    "invariant",
    "control::status",
];

/// The files of `decode` that convert SDK values.
const SDK_FILES: [&str; 3] = [
    "src/decode/sdk.rs",
    "src/decode/scan.rs",
    "src/decode/streams.rs",
];

/// Crates that do I/O or hold SDK types.
fn is_io_crate(name: &str) -> bool {
    name.starts_with("aws_sdk_")
        || name.starts_with("aws_smithy_")
        || matches!(
            name,
            "aws_config" | "aws_types" | "tokio" | "reqwest" | "hyper" | "lambda_runtime"
        )
}

/// The crates of the SDK values `decode`'s SDK files convert.
fn is_sdk_value_crate(name: &str) -> bool {
    matches!(name, "aws_sdk_dynamodb" | "aws_sdk_dynamodbstreams")
        || name.starts_with("aws_smithy_")
}

/// Where the pure rooms name an I/O or SDK crate, or wait.
fn impurities(graph: &Graph) -> Vec<Finding> {
    let pure = |module: &ModulePath| PURE.iter().any(|room| is_in(&module.join("::"), room));
    let mut found: Vec<Finding> = graph
        .names()
        .filter(|name| pure(&name.at.module))
        .filter_map(|name| {
            let krate = name.target.external_crate()?;
            let allowed = SDK_FILES.contains(&name.at.file.as_str()) && is_sdk_value_crate(krate);
            (is_io_crate(krate) && !allowed).then(|| Finding {
                at: name.at.clone(),
                what: format!(
                    "`{}` names `{krate}` in `{}`, a pure room",
                    name.path,
                    name.module()
                ),
            })
        })
        .collect();
    found.extend(
        graph
            .asyncs
            .iter()
            .filter(|a| pure(&a.at.module))
            .map(|a| Finding {
                at: a.at.clone(),
                what: format!("{} in `{}`, a pure room", a.what, a.at.module.join("::")),
            }),
    );
    found
}

/// The record model's `Item` and `AttributeValue`, which are
/// `serde_dynamo`'s.
fn is_record_value(target: &Target) -> bool {
    matches!(target, Target::External(path)
        if path.len() == 2 && path[0] == "serde_dynamo" && (path[1] == "Item" || path[1] == "AttributeValue"))
}

/// The calls `Item::from(...)` and `AttributeValue::from(...)` of the
/// record model: where, and the argument as written.
fn record_conversions(graph: &Graph) -> Vec<(&Place, &str)> {
    graph
        .from_calls
        .iter()
        .filter(|call| {
            graph
                .resolve(&call.at.module, &call.ty, 0)
                .is_some_and(|target| is_record_value(&target))
        })
        .map(|call| (&call.at, call.arg.as_str()))
        .collect()
}

/// Where `item` of `module` is named other than in a `use` or to be read,
/// by module.
fn named_to_write<'g>(
    graph: &'g Graph,
    module: &[&str],
    item: &str,
) -> BTreeMap<String, Vec<&'g Place>> {
    let mut found: BTreeMap<String, Vec<&Place>> = BTreeMap::new();
    for name in graph.names() {
        let Target::Crate {
            module: defined,
            item: Some(named),
        } = name.target
        else {
            continue;
        };
        if defined == module && named == item && name.context == Context::Code {
            found.entry(name.module()).or_default().push(name.at);
        }
    }
    found
}

/// Where an exit code is named (`std::process::ExitCode`) or made
/// (`std::process::exit`), and the path.
fn exit_codes(graph: &Graph) -> Vec<(&Place, String)> {
    graph
        .names()
        .filter(|name| match name.target {
            Target::External(path) => {
                path.iter().any(|s| s == "ExitCode")
                    || path.ends_with(&["process".into(), "exit".into()])
            }
            Target::Crate { .. } => false,
        })
        .map(|name| (name.at, name.path))
        .collect()
}

/// Renders problems one per line, for a failure's message.
fn listed<T: fmt::Display>(problems: &[T]) -> String {
    problems.iter().map(|p| format!("\n{p}")).collect()
}

/// Files from `(path, text)` pairs.
fn files(list: &[(&str, &str)]) -> BTreeMap<String, String> {
    list.iter()
        .map(|(path, text)| (path.to_string(), text.to_string()))
        .collect()
}

/// A map of three rooms: `a` on the ground, `b` and `c` above it.
const PLANTED_MAP: &str = "\
| floor | module | what it holds |
|---|---|---|
| 0 | `a` | the ground |
| 1 | `b` | above it |
| 1 | `c` | beside `b` |
";

#[test]
fn the_library_holds_to_the_module_map() {
    let text = std::fs::read_to_string(repo_path("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let rooms = read_map(&text);
    assert!(rooms.len() > 20, "the module map reads: {rooms:?}");
    let problems = check(&LIBRARY, &rooms);
    assert!(
        problems.is_empty(),
        "src/ breaks ARCHITECTURE.md's module map:{}",
        listed(&problems)
    );
}

#[test]
fn a_use_of_a_higher_floor_names_its_file_and_line() {
    let graph = graph_of(&files(&[
        ("src/lib.rs", "mod a;\nmod b;\nmod c;\n"),
        (
            "src/a.rs",
            "//! The ground.\n\npub fn up() -> crate::b::Thing {\n    todo!()\n}\n",
        ),
        ("src/b.rs", "pub struct Thing;\n"),
        ("src/c.rs", ""),
    ]));
    let problems = check(&graph, &read_map(PLANTED_MAP));
    assert_eq!(
        listed(&problems),
        "\nsrc/a.rs:3: `crate::b::Thing` in `a` (room `a`, floor 0) uses `b` (room `b`, floor 1): \
         a floor above"
    );
}

#[test]
fn a_cycle_on_one_floor_names_both_rooms_and_the_uses_closing_it() {
    let graph = graph_of(&files(&[
        ("src/lib.rs", "mod a;\nmod b;\nmod c;\n"),
        ("src/a.rs", ""),
        ("src/b.rs", "pub struct X;\n\npub fn f(_: crate::c::Y) {}\n"),
        ("src/c.rs", "pub struct Y;\n\nuse super::b::X;\n"),
    ]));
    let problems = check(&graph, &read_map(PLANTED_MAP));
    assert_eq!(
        listed(&problems),
        "\nrooms in a cycle: b, c\
         \n  src/b.rs:3: `crate::c::Y` (b uses c)\
         \n  src/c.rs:3: `super::b::X` (c uses b)"
    );
}

#[test]
fn super_paths_re_exports_globs_and_block_uses_resolve_to_the_defining_module() {
    let graph = graph_of(&files(&[
        ("src/lib.rs", "mod a;\nmod c;\nmod d;\n"),
        ("src/a/mod.rs", "mod b;\nmod x;\npub use crate::c::Other;\n"),
        ("src/a/x.rs", "pub use crate::c::Thing;\n"),
        (
            "src/a/b.rs",
            "use super::x::Thing;\n\
             use crate::d::*;\n\
             pub fn f(_: super::Other, _: Deep) -> Thing {\n\
             \x20   use crate::c::Thing as T;\n\
             \x20   T::new()\n\
             }\n\
             pub fn g() -> crate::c::Value {\n\
             \x20   todo!()\n\
             }\n",
        ),
        (
            "src/c.rs",
            "pub struct Thing;\npub struct Other;\npub use serde_json::Value;\n",
        ),
        ("src/d.rs", "pub struct Deep;\n"),
    ]));
    let from_b: Vec<(usize, String, String)> = graph
        .names()
        .filter(|name| name.module() == "a::b")
        .filter_map(|name| {
            let to = match name.target {
                Target::Crate { module, .. } if module.len() == 1 => module.join("::"),
                Target::External(path) => path.join("::"),
                Target::Crate { .. } => return None,
            };
            Some((name.at.line, name.path, to))
        })
        .collect();
    let expected = [
        (1, "super::x::Thing", "c"),
        (2, "crate::d", "d"),
        (3, "super::Other", "c"),
        (3, "Deep", "d"),
        (3, "Thing", "c"),
        (4, "crate::c::Thing", "c"),
        (5, "crate::c::Thing::new", "c"),
        (7, "crate::c::Value", "serde_json::Value"),
    ]
    .map(|(line, path, to)| (line, path.to_string(), to.to_string()));
    assert_eq!(from_b, expected);
}

#[test]
fn test_only_code_is_left_out() {
    let graph = graph_of(&files(&[
        ("src/lib.rs", "mod a;\nmod b;\nmod c;\n"),
        (
            "src/a.rs",
            "#[cfg(test)]\n\
             use crate::b::X;\n\
             #[cfg(not(test))]\n\
             use crate::b::Y;\n\
             pub enum E {\n\
             \x20   #[cfg(test)]\n\
             \x20   V(crate::c::Z),\n\
             }\n\
             #[cfg(test)]\n\
             mod tests {\n\
             \x20   use crate::c::Z;\n\
             }\n",
        ),
        ("src/b.rs", "pub struct X;\npub struct Y;\n"),
        ("src/c.rs", "pub struct Z;\n"),
    ]));
    assert!(!graph.modules().contains(&"a::tests".to_string()));
    let problems = check(&graph, &read_map(PLANTED_MAP));
    assert_eq!(
        listed(&problems),
        "\nsrc/a.rs:4: `crate::b::Y` in `a` (room `a`, floor 0) uses `b` (room `b`, floor 1): \
         a floor above"
    );
}

#[test]
fn a_module_missing_from_the_map_and_a_row_naming_no_module_are_reported() {
    let graph = graph_of(&files(&[
        ("src/lib.rs", "mod a;\nmod b;\nmod extra;\n"),
        ("src/a.rs", ""),
        ("src/b.rs", ""),
        ("src/extra.rs", ""),
    ]));
    let problems = check(&graph, &read_map(PLANTED_MAP));
    assert_eq!(
        problems,
        [
            Problem::Unmapped("extra".into()),
            Problem::NoSuchModule("c".into())
        ]
    );
    assert_eq!(
        listed(&problems),
        "\nmodule `extra` is not in ARCHITECTURE.md's module map: give it a floor\
         \nthe module map lists `c`, which is no module of src/"
    );
}

#[test]
fn the_pure_floors_name_no_io_or_sdk_crate_and_await_nothing() {
    let impure = impurities(&LIBRARY);
    assert!(
        impure.is_empty(),
        "the pure floors do I/O or hold SDK types:{}",
        listed(&impure)
    );
    // The check sees the SDK types `decode`'s SDK files may name.
    assert!(LIBRARY.names().any(|name| {
        name.at.file == "src/decode/streams.rs"
            && name.target.external_crate() == Some("aws_sdk_dynamodbstreams")
    }));
}

#[test]
fn an_sdk_type_or_an_await_in_a_pure_floor_is_found() {
    let graph = graph_of(&files(&[
        ("src/lib.rs", "mod decode;\nmod kinds;\nmod apply;\n"),
        (
            "src/decode/mod.rs",
            "mod fast;\nmod sdk;\npub use sdk::Av;\n",
        ),
        (
            "src/decode/sdk.rs",
            "pub use aws_sdk_dynamodb::types::AttributeValue as Av;\n",
        ),
        (
            "src/decode/fast.rs",
            "fn f(_: aws_sdk_dynamodb::types::AttributeValue) {}\n",
        ),
        (
            "src/kinds.rs",
            "use tokio::time::sleep;\n\
             pub async fn wait(_: crate::decode::Av) {\n\
             \x20   sleep(todo!()).await;\n\
             }\n\
             #[cfg(test)]\n\
             mod tests {\n\
             \x20   async fn t() {\n\
             \x20       tokio::task::yield_now().await\n\
             \x20   }\n\
             }\n",
        ),
        (
            "src/apply.rs",
            "async fn write() {\n    tokio::task::yield_now().await\n}\n",
        ),
    ]));
    let found: Vec<String> = impurities(&graph).iter().map(ToString::to_string).collect();
    assert_eq!(
        found,
        [
            "src/decode/fast.rs:1: `aws_sdk_dynamodb::types::AttributeValue` names \
             `aws_sdk_dynamodb` in `decode::fast`, a pure room",
            "src/decode/mod.rs:3: `sdk::Av` names `aws_sdk_dynamodb` in `decode`, a pure room",
            "src/kinds.rs:1: `tokio::time::sleep` names `tokio` in `kinds`, a pure room",
            "src/kinds.rs:2: `crate::decode::Av` names `aws_sdk_dynamodb` in `kinds`, a pure room",
            "src/kinds.rs:3: `sleep` names `tokio` in `kinds`, a pure room",
            "src/kinds.rs:2: async fn in `kinds`, a pure room",
            "src/kinds.rs:3: .await in `kinds`, a pure room",
        ]
    );
}

#[test]
fn sdk_values_become_records_only_in_decode() {
    // `Item::from` and `AttributeValue::from` of the record model outside
    // `decode/sdk.rs`: each converts keys only, or is `decode/scan.rs`'s,
    // which searches its SDK item for `Unknown` values first, as
    // `item_from_sdk` does. A new one of an SDK item goes through
    // `decode::item_from_sdk` instead.
    let key_only_or_searched = [
        ("src/apply/check.rs", "spec.table.key_attributes(&item)"),
        ("src/apply/dlq.rs", "item_key"),
        ("src/apply/reads.rs", "ctx.spec.table.key_attributes(&item)"),
        ("src/backfill/mod.rs", "key.clone()"),
        ("src/decode/scan.rs", "item"),
    ];
    let conversions = record_conversions(&LIBRARY);
    let (in_sdk, elsewhere): (Vec<_>, Vec<_>) = conversions
        .iter()
        .partition(|(at, _)| at.file == "src/decode/sdk.rs");
    assert!(
        !in_sdk.is_empty(),
        "item_from_sdk converts with `Item::from`"
    );
    let unknown: Vec<String> = elsewhere
        .iter()
        .filter(|(at, arg)| !key_only_or_searched.contains(&(at.file.as_str(), *arg)))
        .map(|(at, arg)| format!("{at}: converts `{arg}` into the record model"))
        .collect();
    assert!(
        unknown.is_empty(),
        "conversions into the record model outside decode/sdk.rs (an SDK item goes through \
         decode::item_from_sdk; a key-only one is listed here):{}",
        listed(&unknown)
    );
    // `serde_dynamo` gives the record model its types, never a conversion.
    let functions: Vec<String> = LIBRARY
        .names()
        .filter(|name| name.target.external_crate() == Some("serde_dynamo"))
        .filter(|name| {
            let Target::External(path) = name.target else {
                return false;
            };
            !is_record_value(&Target::External(path[..2.min(path.len())].to_vec()))
        })
        .map(|name| format!("{}: `{}`", name.at, name.path))
        .collect();
    assert!(
        functions.is_empty(),
        "serde_dynamo named for more than its types:{}",
        listed(&functions)
    );
}

#[test]
fn only_the_markers_and_prune_write_counter_records() {
    let writers = named_to_write(&LIBRARY, &["dynamo", "names"], "RECORDS_ATTRIBUTE");
    assert!(
        writers.contains_key("apply::markers"),
        "the markers' writes of `_ddbp#c` are seen: {writers:?}"
    );
    let others: Vec<String> = writers
        .iter()
        .filter(|(module, _)| *module != "apply::markers" && *module != "prune")
        .flat_map(|(module, places)| places.iter().map(move |at| format!("{at}: in `{module}`")))
        .collect();
    assert!(
        others.is_empty(),
        "`RECORDS_ATTRIBUTE` (`_ddbp#c`) named other than to read it, outside apply/markers.rs \
         and prune:{}",
        listed(&others)
    );
    let spelled: Vec<String> = LIBRARY
        .literals
        .iter()
        .filter(|literal| literal.value == "_ddbp#c" && literal.at.file != "src/dynamo/names.rs")
        .map(|literal| literal.at.to_string())
        .collect();
    assert!(
        spelled.is_empty(),
        "`_ddbp#c` spelled out:{}",
        listed(&spelled)
    );
}

#[test]
fn a_counter_record_named_to_write_is_told_from_one_read() {
    let graph = graph_of(&files(&[
        ("src/lib.rs", "mod names;\nmod audit;\n"),
        ("src/names.rs", "pub const RECORDS: &str = \"_ddbp#c\";\n"),
        (
            "src/audit.rs",
            "use crate::names::RECORDS;\n\
             fn f(item: &mut Item, name: &str) {\n\
             \x20   let _ = item.get(RECORDS).is_some() || name == RECORDS;\n\
             \x20   item.insert(RECORDS.to_string(), todo!());\n\
             }\n",
        ),
    ]));
    let writers = named_to_write(&graph, &["names"], "RECORDS");
    let lines: Vec<usize> = writers["audit"].iter().map(|at| at.line).collect();
    assert_eq!(lines, [4]);
}

#[test]
fn only_cli_makes_exit_codes() {
    let elsewhere: Vec<String> = exit_codes(&LIBRARY)
        .into_iter()
        .filter(|(at, _)| at.file != "src/cli/mod.rs")
        .map(|(at, path)| format!("{at}: `{path}`"))
        .collect();
    assert!(
        elsewhere.is_empty(),
        "exit codes are made in cli::exit_code only:{}",
        listed(&elsewhere)
    );
    assert!(
        exit_codes(&LIBRARY)
            .iter()
            .any(|(_, path)| path == "ExitCode::from"),
        "cli::exit_code's codes are seen"
    );
    // The binary returns what `cli::exit_code` gives: it names the type,
    // and makes no code of its own.
    let main = graph_from(&read_sources(), "src/main.rs");
    let made: Vec<String> = exit_codes(&main)
        .into_iter()
        .filter(|(_, path)| !path.ends_with("ExitCode"))
        .map(|(at, path)| format!("{at}: `{path}`"))
        .collect();
    assert!(
        made.is_empty(),
        "main.rs makes an exit code:{}",
        listed(&made)
    );
    assert!(
        !exit_codes(&main).is_empty(),
        "main.rs's `ExitCode` is seen"
    );
}
