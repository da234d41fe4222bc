//! A team's own Lambda function: the shipped `user-service` spec plus one
//! projection written in Rust, served exactly as the shipped bootstrap
//! serves a spec.
//!
//! `email-domains` keeps, for every email address of a user, an item in
//! the address's domain partition: `DOMAIN#example.org / USER#u1#EMAIL#e1`
//! with the address, so that a query of one partition lists a domain's
//! users. It moves when the address moves to another domain and goes with
//! the email.
//!
//! Build and run it as a Lambda bootstrap (`cargo lambda build --release
//! --arm64 --example custom_projection`), with `PROJECTOR_SPEC` naming the
//! spec file in the package, or locally under `cargo lambda watch`.
//! `tests/dynamo/lambda.rs` runs it end to end on DynamoDB Local through
//! the Lambda Runtime API.

use std::sync::Arc;

use ddb_projector::{
    serve_lambda, AttributeValue, ChangeKind, CustomOp, CustomProjection, EntityChange, Image,
    Item, ItemKey, Projector,
};

/// The domain partition of an email address's users.
#[derive(Debug)]
struct EmailDomains;

impl EmailDomains {
    /// Where `address` of email `email_id` of `user` is kept, if it has a
    /// domain.
    fn key(address: &str, user: &str, email_id: &str) -> Option<ItemKey> {
        let domain = address.trim().rsplit_once('@')?.1.to_lowercase();
        (!domain.is_empty()).then(|| {
            ItemKey::new(
                format!("DOMAIN#{domain}"),
                format!("USER#{user}#EMAIL#{email_id}"),
            )
        })
    }
}

impl CustomProjection for EmailDomains {
    fn name(&self) -> &str {
        "email-domains"
    }

    fn source_entity(&self) -> &str {
        "email"
    }

    fn plan(&self, change: &EntityChange<'_>) -> Result<Vec<CustomOp>, String> {
        let user = change.var("userId").ok_or("the key binds no userId")?;
        let email_id = change.var("emailId").ok_or("the key binds no emailId")?;
        let address = |image: Option<&Image>| {
            image.and_then(|i| i.get("email")?.as_str().map(str::to_string))
        };
        let record = change.record;
        let old =
            address(record.old_image.as_ref()).and_then(|a| EmailDomains::key(&a, user, email_id));
        let mut ops = Vec::new();
        let new = match record.kind {
            ChangeKind::Remove => None,
            _ => address(record.new_image.as_ref())
                .map(|a| (EmailDomains::key(&a, user, email_id), a)),
        };
        match new {
            Some((Some(key), address)) => {
                if let Some(old) = old.filter(|old| *old != key) {
                    ops.push(CustomOp::Delete(old));
                }
                let mut item = Item::default();
                item.insert("PK".into(), AttributeValue::S(key.pk.clone()));
                item.insert(
                    "SK".into(),
                    AttributeValue::S(key.sk.clone().unwrap_or_default()),
                );
                item.insert(
                    "address".into(),
                    AttributeValue::S(address.trim().to_string()),
                );
                item.insert("userId".into(), AttributeValue::S(user.to_string()));
                ops.push(CustomOp::Put(item));
            }
            // Removed, or an address without a domain: nothing is kept.
            _ => ops.extend(old.map(CustomOp::Delete)),
        }
        Ok(ops)
    }
}

fn main() -> anyhow::Result<()> {
    serve_lambda(Projector::new().custom(Arc::new(EmailDomains)))
}
