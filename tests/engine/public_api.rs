//! The library's public face, as a snapshot: what a team's code can name
//! without the `internals` feature (which only this repository's tests
//! turn on). Every other room is `pub(crate)`; a change to the face shows
//! here, to be accepted (`UPDATE_EXPECT=1`) on purpose.

use std::path::Path;

use expect_test::expect;
use quote::ToTokens;

/// Whether attributes gate the item on the `internals` feature.
fn internals_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg") && {
            let tokens = attr.meta.to_token_stream().to_string();
            tokens.contains("\"internals\"") && !tokens.contains("not (feature = \"internals\")")
        }
    })
}

/// The feature gating an item, as ` [cli]`.
fn gate(attrs: &[syn::Attribute]) -> String {
    attrs
        .iter()
        .filter(|attr| attr.path().is_ident("cfg"))
        .map(|attr| {
            let tokens = attr.meta.to_token_stream().to_string();
            format!(" [{}]", tokens.trim_start_matches("cfg").trim())
        })
        .collect()
}

fn tokens(item: &impl ToTokens) -> String {
    item.to_token_stream()
        .to_string()
        .replace(" :: ", "::")
        .replace(" ,", ",")
        .replace("& ", "&")
        .replace(" (", "(")
        .replace("( ", "(")
        .replace(" )", ")")
        .replace(" <", "<")
        .replace("< ", "<")
        .replace(" >", ">")
        .replace(" ;", ";")
}

fn is_pub(vis: &syn::Visibility) -> bool {
    matches!(vis, syn::Visibility::Public(_))
}

/// The public items of one file of the face, one line each.
fn face_of(path: &str, module: &str, lines: &mut Vec<String>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join(path)).expect("the file");
    let file = syn::parse_file(&text).expect("it parses");
    for item in &file.items {
        match item {
            syn::Item::Mod(m) if is_pub(&m.vis) && !internals_only(&m.attrs) => {
                lines.push(format!("mod {module}::{}{}", m.ident, gate(&m.attrs)))
            }
            syn::Item::Use(u) if is_pub(&u.vis) && !internals_only(&u.attrs) => {
                lines.push(format!("{module}: {}{}", tokens(&u.tree), gate(&u.attrs)))
            }
            syn::Item::Fn(f) if is_pub(&f.vis) => {
                lines.push(format!("{module}: {}", tokens(&f.sig)))
            }
            syn::Item::Struct(s) if is_pub(&s.vis) => {
                let public_fields = s.fields.iter().filter(|f| is_pub(&f.vis)).count();
                lines.push(format!(
                    "{module}: struct {} ({public_fields} public fields)",
                    s.ident
                ))
            }
            syn::Item::Impl(i) if i.trait_.is_none() => {
                for inner in &i.items {
                    if let syn::ImplItem::Fn(f) = inner {
                        if is_pub(&f.vis) {
                            lines.push(format!(
                                "{module}: impl {}: {}",
                                tokens(&i.self_ty),
                                tokens(&f.sig)
                            ));
                        }
                    }
                }
            }
            _ => {}
        }
    }
}

#[test]
fn the_public_face_is_the_embedded_projector_and_nothing_else() {
    let mut lines = Vec::new();
    face_of("src/lib.rs", "ddb_projector", &mut lines);
    face_of("src/embed.rs", "ddb_projector::embed", &mut lines);
    expect![[r#"
        mod ddb_projector::embed
        ddb_projector: cli::main as cli_main [(feature = "cli")]
        ddb_projector: embed::{ serve_lambda, AttributeValue, AuditReport, BackfillSummary, ChangeKind, ChangeRecord, Connected, CustomOp, CustomProjection, EntityChange, Image, Item, ItemKey, Pending, Projector, RunSummary, Spec, SpecError, SpecErrors, SpecSet, ValueRef, WaitStatus, Waited, }
        ddb_projector::embed: crate::effect::CustomOp
        ddb_projector::embed: crate::kinds::custom::{ CustomProjection, EntityChange }
        ddb_projector::embed: crate::record::ValueRef
        ddb_projector::embed: crate::record::{ AttributeValue, ChangeKind, ChangeRecord, Image, Item, ItemKey }
        ddb_projector::embed: crate::spec::{ Spec, SpecError, SpecErrors, SpecSet }
        ddb_projector::embed: struct Projector (0 public fields)
        ddb_projector::embed: impl Projector: fn new() -> Projector
        ddb_projector::embed: impl Projector: fn spec(mut self, path : impl AsRef<Path>) -> Projector
        ddb_projector::embed: impl Projector: fn custom(mut self, projection : Arc<dyn CustomProjection>) -> Projector
        ddb_projector::embed: impl Projector: fn table(mut self, table : impl Into<String>) -> Projector
        ddb_projector::embed: impl Projector: fn consumer(mut self, name : impl Into<String>) -> Projector
        ddb_projector::embed: impl Projector: fn home_region(mut self, region : impl Into<String>) -> Projector
        ddb_projector::embed: impl Projector: fn writers_in_home_region(mut self, home_only : bool) -> Projector
        ddb_projector::embed: impl Projector: async fn connect(&self) -> anyhow::Result<Connected>
        ddb_projector::embed: impl Projector: async fn connect_with(&self, config : aws_config::SdkConfig) -> anyhow::Result<Connected>
        ddb_projector::embed: impl Projector: async fn connect_with_client(&self, config : aws_config::SdkConfig, dynamodb : aws_sdk_dynamodb::Client,) -> anyhow::Result<Connected>
        ddb_projector::embed: impl Projector: fn filters(&self) -> Result<serde_json::Value, SpecErrors>
        ddb_projector::embed: impl Projector: fn load(&self) -> Result<SpecSet, SpecErrors>
        ddb_projector::embed: fn serve_lambda(projector : Projector) -> anyhow::Result<()>
        ddb_projector::embed: struct Connected (0 public fields)
        ddb_projector::embed: crate::audit::wait::{ Pending, Status as WaitStatus, Waited }
        ddb_projector::embed: crate::audit::AuditReport
        ddb_projector::embed: crate::backfill::BackfillSummary
        ddb_projector::embed: crate::source::Summary as RunSummary
        ddb_projector::embed: impl Connected: fn table(&self) -> &str
        ddb_projector::embed: impl Connected: async fn run(&self, drain : bool) -> anyhow::Result<Option<RunSummary>>
        ddb_projector::embed: impl Connected: async fn backfill(&self) -> anyhow::Result<BackfillSummary>
        ddb_projector::embed: impl Connected: async fn audit(&self, repair : bool) -> anyhow::Result<AuditReport>
        ddb_projector::embed: impl Connected: async fn wait(&self, key : ItemKey, timeout : std::time::Duration) -> anyhow::Result<Waited>
    "#]].assert_eq(&(lines.join("\n") + "\n"));
}
