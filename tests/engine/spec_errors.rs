//! Every spec mistake a user makes, each with the message they read.
//!
//! A message names the file, the part of the spec and the fix; all
//! problems of a spec are reported at once.

use std::collections::BTreeMap;
use std::sync::Arc;

use ddb_projector::kinds::denormalize::RawDenormalize;
use ddb_projector::plan::{CustomOp, CustomProjection, EntityChange};
use ddb_projector::record::{AttributeValue, ChangeKind, Item, ItemKey};
use ddb_projector::spec::raw::{RawInvariant, RawProjection};
use ddb_projector::spec::template::lookup;
use ddb_projector::spec::{Spec, SpecBuilder, SpecErrors};
use expect_test::{expect, Expect};
use serde_json::json;

use super::util::{record, render_plan, repo_path, user_service};

/// The table and entities most cases add a projection to.
const BASE: &str = r#"
service = "user-service"

[table]
name = "UserServiceTable"

[entities.profile]
pk = "USER#{userId}"
sk = "PROFILE"

[entities.email]
pk = "USER#{userId}"
sk = "EMAIL#{emailId}"

[entities.follow]
pk = "USER#{followerId}"
sk = "FOLLOWS#{followeeId}"

[entities.followed_by]
pk = "USER#{followeeId}"
sk = "FOLLOWED_BY#{followerId}"
"#;

fn outcome(result: Result<Spec, SpecErrors>) -> String {
    match result {
        Ok(spec) => format!("ok\n{}", spec.summary()),
        Err(errors) => format!("{errors}\n"),
    }
}

fn check(text: &str, expect: Expect) {
    expect.assert_eq(&outcome(Spec::from_toml(text, "spec.toml")));
}

/// `BASE` plus more TOML (usually one `[[projections]]`).
fn check_with(more: &str, expect: Expect) {
    check(&format!("{BASE}\n{more}"), expect);
}

#[test]
fn base_spec_is_valid() {
    check_with(
        "",
        expect![[r#"
            ok
            service user-service - table UserServiceTable (PK PK, SK SK)
            4 entities
              email            USER#{userId} / EMAIL#{emailId}
              follow           USER#{followerId} / FOLLOWS#{followeeId}
              followed_by      USER#{followeeId} / FOLLOWED_BY#{followerId}
              profile          USER#{userId} / PROFILE
            0 projections
        "#]],
    );
}

#[test]
fn invalid_toml_names_the_line() {
    check(
        r#"
service = "user-service"

[table
name = "UserServiceTable"
"#,
        expect![[r#"
            spec.toml: invalid spec TOML: TOML parse error at line 4, column 7
              |
            4 | [table
              |       ^
            unclosed table, expected `]`
        "#]],
    );
}

#[test]
fn unknown_field_in_the_table() {
    check(
        r#"
service = "user-service"

[table]
name = "UserServiceTable"
sortkey = "SK"
"#,
        expect![[r#"
            spec.toml: invalid spec TOML: TOML parse error at line 6, column 1
              |
            6 | sortkey = "SK"
              | ^^^^^^^
            unknown field `sortkey`, expected one of `name`, `partition_key`, `sort_key`, `ttl_attribute`, `gsi`
        "#]],
    );
}

#[test]
fn unknown_field_in_a_projection() {
    // A misspelt `when` must not silently copy from every email.
    check_with(
        r#"
[[projections]]
name = "profile-primary-email"
kind = "denormalize"
source = "email"
target = "profile"
whn = { isPrimary = true }
copy = { email = "{email}" }
"#,
        expect![[r#"
            spec.toml: invalid spec TOML: TOML parse error at line 24, column 1
               |
            24 | [[projections]]
               | ^^^^^^^^^^^^^^^
            unknown field `whn`, expected one of `name`, `source`, `target`, `when`, `copy`
        "#]],
    );
}

#[test]
fn missing_required_field() {
    check_with(
        r#"
[[projections]]
name = "email-keys"
kind = "index-keys"
set = { GSI1PK = "EMAIL#{email}" }
"#,
        expect![[r#"
            spec.toml: invalid spec TOML: TOML parse error at line 24, column 1
               |
            24 | [[projections]]
               | ^^^^^^^^^^^^^^^
            missing field `entity`
        "#]],
    );
}

#[test]
fn unknown_kind() {
    check_with(
        r#"
[[projections]]
name = "email-keys"
kind = "index_keys"
entity = "email"
set = { GSI1PK = "EMAIL#{email}" }
"#,
        expect![[r#"
            spec.toml: invalid spec TOML: TOML parse error at line 26, column 8
               |
            26 | kind = "index_keys"
               |        ^^^^^^^^^^^^
            unknown variant `index_keys`, expected one of `index-keys`, `denormalize`, `inverse-edge`, `counter`, `rollup`, `aggregate`
        "#]],
    );
}

#[test]
fn unknown_entity_suggests_the_closest() {
    check_with(
        r#"
[[projections]]
name = "email-keys"
kind = "index-keys"
entity = "emails"
set = { GSI1PK = "EMAIL#{email}" }

[[projections]]
name = "orders"
kind = "counter"
source = "order"
of = { userId = "{userId}" }
"#,
        expect![[r#"
            spec.toml: projection `email-keys`: unknown entity `emails` (did you mean `email`?)
            spec.toml: projection `orders`: unknown source entity `order` (known: email, follow, followed_by, profile)
            (2 problems)
        "#]],
    );
}

#[test]
fn duplicate_projection_names() {
    check_with(
        r#"
[[projections]]
name = "email-keys"
kind = "index-keys"
entity = "email"
set = { GSI1PK = "EMAIL#{email}" }

[[projections]]
name = "email-keys"
kind = "index-keys"
entity = "email"
set = { GSI1SK = "USER#{userId}" }
"#,
        expect![[r#"
            spec.toml: projection `email-keys`: duplicate projection name; names must be unique in a spec
        "#]],
    );
}

#[test]
fn inverse_edge_target_variable_the_source_does_not_bind() {
    check_with(
        r#"
[entities.follower]
pk = "USER#{userId}"
sk = "FOLLOWER#{followerId}"

[[projections]]
name = "followers"
kind = "inverse-edge"
source = "follow"
target = "follower"
"#,
        expect![[r#"
            spec.toml: projection `followers`: target entity `follower` has key variable(s) `{userId}` that the key of source entity `follow` does not bind (it binds: followerId, followeeId); name the variables alike in both patterns
            spec.toml: projection `followers`: target entity `follower` does not use the source key variable(s) `{followeeId}`: several `follow` items would share one reverse item; put every variable of the source key into the target's key
            (2 problems)
        "#]],
    );
}

#[test]
fn denormalize_onto_its_own_source() {
    check_with(
        r#"
[[projections]]
name = "primary-copy"
kind = "denormalize"
source = "email"
target = "email"
when = { isPrimary = true }
copy = { primaryEmail = "{email}" }
"#,
        expect![[r#"
            spec.toml: projection `primary-copy`: source and target are the same entity: its output would match its own input and loop
        "#]],
    );
}

#[test]
fn index_keys_reading_what_they_write() {
    check_with(
        r#"
[[projections]]
name = "normalize-email"
kind = "index-keys"
entity = "email"
set = { email = "{lower(trim(email))}" }
"#,
        expect![[r#"
            spec.toml: projection `normalize-email`: `email` = `{lower(trim(email))}` reads `email`, which this projection writes: every write would change its own input and loop
        "#]],
    );
}

#[test]
fn loop_between_two_projections() {
    check_with(
        r#"
[[projections]]
name = "followed-by"
kind = "inverse-edge"
source = "follow"
target = "followed_by"

[[projections]]
name = "follows-back"
kind = "inverse-edge"
source = "followed_by"
target = "follow"
"#,
        expect![[r#"
            spec.toml: projection `followed-by`: projections `followed-by` -> `follows-back` form a loop through entity `follow`: each one's output is another's input, so writes would never stop
        "#]],
    );
}

#[test]
fn two_projections_writing_one_attribute() {
    // Each sees the other's value as wrong and writes its own, forever.
    check_with(
        r#"
[[projections]]
name = "email-keys"
kind = "index-keys"
entity = "email"
set = { GSI1PK = "EMAIL#{lower(email)}" }

[[projections]]
name = "email-keys-v2"
kind = "index-keys"
entity = "email"
set = { GSI1PK = "ADDRESS#{lower(email)}" }

[[projections]]
name = "profile-primary-email"
kind = "denormalize"
source = "email"
target = "profile"
when = { isPrimary = true }
copy = { email = "{email}" }

[[projections]]
name = "profile-email-cleanup"
kind = "index-keys"
entity = "profile"
set = { email = "{lower(displayEmail)}" }
"#,
        expect![[r#"
            spec.toml: projection `email-keys-v2`: projections `email-keys` and `email-keys-v2` both write `GSI1PK` on entity `email`: each would overwrite the other's value forever; let one projection own the attribute
            spec.toml: projection `profile-email-cleanup`: projections `profile-primary-email` and `profile-email-cleanup` both write `email` on entity `profile`: each would overwrite the other's value forever; let one projection own the attribute
            (2 problems)
        "#]],
    );
}

#[test]
fn index_keys_reading_each_others_output() {
    check_with(
        r#"
[[projections]]
name = "search-key"
kind = "index-keys"
entity = "email"
set = { searchKey = "S#{normalized}" }

[[projections]]
name = "normalized"
kind = "index-keys"
entity = "email"
set = { normalized = "{lower(searchKey)}" }
"#,
        expect![[r#"
            spec.toml: projection `search-key`: projections `search-key` -> `normalized` -> `search-key` form a loop on entity `email`: each writes an attribute the next one reads, so writes would never stop
        "#]],
    );
}

#[test]
fn index_keys_over_a_denormalized_attribute_are_a_chain_not_a_loop() {
    check_with(
        r#"
[[projections]]
name = "profile-primary-email"
kind = "denormalize"
source = "email"
target = "profile"
when = { isPrimary = true }
copy = { email = "{email}" }

[[projections]]
name = "profile-by-email"
kind = "index-keys"
entity = "profile"
set = { GSI2PK = "EMAIL#{lower(email)}" }

[[projections]]
name = "profile-by-email-sort"
kind = "index-keys"
entity = "profile"
set = { GSI2SK = "{GSI2PK}#{userId}" }
"#,
        expect![[r#"
            ok
            service user-service - table UserServiceTable (PK PK, SK SK)
            4 entities
              email            USER#{userId} / EMAIL#{emailId}
              follow           USER#{followerId} / FOLLOWS#{followeeId}
              followed_by      USER#{followeeId} / FOLLOWED_BY#{followerId}
              profile          USER#{userId} / PROFILE
            3 projections
              profile-primary-email        denormalize   email -> profile when isPrimary = true: email = {email}
              profile-by-email             index-keys    profile: GSI2PK = EMAIL#{lower(email)}
              profile-by-email-sort        index-keys    profile: GSI2SK = {GSI2PK}#{userId}
        "#]],
    );
}

#[test]
fn shard_count_out_of_range() {
    for shards in [0, 101] {
        check_with(
            &format!(
                r#"
[[projections]]
name = "followers"
kind = "counter"
source = "follow"
of = {{ userId = "{{followeeId}}" }}
shards = {shards}
"#
            ),
            match shards {
                0 => expect![[r#"
                    spec.toml: projection `followers`: shards = 0 is out of range: use 1 to 100
                "#]],
                _ => expect![[r#"
                    spec.toml: projection `followers`: shards = 101 is out of range: use 1 to 100
                "#]],
            },
        );
    }
}

#[test]
fn negative_shard_count_is_a_toml_error() {
    check_with(
        r#"
[[projections]]
name = "followers"
kind = "counter"
source = "follow"
of = { userId = "{followeeId}" }
shards = -1
"#,
        expect![[r#"
            spec.toml: invalid spec TOML: TOML parse error at line 24, column 1
               |
            24 | [[projections]]
               | ^^^^^^^^^^^^^^^
            invalid value: integer `-1`, expected u32
        "#]],
    );
}

#[test]
fn unknown_transform() {
    check_with(
        r#"
[[projections]]
name = "email-keys"
kind = "index-keys"
entity = "email"
set = { GSI1PK = "EMAIL#{shout(email)}" }
"#,
        expect![[r#"
            spec.toml: projection `email-keys`: set `GSI1PK` = `EMAIL#{shout(email)}`: unknown transform `shout` (known: lower, upper, trim, pad)
        "#]],
    );
}

#[test]
fn unclosed_brace() {
    check_with(
        r#"
[[projections]]
name = "email-keys"
kind = "index-keys"
entity = "email"
set = { GSI1PK = "EMAIL#{email" }
"#,
        expect![[r#"
            spec.toml: projection `email-keys`: set `GSI1PK` = `EMAIL#{email`: `{` at byte 6 is never closed (write `{{` for a literal brace)
        "#]],
    );
    check(
        &BASE.replace(r#"pk = "USER#{followerId}""#, r#"pk = "USER#{followerId""#),
        expect![[r#"
            spec.toml: entity `follow`: pk `USER#{followerId`: `{` at byte 5 is never closed (write `{{` for a literal brace)
        "#]],
    );
}

#[test]
fn adjacent_variables_in_a_key_pattern() {
    check_with(
        r#"
[entities.membership]
pk = "ORG#{orgId}{userId}"
sk = "MEMBER"
"#,
        expect![[r#"
            spec.toml: entity `membership`: pk `ORG#{orgId}{userId}`: variables `{orgId}` and `{userId}` must be separated by literal text
        "#]],
    );
}

#[test]
fn entities_whose_patterns_overlap() {
    check_with(
        r#"
[entities.user_item]
pk = "USER#{userId}"
sk = "{anything}"
"#,
        expect![[r#"
            spec.toml: entity `user_item`: its key patterns can match the same keys as entity `email`; give one of them a distinct literal prefix
            spec.toml: entity `user_item`: its key patterns can match the same keys as entity `follow`; give one of them a distinct literal prefix
            spec.toml: entity `user_item`: its key patterns can match the same keys as entity `followed_by`; give one of them a distinct literal prefix
            spec.toml: entity `user_item`: its key patterns can match the same keys as entity `profile`; give one of them a distinct literal prefix
            (4 problems)
        "#]],
    );
}

#[test]
fn entity_without_a_sort_key_pattern() {
    check_with(
        r#"
[entities.order]
pk = "ORDER#{orderId}"
"#,
        expect![[r#"
            spec.toml: entity `order`: `sk` is required: the table has the sort key `SK`
        "#]],
    );
}

#[test]
fn condition_value_that_is_an_array() {
    check_with(
        r#"
[[projections]]
name = "profile-primary-email"
kind = "denormalize"
source = "email"
target = "profile"
when = { isPrimary = [true] }
copy = { email = "{email}" }
"#,
        expect![[r#"
            spec.toml: projection `profile-primary-email`: `when.isPrimary` must be a string, number or boolean, not array
        "#]],
    );
}

#[test]
fn counter_of_an_attribute_that_is_not_a_key_variable() {
    check_with(
        r#"
[[projections]]
name = "emails-per-domain"
kind = "counter"
source = "email"
of = { domain = "{domain}" }
"#,
        expect![[r#"
            spec.toml: projection `emails-per-domain`: `of.domain` = `{domain}` reads `domain`, which is not a key variable of `email` (it has: userId, emailId); a counter's target must come from the source key so that removals find it
        "#]],
    );
}

#[test]
fn denormalize_whose_sources_cannot_be_queried_from_the_target() {
    check_with(
        r#"
[entities.email_lookup]
pk = "LOOKUP#{emailId}"
sk = "EMAIL"

[[projections]]
name = "lookup-owner"
kind = "denormalize"
source = "email"
target = "email_lookup"
copy = { owner = "{userId}" }
"#,
        expect![[r#"
            spec.toml: projection `lookup-owner`: the source items must be found by a query on the target's variables, but the pk of `email` (`USER#{userId}`) needs `{userId}` which the target `email_lookup` does not have
        "#]],
    );
}

#[test]
fn setting_a_table_key_attribute() {
    check_with(
        r#"
[[projections]]
name = "email-keys"
kind = "index-keys"
entity = "email"
set = { SK = "EMAIL#{lower(email)}", GSI1PK = "EMAIL#{email}" }
"#,
        expect![[r#"
            spec.toml: projection `email-keys`: set `SK` is a table key attribute; a projection cannot change an item's key
        "#]],
    );
}

#[test]
fn every_mistake_is_reported_at_once() {
    check_with(
        r#"
[entities.order]
pk = "ORDER#{orderId}"

[[projections]]
name = "email-keys"
kind = "index-keys"
entity = "emial"
set = { GSI1PK = "EMAIL#{email}" }

[[projections]]
name = "followers"
kind = "counter"
source = "follow"
of = { userId = "{followeeId}" }
shards = 0

[[projections]]
name = "followed-by"
kind = "inverse-edge"
source = "follow"
target = "followed_by"
copy = { at = "{upper(followedAt}" }

[[projections]]
name = "email-keys"
kind = "index-keys"
entity = "email"
set = { GSI1SK = "USER#{userId}" }
"#,
        expect![[r#"
            spec.toml: entity `order`: `sk` is required: the table has the sort key `SK`
            spec.toml: projection `email-keys`: unknown entity `emial` (did you mean `email`?)
            spec.toml: projection `followers`: shards = 0 is out of range: use 1 to 100
            spec.toml: projection `followed-by`: copy `at` = `{upper(followedAt}`: bad expression `{upper(followedAt}`: missing `)`
            spec.toml: projection `email-keys`: duplicate projection name; names must be unique in a spec
            (5 problems)
        "#]],
    );
}

#[test]
fn missing_file() {
    expect![[r#"
        /nonexistent/projections/user-service.toml: cannot read the spec file: No such file or directory (os error 2)
    "#]]
    .assert_eq(&outcome(Spec::from_file(std::path::Path::new(
        "/nonexistent/projections/user-service.toml",
    ))));
}

#[test]
fn shipped_specs_compile() {
    for (name, expect) in [
        (
            "user-service",
            expect![[r#"
                ok
                service user-service - table UserServiceTable (PK PK, SK SK)
                  index GSI1 (GSI1PK, GSI1SK)
                2 entities
                  email            USER#{userId} / EMAIL#{emailId}
                  profile          USER#{userId} / PROFILE
                2 projections
                  email-gsi1-keys              index-keys    email: GSI1PK = EMAIL#{lower(trim(email))}, GSI1SK = USER#{userId}
                  profile-primary-email        denormalize   email -> profile when isPrimary = true: email = {email}
                3 invariants
                  one-primary-email            exactly-one   exactly one `email` per partition with isPrimary = true
                  primary-email-verified       implies       `email` with isPrimary = true has isVerified = true
                  unique-email-address         unique        `email` GSI1PK = EMAIL#{lower(trim(email))} in GSI1 has one owner
            "#]],
        ),
        (
            "social-service",
            expect![[r#"
                ok
                service social-service - table SocialServiceTable (PK PK, SK SK)
                  index GSI1 (GSI1PK, GSI1SK)
                  ttl attribute ttl
                4 entities
                  achievement      USER#{userId} / ACHIEVEMENT#{badgeId}
                  follow           USER#{followerId} / FOLLOWS#{followeeId}
                  followed_by      USER#{followeeId} / FOLLOWED_BY#{followerId}
                  profile          USER#{userId} / PROFILE
                6 projections
                  followed-by                  inverse-edge  follow -> followed_by: followedAt = {followedAt}
                  followers                    counter       count follow of userId = {followeeId} in 8 shards, marked by followed-by
                  following                    counter       count follow of userId = {followerId} in 4 shards, marked by followed-by
                  followers-count              rollup        profile.followersCount = counter `followers`
                  following-count              rollup        profile.followingCount = counter `following`
                  achievement-leaderboard-keys index-keys    achievement: GSI1PK = TIER#{tier}, GSI1SK = SCORE#{pad(score, 4)}
            "#]],
        ),
        (
            "ads-platform",
            expect![[r#"
                ok
                service ads-platform - table ads-platform (PK PK, SK SK)
                  index GSI1 (GSI1PK, GSI1SK)
                  ttl attribute ttl
                5 entities
                  ad_group         CAMPAIGN#{campaignId} / ADGROUP#{adGroupId}
                  campaign         CAMPAIGN#{campaignId} / METADATA
                  performance      CAMPAIGN#{campaignId} / PERF#{date}
                  profile          PROFILE#{profileId} / METADATA
                  profile_campaign PROFILE#{profileId} / CAMPAIGN#{campaignId}
                2 projections
                  campaign-gsi1-keys           index-keys    campaign: GSI1PK = PROFILE#{profileId}, GSI1SK = STATUS#{status}#CAMPAIGN#{campaignId}
                  campaign-totals              aggregate     performance -> campaign: days = count(), firstDate = min(date), lastDate = max(date), totalClicks = sum(clicks), totalImpressions = sum(impressions), totalSpend = sum(spend)
            "#]],
        ),
    ] {
        let path = repo_path(&format!("projections/{name}.toml"));
        expect.assert_eq(&outcome(Spec::from_file(&path)));
    }
}

// ---------------------------------------------------------------------------
// the Rust builder API

fn user_service_builder() -> SpecBuilder {
    SpecBuilder::new("user-service", "UserServiceTable")
        .gsi("GSI1", "GSI1PK", Some("GSI1SK"))
        .entity("profile", "USER#{userId}", Some("PROFILE"))
        .entity("email", "USER#{userId}", Some("EMAIL#{emailId}"))
        .index_keys(
            "email-gsi1-keys",
            "email",
            [
                ("GSI1PK", "EMAIL#{lower(trim(email))}"),
                ("GSI1SK", "USER#{userId}"),
            ],
        )
        .projection(RawProjection::Denormalize(RawDenormalize {
            name: "profile-primary-email".to_string(),
            source: "email".to_string(),
            target: "profile".to_string(),
            when: BTreeMap::from([("isPrimary".to_string(), toml::Value::Boolean(true))]),
            copy: BTreeMap::from([("email".to_string(), "{email}".to_string())]),
        }))
        .invariant(RawInvariant::ExactlyOne {
            name: "one-primary-email".to_string(),
            entity: "email".to_string(),
            when: BTreeMap::from([("isPrimary".to_string(), toml::Value::Boolean(true))]),
            repair: None,
        })
        .invariant(RawInvariant::Implies {
            name: "primary-email-verified".to_string(),
            entity: "email".to_string(),
            premise: BTreeMap::from([("isPrimary".to_string(), toml::Value::Boolean(true))]),
            then: BTreeMap::from([("isVerified".to_string(), toml::Value::Boolean(true))]),
        })
        .invariant(RawInvariant::Unique {
            name: "unique-email-address".to_string(),
            entity: "email".to_string(),
            index: "GSI1".to_string(),
        })
}

#[test]
fn builder_builds_the_equivalent_of_user_service() {
    let built = user_service_builder().build().unwrap();
    let file = user_service();
    assert_eq!(built.summary(), file.summary());
    for desc in [
        json!({"kind": "INSERT", "pk": "USER#u1", "sk": "EMAIL#e1",
               "new": {"email": "Sam@X.org", "isPrimary": true}}),
        json!({"kind": "MODIFY", "pk": "USER#u1", "sk": "PROFILE",
               "old": {"email": "sam@x.org"}, "new": {"email": "typo@x.org"}}),
        json!({"kind": "REMOVE", "pk": "USER#u1", "sk": "EMAIL#e2",
               "old": {"email": "b@x.org", "isPrimary": false}}),
        json!({"kind": "INSERT", "pk": "USER#u1", "sk": "EMAIL#e3", "new": {}}),
    ] {
        let change = record(desc);
        assert_eq!(
            render_plan(&built, &change, None),
            render_plan(file, &change, None)
        );
    }
}

/// Problems without the file label, which differs between the two paths.
fn problems(errors: SpecErrors) -> Vec<String> {
    errors
        .0
        .into_iter()
        .map(|error| format!("{}: {}", error.context, error.problem))
        .collect()
}

#[test]
fn builder_reports_the_same_errors_as_a_file() {
    let built = user_service_builder()
        .index_keys("bad", "emails", [("SK", "{email}")])
        .build()
        .unwrap_err();
    let text = std::fs::read_to_string(repo_path("projections/user-service.toml")).unwrap();
    let file = Spec::from_toml(
        &(text
            + r#"
[[projections]]
name = "bad"
kind = "index-keys"
entity = "emails"
set = { SK = "{email}" }
"#),
        "user-service.toml",
    )
    .unwrap_err();
    expect![[r#"
        <spec user-service built in code>: projection `bad`: unknown entity `emails` (did you mean `email`?)
    "#]]
    .assert_eq(&format!("{built}\n"));
    assert_eq!(problems(built), problems(file));
}

// ---------------------------------------------------------------------------
// projections written in Rust

/// Keeps an audit item per email address: put on insert and modify,
/// deleted with the email.
#[derive(Debug)]
struct EmailAudit;

impl CustomProjection for EmailAudit {
    fn name(&self) -> &str {
        "email-audit"
    }

    fn source_entity(&self) -> &str {
        "email"
    }

    fn plan(&self, change: &EntityChange<'_>) -> Result<Vec<CustomOp>, String> {
        let user = lookup(change.vars, "userId").ok_or("no userId")?;
        let email_id = lookup(change.vars, "emailId").ok_or("no emailId")?;
        let key = ItemKey::new(format!("AUDIT#{user}"), format!("EMAIL#{email_id}"));
        if change.record.kind == ChangeKind::Remove {
            return Ok(vec![CustomOp::Delete(key)]);
        }
        let image = change.record.new_image.as_ref().ok_or("no new image")?;
        let address = image
            .get("email")
            .ok_or_else(|| "the email has no `email` attribute".to_string())?;
        let mut item = Item::default();
        item.insert("PK".to_string(), AttributeValue::S(key.pk));
        item.insert("SK".to_string(), AttributeValue::S(key.sk.unwrap()));
        item.insert("address".to_string(), address.to_value());
        Ok(vec![CustomOp::Put(item)])
    }
}

fn audited() -> Spec {
    user_service_builder()
        .custom(Arc::new(EmailAudit))
        .build()
        .unwrap()
}

#[test]
fn custom_projection_plans_puts_and_deletes() {
    let spec = audited();
    let plans: String = [
        json!({"kind": "INSERT", "pk": "USER#u1", "sk": "EMAIL#e1",
               "new": {"email": "sam@x.org", "isPrimary": false}}),
        json!({"kind": "REMOVE", "pk": "USER#u1", "sk": "EMAIL#e1",
               "old": {"email": "sam@x.org", "isPrimary": false}}),
        json!({"kind": "INSERT", "pk": "USER#u1", "sk": "EMAIL#e2", "new": {"isPrimary": false}}),
    ]
    .into_iter()
    .map(|desc| render_plan(&spec, &record(desc), None))
    .collect();
    expect![[r#"
        {"if":{"email":"sam@x.org"},"key":{"PK":"USER#u1","SK":"EMAIL#e1"},"op":"set","projection":"email-gsi1-keys","set":{"GSI1PK":"EMAIL#sam@x.org","GSI1SK":"USER#u1"}}
        {"item":{"PK":"AUDIT#u1","SK":"EMAIL#e1","address":"sam@x.org"},"key":{"PK":"AUDIT#u1","SK":"EMAIL#e1"},"op":"put","projection":"email-audit"}
        {"key":{"PK":"AUDIT#u1","SK":"EMAIL#e1"},"op":"delete","projection":"email-audit"}
        error: projection `email-gsi1-keys`: attribute `email` is missing
        error: projection `email-audit`: the email has no `email` attribute
    "#]]
    .assert_eq(&plans);
    let summary = spec.summary();
    assert!(
        summary.contains("email-audit") && summary.contains("custom"),
        "{summary}"
    );
}

#[test]
fn custom_projection_mistakes() {
    #[derive(Debug)]
    struct Named(&'static str, &'static str);
    impl CustomProjection for Named {
        fn name(&self) -> &str {
            self.0
        }
        fn source_entity(&self) -> &str {
            self.1
        }
        fn plan(&self, _: &EntityChange<'_>) -> Result<Vec<CustomOp>, String> {
            Ok(Vec::new())
        }
    }
    let errors = user_service_builder()
        .custom(Arc::new(Named("audit", "emial")))
        .custom(Arc::new(Named("email-gsi1-keys", "email")))
        .build()
        .unwrap_err();
    expect![[r#"
        <spec user-service built in code>: projection `audit`: unknown entity `emial` (did you mean `email`?)
        <spec user-service built in code>: projection `email-gsi1-keys`: duplicate projection name; names must be unique in a spec
        (2 problems)
    "#]]
    .assert_eq(&format!("{errors}\n"));
}

#[test]
fn a_counted_edge_may_not_copy_the_ttl_attribute() {
    // TTL would delete the edge without moving the counters it carries.
    let base = BASE.replace(
        "name = \"UserServiceTable\"",
        "name = \"UserServiceTable\"\nttl_attribute = \"ttl\"",
    );
    let edge = r#"
[[projections]]
name = "followed-by"
kind = "inverse-edge"
source = "follow"
target = "followed_by"
copy = { ttl = "{ttl}" }
"#;
    let counter = r#"
[[projections]]
name = "followers"
kind = "counter"
source = "follow"
of = { userId = "{followeeId}" }
"#;
    check(
        &format!("{base}{edge}{counter}"),
        expect![[r#"
            spec.toml: projection `followed-by`: writes the table's TTL attribute `ttl` onto the reverse items of `followed-by`, which counter(s) `followers` record their membership on: TTL would delete them without moving the counters; do not write `ttl` there, or give the counters another `when`
        "#]],
    );
    // Without a counter on it, an edge may expire with its source.
    assert!(Spec::from_toml(&format!("{base}{edge}"), "spec.toml").is_ok());
}

/// The event filters of a projector count its projections written in
/// Rust: a record of an entity only a custom projection uses must reach
/// the function, which `ddb-projector filters --spec` alone cannot know.
#[test]
fn an_embedded_projectors_filters_let_its_rust_projections_records_through() {
    #[derive(Debug)]
    struct Orders;
    impl CustomProjection for Orders {
        fn name(&self) -> &str {
            "order-audit"
        }
        fn source_entity(&self) -> &str {
            "order"
        }
        fn plan(&self, _: &EntityChange<'_>) -> Result<Vec<CustomOp>, String> {
            Ok(Vec::new())
        }
    }
    let spec = r#"
service = "shop"
[table]
name = "Shop"
gsi = [{ name = "GSI1", partition_key = "GSI1PK", sort_key = "GSI1SK" }]
[entities]
user = { pk = "USER#{userId}", sk = "PROFILE" }
order = { pk = "ORDER#{orderId}", sk = "META" }
[[projections]]
name = "users-by-name"
kind = "index-keys"
entity = "user"
set = { GSI1PK = "NAME#{name}", GSI1SK = "USER#{userId}" }
"#;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shop.toml");
    std::fs::write(&path, spec).unwrap();
    let alone = ddb_projector::Projector::new()
        .spec(&path)
        .filters()
        .unwrap()
        .to_string();
    let with = ddb_projector::Projector::new()
        .spec(&path)
        .custom(Arc::new(Orders))
        .filters()
        .unwrap()
        .to_string();
    assert!(
        alone.contains("USER#") && !alone.contains("ORDER#"),
        "{alone}"
    );
    assert!(with.contains("USER#") && with.contains("ORDER#"), "{with}");
}

/// A projector embedded in a team's binary joins its projections written
/// in Rust to the spec of the table with their source entity, checked with
/// it; one whose entity no spec has is named with the entities there are.
#[test]
fn an_embedded_projector_joins_its_rust_projections_to_the_spec() {
    #[derive(Debug)]
    struct Named(&'static str, &'static str);
    impl CustomProjection for Named {
        fn name(&self) -> &str {
            self.0
        }
        fn source_entity(&self) -> &str {
            self.1
        }
        fn plan(&self, _: &EntityChange<'_>) -> Result<Vec<CustomOp>, String> {
            Ok(Vec::new())
        }
    }
    let spec = repo_path("projections/user-service.toml");
    let set = ddb_projector::Projector::new()
        .spec(&spec)
        .custom(Arc::new(Named("domains", "email")))
        .load()
        .unwrap();
    let names: Vec<&str> = set.specs()[0]
        .projections
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    assert!(
        names.contains(&"domains") && names.contains(&"email-gsi1-keys"),
        "{names:?}"
    );

    let errors = ddb_projector::Projector::new()
        .spec(&spec)
        .custom(Arc::new(Named("domains", "emial")))
        .custom(Arc::new(Named("email-gsi1-keys", "email")))
        .load()
        .unwrap_err()
        .to_string();
    assert!(
        errors.contains(
            "user-service.toml: custom projection `domains`: no spec describes its source entity `emial` (entities: email, profile)"
        ),
        "{errors}"
    );
    assert!(errors.contains("duplicate projection name"), "{errors}");
}

#[test]
fn derived_attributes_may_not_use_the_reserved_prefix() {
    check_with(
        r#"
[[projections]]
name = "followed-by"
kind = "inverse-edge"
source = "follow"
target = "followed_by"
copy = { "_ddbp#c#followers" = "{followedAt}" }
"#,
        expect![[r#"
            spec.toml: projection `followed-by`: copy `_ddbp#c#followers`: attribute names starting with `_ddbp#` are the projector's own (counter records); choose another name
        "#]],
    );
}

#[test]
fn an_inverse_edge_needs_one_reverse_item_per_source_item() {
    check_with(
        r#"
[entities.fan]
pk = "USER#{followeeId}"
sk = "FANS"

[[projections]]
name = "fans"
kind = "inverse-edge"
source = "follow"
target = "fan"
"#,
        expect![[r#"
            spec.toml: projection `fans`: target entity `fan` does not use the source key variable(s) `{followerId}`: several `follow` items would share one reverse item; put every variable of the source key into the target's key
        "#]],
    );
}

#[test]
fn two_inverse_edges_may_not_keep_the_same_reverse_items() {
    check_with(
        r#"
[[projections]]
name = "followed-by"
kind = "inverse-edge"
source = "follow"
target = "followed_by"

[[projections]]
name = "close-friends"
kind = "inverse-edge"
source = "follow"
target = "followed_by"
when = { close = true }
"#,
        expect![[r#"
            spec.toml: projection `close-friends`: projections `followed-by` and `close-friends` both keep the reverse items of entity `followed_by`: each would delete the other's; give each inverse edge a target entity of its own
        "#]],
    );
}

#[test]
fn no_projection_may_write_the_ttl_attribute_onto_counted_reverse_items() {
    let base = BASE.replace(
        "name = \"UserServiceTable\"",
        "name = \"UserServiceTable\"\nttl_attribute = \"ttl\"",
    );
    check(
        &format!(
            r#"{base}
[[projections]]
name = "followed-by"
kind = "inverse-edge"
source = "follow"
target = "followed_by"

[[projections]]
name = "followers"
kind = "counter"
source = "follow"
of = {{ userId = "{{followeeId}}" }}

[[projections]]
name = "edge-expiry"
kind = "denormalize"
source = "follow"
target = "followed_by"
copy = {{ ttl = "{{expiresAt}}" }}
"#
        ),
        expect![[r#"
            spec.toml: projection `edge-expiry`: writes the table's TTL attribute `ttl` onto the reverse items of `followed-by`, which counter(s) `followers` record their membership on: TTL would delete them without moving the counters; do not write `ttl` there, or give the counters another `when`
        "#]],
    );
}

#[test]
fn a_counter_name_may_not_contain_a_hash() {
    check_with(
        r#"
[[projections]]
name = "followers#v2"
kind = "counter"
source = "follow"
of = { userId = "{followeeId}" }
"#,
        expect![[r#"
            spec.toml: projection `followers#v2`: a counter's name must not contain `#`: it separates the parts of its shard and marker keys
        "#]],
    );
}

#[test]
fn a_projection_name_may_not_contain_a_tilde() {
    check_with(
        r#"
[[projections]]
name = "followers~1"
kind = "counter"
source = "follow"
of = { userId = "{followeeId}" }
"#,
        expect![[r#"
            spec.toml: projection `followers~1`: a projection's name must not contain `~`: the tool names a counter's versions with it
        "#]],
    );
}

#[test]
fn a_counter_storage_is_one_of_its_own_slots() {
    check_with(
        r#"
[[projections]]
name = "fans"
kind = "counter"
source = "follow"
of = { userId = "{followeeId}" }
storage = "followers"
"#,
        expect![[r#"
            spec.toml: projection `fans`: `storage = "followers"` is not one of this counter's: the tool sets it (to `fans` or `fans~N`); remove it from the file
        "#]],
    );
}
