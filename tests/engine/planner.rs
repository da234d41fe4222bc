//! The planner as data: spec + change record -> planned effects.
//!
//! Each case renders `plan_record`'s result one line each (see
//! `util::render_plan`); `UPDATE_EXPECT=1 cargo test` refreshes the
//! snapshots.

use ddb_projector::plan::{compute_denormalized, plan_record, shard_for};
use ddb_projector::record::{value_to_json, ItemKey};
use ddb_projector::spec::Spec;
use expect_test::{expect, Expect};
use serde_json::{json, Value};

use super::util::{
    ads_platform, inline_spec, item, record, render_plan, social_service, user_service,
};

fn check(spec: &Spec, desc: Value, expect: Expect) {
    expect.assert_eq(&render_plan(spec, &record(desc), None));
}

/// Plans with only the named projections selected.
fn check_selected(spec: &Spec, names: &[&str], desc: Value, expect: Expect) {
    let ids: Vec<usize> = names
        .iter()
        .map(|name| spec.projection_id(name).expect("a projection of the spec"))
        .collect();
    expect.assert_eq(&render_plan(spec, &record(desc), Some(&ids)));
}

// ---------------------------------------------------------------------------
// index-keys: user-service `email-gsi1-keys`

#[test]
fn index_keys_insert_derives_normalized_keys() {
    check(
        user_service(),
        json!({"kind": "INSERT", "pk": "USER#u1", "sk": "EMAIL#e1",
               "new": {"email": "  Sam@Example.ORG ", "isPrimary": false}}),
        expect![[r#"
            {"if":{"email":"  Sam@Example.ORG "},"key":{"PK":"USER#u1","SK":"EMAIL#e1"},"op":"set","projection":"email-gsi1-keys","set":{"GSI1PK":"EMAIL#sam@example.org","GSI1SK":"USER#u1"}}
        "#]],
    );
}

#[test]
fn index_keys_modify_of_the_input_rederives() {
    check(
        user_service(),
        json!({"kind": "MODIFY", "pk": "USER#u1", "sk": "EMAIL#e1",
               "old": {"email": "old@x.org", "isPrimary": false,
                       "GSI1PK": "EMAIL#old@x.org", "GSI1SK": "USER#u1"},
               "new": {"email": "New@x.org", "isPrimary": false,
                       "GSI1PK": "EMAIL#old@x.org", "GSI1SK": "USER#u1"}}),
        expect![[r#"
            {"if":{"email":"New@x.org"},"key":{"PK":"USER#u1","SK":"EMAIL#e1"},"op":"set","projection":"email-gsi1-keys","set":{"GSI1PK":"EMAIL#new@x.org","GSI1SK":"USER#u1"}}
        "#]],
    );
}

#[test]
fn index_keys_modify_that_already_carries_the_derived_values_plans_nothing() {
    // The projector's own write comes back through the stream: the loop guard.
    check(
        user_service(),
        json!({"kind": "MODIFY", "pk": "USER#u1", "sk": "EMAIL#e1",
               "old": {"email": "sam@x.org", "isPrimary": false},
               "new": {"email": "sam@x.org", "isPrimary": false,
                       "GSI1PK": "EMAIL#sam@x.org", "GSI1SK": "USER#u1"}}),
        expect![[r#"
            skip: Unchanged("email"): change to `email` touches nothing a projection reads
        "#]],
    );
}

#[test]
fn index_keys_modify_of_unrelated_attributes_plans_nothing() {
    check(
        user_service(),
        json!({"kind": "MODIFY", "pk": "USER#u1", "sk": "EMAIL#e1",
               "old": {"email": "sam@x.org", "isPrimary": false,
                       "GSI1PK": "EMAIL#sam@x.org", "GSI1SK": "USER#u1"},
               "new": {"email": "sam@x.org", "isPrimary": false, "verifiedAt": "2024-05-01",
                       "GSI1PK": "EMAIL#sam@x.org", "GSI1SK": "USER#u1"}}),
        expect![[r#"
            skip: Unchanged("email"): change to `email` touches nothing a projection reads
        "#]],
    );
}

#[test]
fn index_keys_modify_of_an_item_that_lost_its_derived_values_restores_them() {
    // A writer overwrote the whole item without the derived attributes.
    check(
        user_service(),
        json!({"kind": "MODIFY", "pk": "USER#u1", "sk": "EMAIL#e1",
               "old": {"email": "sam@x.org", "isPrimary": false,
                       "GSI1PK": "EMAIL#sam@x.org", "GSI1SK": "USER#u1"},
               "new": {"email": "sam@x.org", "isPrimary": false}}),
        expect![[r#"
            {"if":{"email":"sam@x.org"},"key":{"PK":"USER#u1","SK":"EMAIL#e1"},"op":"set","projection":"email-gsi1-keys","set":{"GSI1PK":"EMAIL#sam@x.org","GSI1SK":"USER#u1"}}
        "#]],
    );
}

#[test]
fn index_keys_remove_plans_nothing() {
    check(
        user_service(),
        json!({"kind": "REMOVE", "pk": "USER#u1", "sk": "EMAIL#e1",
               "old": {"email": "sam@x.org", "isPrimary": false,
                       "GSI1PK": "EMAIL#sam@x.org", "GSI1SK": "USER#u1"}}),
        expect![[r#"
            skip: Unchanged("email"): change to `email` touches nothing a projection reads
        "#]],
    );
}

#[test]
fn index_keys_missing_input_attribute_is_an_error_naming_it() {
    check(
        user_service(),
        json!({"kind": "INSERT", "pk": "USER#u1", "sk": "EMAIL#e1",
               "new": {"isPrimary": false}}),
        expect![[r#"
            error: projection `email-gsi1-keys`: attribute `email` is missing
        "#]],
    );
}

#[test]
fn index_keys_input_of_the_wrong_type_is_an_error() {
    check(
        user_service(),
        json!({"kind": "INSERT", "pk": "USER#u1", "sk": "EMAIL#e1",
               "new": {"email": {"local": "sam", "domain": "x.org"}, "isPrimary": false}}),
        expect![[r#"
            error: projection `email-gsi1-keys`: attribute `email` is a map (M), expected a string or a number
        "#]],
    );
}

#[test]
fn index_keys_keys_only_record_is_a_missing_image_error() {
    // The denormalize cannot tell whether the new email is primary, so it
    // recomputes; the index keys cannot be derived without the image.
    check(
        user_service(),
        json!({"kind": "INSERT", "pk": "USER#u1", "sk": "EMAIL#e1", "view": "KEYS_ONLY",
               "new": {"email": "sam@x.org"}}),
        expect![[r#"
            {"key":{"PK":"USER#u1","SK":"PROFILE"},"op":"recompute","projection":"profile-primary-email","reads":{"query":{"consistent":true,"pk":"USER#u1","sk_begins_with":"EMAIL#"},"target":{"PK":"USER#u1","SK":"PROFILE"}}}
            error: projection `email-gsi1-keys`: the record has no new image (stream view type KEYS_ONLY); this projection needs NEW_AND_OLD_IMAGES or NEW_IMAGE
        "#]],
    );
}

#[test]
fn index_keys_new_image_only_stream_is_enough() {
    check(
        user_service(),
        json!({"kind": "MODIFY", "pk": "USER#u1", "sk": "EMAIL#e1", "view": "NEW_IMAGE",
               "new": {"email": "sam@x.org", "isPrimary": false,
                       "GSI1PK": "EMAIL#sam@x.org", "GSI1SK": "USER#u1"}}),
        expect![[r#"
            {"key":{"PK":"USER#u1","SK":"PROFILE"},"op":"recompute","projection":"profile-primary-email","reads":{"query":{"consistent":true,"pk":"USER#u1","sk_begins_with":"EMAIL#"},"target":{"PK":"USER#u1","SK":"PROFILE"}}}
        "#]],
    );
}

// index-keys: social-service `achievement-leaderboard-keys`

#[test]
fn leaderboard_keys_pad_the_score() {
    check(
        social_service(),
        json!({"kind": "INSERT", "pk": "USER#u1", "sk": "ACHIEVEMENT#first-post",
               "new": {"tier": "GOLD", "score": 850}}),
        expect![[r#"
            {"if":{"score":850,"tier":"GOLD"},"key":{"PK":"USER#u1","SK":"ACHIEVEMENT#first-post"},"op":"set","projection":"achievement-leaderboard-keys","set":{"GSI1PK":"TIER#GOLD","GSI1SK":"SCORE#0850"}}
        "#]],
    );
}

#[test]
fn leaderboard_keys_follow_a_score_change() {
    check(
        social_service(),
        json!({"kind": "MODIFY", "pk": "USER#u1", "sk": "ACHIEVEMENT#first-post",
               "old": {"tier": "GOLD", "score": 850,
                       "GSI1PK": "TIER#GOLD", "GSI1SK": "SCORE#0850"},
               "new": {"tier": "GOLD", "score": 900,
                       "GSI1PK": "TIER#GOLD", "GSI1SK": "SCORE#0850"}}),
        expect![[r#"
            {"if":{"score":900,"tier":"GOLD"},"key":{"PK":"USER#u1","SK":"ACHIEVEMENT#first-post"},"op":"set","projection":"achievement-leaderboard-keys","set":{"GSI1PK":"TIER#GOLD","GSI1SK":"SCORE#0900"}}
        "#]],
    );
}

#[test]
fn leaderboard_keys_refuse_a_score_too_wide_for_the_pad() {
    check(
        social_service(),
        json!({"kind": "INSERT", "pk": "USER#u1", "sk": "ACHIEVEMENT#first-post",
               "new": {"tier": "GOLD", "score": 12345}}),
        expect![[r#"
            error: projection `achievement-leaderboard-keys`: pad(score, 4): 12345 has more than 4 digits and would sort wrongly
        "#]],
    );
}

#[test]
fn leaderboard_keys_refuse_a_negative_score() {
    check(
        social_service(),
        json!({"kind": "INSERT", "pk": "USER#u1", "sk": "ACHIEVEMENT#first-post",
               "new": {"tier": "GOLD", "score": -3}}),
        expect![[r#"
            error: projection `achievement-leaderboard-keys`: pad(score, 4): `-3` is not a non-negative whole number
        "#]],
    );
}

// index-keys: ads-platform `campaign-gsi1-keys`

#[test]
fn campaign_keys_on_insert() {
    check(
        ads_platform(),
        json!({"kind": "INSERT", "pk": "CAMPAIGN#c1", "sk": "METADATA",
               "new": {"profileId": "p1", "status": "ENABLED", "name": "Spring sale"}}),
        expect![[r#"
            {"if":{"profileId":"p1","status":"ENABLED"},"key":{"PK":"CAMPAIGN#c1","SK":"METADATA"},"op":"set","projection":"campaign-gsi1-keys","set":{"GSI1PK":"PROFILE#p1","GSI1SK":"STATUS#ENABLED#CAMPAIGN#c1"}}
            {"key":{"PK":"CAMPAIGN#c1","SK":"METADATA"},"op":"recompute","projection":"campaign-totals","reads":{"query":{"consistent":true,"pk":"CAMPAIGN#c1","sk_begins_with":"PERF#"},"target":{"PK":"CAMPAIGN#c1","SK":"METADATA"}}}
        "#]],
    );
}

#[test]
fn campaign_keys_follow_a_status_change() {
    check(
        ads_platform(),
        json!({"kind": "MODIFY", "pk": "CAMPAIGN#c1", "sk": "METADATA",
               "old": {"profileId": "p1", "status": "ENABLED",
                       "GSI1PK": "PROFILE#p1", "GSI1SK": "STATUS#ENABLED#CAMPAIGN#c1"},
               "new": {"profileId": "p1", "status": "PAUSED",
                       "GSI1PK": "PROFILE#p1", "GSI1SK": "STATUS#ENABLED#CAMPAIGN#c1"}}),
        expect![[r#"
            {"if":{"profileId":"p1","status":"PAUSED"},"key":{"PK":"CAMPAIGN#c1","SK":"METADATA"},"op":"set","projection":"campaign-gsi1-keys","set":{"GSI1PK":"PROFILE#p1","GSI1SK":"STATUS#PAUSED#CAMPAIGN#c1"}}
            {"key":{"PK":"CAMPAIGN#c1","SK":"METADATA"},"op":"recompute","projection":"campaign-totals","reads":{"query":{"consistent":true,"pk":"CAMPAIGN#c1","sk_begins_with":"PERF#"},"target":{"PK":"CAMPAIGN#c1","SK":"METADATA"}}}
        "#]],
    );
}

#[test]
fn entity_without_projection_is_not_projected() {
    check(
        ads_platform(),
        json!({"kind": "INSERT", "pk": "PROFILE#p1", "sk": "METADATA",
               "new": {"name": "Acme"}}),
        expect![[r#"
            skip: NotProjected("profile"): no projection reads entity `profile`
        "#]],
    );
    check(
        ads_platform(),
        json!({"kind": "INSERT", "pk": "CAMPAIGN#c1", "sk": "ADGROUP#g1",
               "new": {"name": "Shoes"}}),
        expect![[r#"
            skip: NotProjected("ad_group"): no projection reads entity `ad_group`
        "#]],
    );
}

// ---------------------------------------------------------------------------
// aggregate: ads-platform `campaign-totals`

#[test]
fn a_performance_snapshot_recomputes_its_campaigns_totals() {
    check(
        ads_platform(),
        json!({"kind": "INSERT", "pk": "CAMPAIGN#c1", "sk": "PERF#2024-05-01",
               "new": {"clicks": 10, "spend": 1.5}}),
        expect![[r#"
            {"key":{"PK":"CAMPAIGN#c1","SK":"METADATA"},"op":"recompute","projection":"campaign-totals","reads":{"query":{"consistent":true,"pk":"CAMPAIGN#c1","sk_begins_with":"PERF#"},"target":{"PK":"CAMPAIGN#c1","SK":"METADATA"}}}
        "#]],
    );
    // Text where a sum needs a number: the record's dead letter says which.
    check(
        ads_platform(),
        json!({"kind": "INSERT", "pk": "CAMPAIGN#c1", "sk": "PERF#2024-05-02",
               "new": {"spend": "lots"}}),
        expect![[r#"
            error: projection `campaign-totals`: item CAMPAIGN#c1 / PERF#2024-05-02: attribute `spend` is a string (S), but sum(spend) needs a number
        "#]],
    );
    // A change to nothing a total reads plans nothing.
    check(
        ads_platform(),
        json!({"kind": "MODIFY", "pk": "CAMPAIGN#c1", "sk": "PERF#2024-05-01",
               "old": {"clicks": 10, "note": "a"}, "new": {"clicks": 10, "note": "b"}}),
        expect![[r#"
            skip: Unchanged("performance"): change to `performance` touches nothing a projection reads
        "#]],
    );
}

#[test]
fn a_campaign_rewritten_without_its_totals_gets_them_recomputed() {
    // The writer's put left the token out: recompute, even when the old
    // image does not show what the put erased.
    check_selected(
        ads_platform(),
        &["campaign-totals"],
        json!({"kind": "MODIFY", "pk": "CAMPAIGN#c1", "sk": "METADATA",
               "old": {"status": "ENABLED"}, "new": {"status": "ENABLED"}}),
        expect![[r#"
            {"key":{"PK":"CAMPAIGN#c1","SK":"METADATA"},"op":"recompute","projection":"campaign-totals","reads":{"query":{"consistent":true,"pk":"CAMPAIGN#c1","sk_begins_with":"PERF#"},"target":{"PK":"CAMPAIGN#c1","SK":"METADATA"}}}
        "#]],
    );
    // An update that keeps the token and the totals plans nothing.
    check_selected(
        ads_platform(),
        &["campaign-totals"],
        json!({"kind": "MODIFY", "pk": "CAMPAIGN#c1", "sk": "METADATA",
               "old": {"status": "ENABLED", "days": 2, "_ddbp#v#campaign-totals": 3},
               "new": {"status": "PAUSED", "days": 2, "_ddbp#v#campaign-totals": 3}}),
        expect![[r#"
            skip: Unchanged("campaign"): change to `campaign` touches nothing a projection reads
        "#]],
    );
}

// ---------------------------------------------------------------------------
// denormalize: user-service `profile-primary-email`

#[test]
fn denormalize_insert_of_a_primary_email_recomputes_the_profile() {
    check(
        user_service(),
        json!({"kind": "INSERT", "pk": "USER#u1", "sk": "EMAIL#e1",
               "new": {"email": "sam@x.org", "isPrimary": true}}),
        expect![[r#"
            {"if":{"email":"sam@x.org"},"key":{"PK":"USER#u1","SK":"EMAIL#e1"},"op":"set","projection":"email-gsi1-keys","set":{"GSI1PK":"EMAIL#sam@x.org","GSI1SK":"USER#u1"}}
            {"key":{"PK":"USER#u1","SK":"PROFILE"},"op":"recompute","projection":"profile-primary-email","reads":{"query":{"consistent":true,"pk":"USER#u1","sk_begins_with":"EMAIL#"},"target":{"PK":"USER#u1","SK":"PROFILE"}}}
        "#]],
    );
}

#[test]
fn denormalize_insert_of_a_secondary_email_leaves_the_profile() {
    check_selected(
        user_service(),
        &["profile-primary-email"],
        json!({"kind": "INSERT", "pk": "USER#u1", "sk": "EMAIL#e2",
               "new": {"email": "other@x.org", "isPrimary": false}}),
        expect![[r#"
            skip: Unchanged("email"): change to `email` touches nothing a projection reads
        "#]],
    );
}

#[test]
fn denormalize_email_becoming_primary_recomputes() {
    check(
        user_service(),
        json!({"kind": "MODIFY", "pk": "USER#u1", "sk": "EMAIL#e2",
               "old": {"email": "other@x.org", "isPrimary": false,
                       "GSI1PK": "EMAIL#other@x.org", "GSI1SK": "USER#u1"},
               "new": {"email": "other@x.org", "isPrimary": true,
                       "GSI1PK": "EMAIL#other@x.org", "GSI1SK": "USER#u1"}}),
        expect![[r#"
            {"key":{"PK":"USER#u1","SK":"PROFILE"},"op":"recompute","projection":"profile-primary-email","reads":{"query":{"consistent":true,"pk":"USER#u1","sk_begins_with":"EMAIL#"},"target":{"PK":"USER#u1","SK":"PROFILE"}}}
        "#]],
    );
}

#[test]
fn denormalize_email_ceasing_to_be_primary_recomputes() {
    check(
        user_service(),
        json!({"kind": "MODIFY", "pk": "USER#u1", "sk": "EMAIL#e1",
               "old": {"email": "sam@x.org", "isPrimary": true,
                       "GSI1PK": "EMAIL#sam@x.org", "GSI1SK": "USER#u1"},
               "new": {"email": "sam@x.org", "isPrimary": false,
                       "GSI1PK": "EMAIL#sam@x.org", "GSI1SK": "USER#u1"}}),
        expect![[r#"
            {"key":{"PK":"USER#u1","SK":"PROFILE"},"op":"recompute","projection":"profile-primary-email","reads":{"query":{"consistent":true,"pk":"USER#u1","sk_begins_with":"EMAIL#"},"target":{"PK":"USER#u1","SK":"PROFILE"}}}
        "#]],
    );
}

#[test]
fn denormalize_primary_email_staying_primary_plans_nothing() {
    check(
        user_service(),
        json!({"kind": "MODIFY", "pk": "USER#u1", "sk": "EMAIL#e1",
               "old": {"email": "sam@x.org", "isPrimary": true,
                       "GSI1PK": "EMAIL#sam@x.org", "GSI1SK": "USER#u1"},
               "new": {"email": "sam@x.org", "isPrimary": true,
                       "GSI1PK": "EMAIL#sam@x.org", "GSI1SK": "USER#u1"}}),
        expect![[r#"
            skip: Unchanged("email"): change to `email` touches nothing a projection reads
        "#]],
    );
}

#[test]
fn denormalize_primary_email_changing_address_recomputes() {
    check(
        user_service(),
        json!({"kind": "MODIFY", "pk": "USER#u1", "sk": "EMAIL#e1",
               "old": {"email": "sam@x.org", "isPrimary": true,
                       "GSI1PK": "EMAIL#sam@x.org", "GSI1SK": "USER#u1"},
               "new": {"email": "sam@y.org", "isPrimary": true,
                       "GSI1PK": "EMAIL#sam@x.org", "GSI1SK": "USER#u1"}}),
        expect![[r#"
            {"if":{"email":"sam@y.org"},"key":{"PK":"USER#u1","SK":"EMAIL#e1"},"op":"set","projection":"email-gsi1-keys","set":{"GSI1PK":"EMAIL#sam@y.org","GSI1SK":"USER#u1"}}
            {"key":{"PK":"USER#u1","SK":"PROFILE"},"op":"recompute","projection":"profile-primary-email","reads":{"query":{"consistent":true,"pk":"USER#u1","sk_begins_with":"EMAIL#"},"target":{"PK":"USER#u1","SK":"PROFILE"}}}
        "#]],
    );
}

#[test]
fn denormalize_secondary_email_changing_address_leaves_the_profile() {
    // Regression: every address change of any email used to recompute the
    // profile (a consistent query), although only a primary can move it.
    check_selected(
        user_service(),
        &["profile-primary-email"],
        json!({"kind": "MODIFY", "pk": "USER#u1", "sk": "EMAIL#e2",
               "old": {"email": "other@x.org", "isPrimary": false},
               "new": {"email": "other@y.org", "isPrimary": false}}),
        expect![[r#"
            skip: Unchanged("email"): change to `email` touches nothing a projection reads
        "#]],
    );
    // Without the old image it might have been the primary.
    check_selected(
        user_service(),
        &["profile-primary-email"],
        json!({"kind": "MODIFY", "pk": "USER#u1", "sk": "EMAIL#e2", "view": "NEW_IMAGE",
               "new": {"email": "other@y.org", "isPrimary": false}}),
        expect![[r#"
            {"key":{"PK":"USER#u1","SK":"PROFILE"},"op":"recompute","projection":"profile-primary-email","reads":{"query":{"consistent":true,"pk":"USER#u1","sk_begins_with":"EMAIL#"},"target":{"PK":"USER#u1","SK":"PROFILE"}}}
        "#]],
    );
}

#[test]
fn denormalize_modify_of_an_unrelated_email_attribute_plans_nothing() {
    check(
        user_service(),
        json!({"kind": "MODIFY", "pk": "USER#u1", "sk": "EMAIL#e1",
               "old": {"email": "sam@x.org", "isPrimary": true,
                       "GSI1PK": "EMAIL#sam@x.org", "GSI1SK": "USER#u1"},
               "new": {"email": "sam@x.org", "isPrimary": true, "verifiedAt": "2024-05-01",
                       "GSI1PK": "EMAIL#sam@x.org", "GSI1SK": "USER#u1"}}),
        expect![[r#"
            skip: Unchanged("email"): change to `email` touches nothing a projection reads
        "#]],
    );
}

#[test]
fn denormalize_remove_of_the_primary_email_recomputes() {
    check(
        user_service(),
        json!({"kind": "REMOVE", "pk": "USER#u1", "sk": "EMAIL#e1",
               "old": {"email": "sam@x.org", "isPrimary": true,
                       "GSI1PK": "EMAIL#sam@x.org", "GSI1SK": "USER#u1"}}),
        expect![[r#"
            {"key":{"PK":"USER#u1","SK":"PROFILE"},"op":"recompute","projection":"profile-primary-email","reads":{"query":{"consistent":true,"pk":"USER#u1","sk_begins_with":"EMAIL#"},"target":{"PK":"USER#u1","SK":"PROFILE"}}}
        "#]],
    );
}

#[test]
fn denormalize_ttl_remove_of_the_primary_email_recomputes() {
    check(
        user_service(),
        json!({"kind": "REMOVE", "pk": "USER#u1", "sk": "EMAIL#e1", "ttl": true,
               "old": {"email": "sam@x.org", "isPrimary": true}}),
        expect![[r#"
            {"key":{"PK":"USER#u1","SK":"PROFILE"},"op":"recompute","projection":"profile-primary-email","reads":{"query":{"consistent":true,"pk":"USER#u1","sk_begins_with":"EMAIL#"},"target":{"PK":"USER#u1","SK":"PROFILE"}}}
        "#]],
    );
}

#[test]
fn denormalize_remove_of_a_secondary_email_plans_nothing() {
    check(
        user_service(),
        json!({"kind": "REMOVE", "pk": "USER#u1", "sk": "EMAIL#e2",
               "old": {"email": "other@x.org", "isPrimary": false,
                       "GSI1PK": "EMAIL#other@x.org", "GSI1SK": "USER#u1"}}),
        expect![[r#"
            skip: Unchanged("email"): change to `email` touches nothing a projection reads
        "#]],
    );
}

#[test]
fn denormalize_remove_without_an_old_image_recomputes() {
    // KEYS_ONLY: whether it was primary is unknown, so the profile is recomputed.
    check(
        user_service(),
        json!({"kind": "REMOVE", "pk": "USER#u1", "sk": "EMAIL#e2", "view": "KEYS_ONLY"}),
        expect![[r#"
            {"key":{"PK":"USER#u1","SK":"PROFILE"},"op":"recompute","projection":"profile-primary-email","reads":{"query":{"consistent":true,"pk":"USER#u1","sk_begins_with":"EMAIL#"},"target":{"PK":"USER#u1","SK":"PROFILE"}}}
        "#]],
    );
}

#[test]
fn denormalize_profile_insert_recomputes_the_profile() {
    check(
        user_service(),
        json!({"kind": "INSERT", "pk": "USER#u1", "sk": "PROFILE",
               "new": {"firstName": "Sam"}}),
        expect![[r#"
            {"key":{"PK":"USER#u1","SK":"PROFILE"},"op":"recompute","projection":"profile-primary-email","reads":{"query":{"consistent":true,"pk":"USER#u1","sk_begins_with":"EMAIL#"},"target":{"PK":"USER#u1","SK":"PROFILE"}}}
        "#]],
    );
}

#[test]
fn denormalize_profile_modify_of_the_copied_attribute_recomputes() {
    // A writer overwrote the denormalized `email`; the recompute puts it back.
    check(
        user_service(),
        json!({"kind": "MODIFY", "pk": "USER#u1", "sk": "PROFILE",
               "old": {"firstName": "Sam", "email": "sam@x.org"},
               "new": {"firstName": "Sam", "email": "typo@x.org"}}),
        expect![[r#"
            {"key":{"PK":"USER#u1","SK":"PROFILE"},"op":"recompute","projection":"profile-primary-email","reads":{"query":{"consistent":true,"pk":"USER#u1","sk_begins_with":"EMAIL#"},"target":{"PK":"USER#u1","SK":"PROFILE"}}}
        "#]],
    );
}

#[test]
fn denormalize_profile_modify_of_other_attributes_plans_nothing() {
    check(
        user_service(),
        json!({"kind": "MODIFY", "pk": "USER#u1", "sk": "PROFILE",
               "old": {"firstName": "Sam", "email": "sam@x.org"},
               "new": {"firstName": "Samuel", "email": "sam@x.org"}}),
        expect![[r#"
            skip: Unchanged("profile"): change to `profile` touches nothing a projection reads
        "#]],
    );
}

#[test]
fn denormalize_profile_remove_plans_nothing() {
    check(
        user_service(),
        json!({"kind": "REMOVE", "pk": "USER#u1", "sk": "PROFILE",
               "old": {"firstName": "Sam", "email": "sam@x.org"}}),
        expect![[r#"
            skip: Unchanged("profile"): change to `profile` touches nothing a projection reads
        "#]],
    );
}

fn denormalized(sources: Value) -> String {
    let spec = user_service();
    let id = spec.projection_id("profile-primary-email").unwrap();
    let Value::Array(sources) = sources else {
        panic!("a list of items")
    };
    let items: Vec<_> = sources.iter().map(item).collect();
    let ddb_projector::spec::ProjectionKind::Denormalize(p) = &spec.projections[id].kind else {
        panic!("profile-primary-email is a denormalize")
    };
    match compute_denormalized(spec, p, &items) {
        Ok(attributes) => attributes
            .iter()
            .map(|(name, value)| match value {
                Some(value) => format!("{name} = {}\n", value_to_json(value)),
                None => format!("{name} removed\n"),
            })
            .collect(),
        Err(error) => format!("error: {error}\n"),
    }
}

#[test]
fn compute_denormalized_without_a_primary_removes_the_attribute() {
    expect![[r#"
        email removed
    "#]]
    .assert_eq(&denormalized(json!([
        {"PK": "USER#u1", "SK": "EMAIL#e1", "email": "a@x.org", "isPrimary": false},
        {"PK": "USER#u1", "SK": "EMAIL#e2", "email": "b@x.org"},
    ])));
    expect![[r#"
        email removed
    "#]]
    .assert_eq(&denormalized(json!([])));
}

#[test]
fn compute_denormalized_copies_the_one_primary() {
    expect![[r#"
        email = "b@x.org"
    "#]]
    .assert_eq(&denormalized(json!([
        {"PK": "USER#u1", "SK": "EMAIL#e1", "email": "a@x.org", "isPrimary": false},
        {"PK": "USER#u1", "SK": "EMAIL#e2", "email": "b@x.org", "isPrimary": true},
        {"PK": "USER#u1", "SK": "PROFILE", "email": "stale@x.org", "isPrimary": true},
    ])));
}

#[test]
fn compute_denormalized_with_two_primaries_picks_the_smallest_sort_key() {
    let sources = json!([
        {"PK": "USER#u1", "SK": "EMAIL#e9", "email": "z@x.org", "isPrimary": true},
        {"PK": "USER#u1", "SK": "EMAIL#e1", "email": "a@x.org", "isPrimary": true},
        {"PK": "USER#u1", "SK": "EMAIL#e5", "email": "m@x.org", "isPrimary": true},
    ]);
    expect![[r#"
        email = "a@x.org"
    "#]]
    .assert_eq(&denormalized(sources.clone()));
    // Whatever order the query returns them in.
    let mut reversed = sources.as_array().unwrap().clone();
    reversed.reverse();
    assert_eq!(denormalized(Value::Array(reversed)), denormalized(sources));
}

#[test]
fn compute_denormalized_primary_without_the_attribute_leaves_it_absent() {
    expect![[r#"
        email removed
    "#]]
    .assert_eq(&denormalized(json!([
        {"PK": "USER#u1", "SK": "EMAIL#e1", "isPrimary": true},
        {"PK": "USER#u1", "SK": "EMAIL#e2", "email": "b@x.org", "isPrimary": false},
    ])));
}

// ---------------------------------------------------------------------------
// inverse-edge + counters: social-service `followed-by`, `followers`, `following`

#[test]
fn follow_insert_puts_the_reverse_edge_and_moves_both_counters() {
    check(
        social_service(),
        json!({"kind": "INSERT", "pk": "USER#alice", "sk": "FOLLOWS#bob",
               "new": {"followedAt": "2024-05-01T10:00:00Z"}}),
        expect![[r#"
            {"counted_in":[{"counter":"followers","key":{"PK":"COUNTER#followers#bob#3","SK":"COUNTER"}},{"counter":"following","key":{"PK":"COUNTER#following#alice#3","SK":"COUNTER"}}],"item":{"PK":"USER#bob","SK":"FOLLOWED_BY#alice","followedAt":"2024-05-01T10:00:00Z"},"key":{"PK":"USER#bob","SK":"FOLLOWED_BY#alice"},"op":"put-if-changed","projection":"followed-by"}
            {"key":{"PK":"USER#bob","SK":"PROFILE"},"op":"recompute","projection":"followers-count","reads":{"consistent":true,"items":[{"PK":"COUNTER#followers#bob#0","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#1","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#2","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#3","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#4","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#5","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#6","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#7","SK":"COUNTER"}],"target":{"PK":"USER#bob","SK":"PROFILE"}}}
            {"key":{"PK":"USER#alice","SK":"PROFILE"},"op":"recompute","projection":"following-count","reads":{"consistent":true,"items":[{"PK":"COUNTER#following#alice#0","SK":"COUNTER"},{"PK":"COUNTER#following#alice#1","SK":"COUNTER"},{"PK":"COUNTER#following#alice#2","SK":"COUNTER"},{"PK":"COUNTER#following#alice#3","SK":"COUNTER"}],"target":{"PK":"USER#alice","SK":"PROFILE"}}}
        "#]],
    );
}

#[test]
fn follow_insert_without_the_copied_attribute_mirrors_its_absence() {
    check(
        social_service(),
        json!({"kind": "INSERT", "pk": "USER#alice", "sk": "FOLLOWS#bob"}),
        expect![[r#"
            {"counted_in":[{"counter":"followers","key":{"PK":"COUNTER#followers#bob#3","SK":"COUNTER"}},{"counter":"following","key":{"PK":"COUNTER#following#alice#3","SK":"COUNTER"}}],"item":{"PK":"USER#bob","SK":"FOLLOWED_BY#alice"},"key":{"PK":"USER#bob","SK":"FOLLOWED_BY#alice"},"op":"put-if-changed","projection":"followed-by"}
            {"key":{"PK":"USER#bob","SK":"PROFILE"},"op":"recompute","projection":"followers-count","reads":{"consistent":true,"items":[{"PK":"COUNTER#followers#bob#0","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#1","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#2","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#3","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#4","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#5","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#6","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#7","SK":"COUNTER"}],"target":{"PK":"USER#bob","SK":"PROFILE"}}}
            {"key":{"PK":"USER#alice","SK":"PROFILE"},"op":"recompute","projection":"following-count","reads":{"consistent":true,"items":[{"PK":"COUNTER#following#alice#0","SK":"COUNTER"},{"PK":"COUNTER#following#alice#1","SK":"COUNTER"},{"PK":"COUNTER#following#alice#2","SK":"COUNTER"},{"PK":"COUNTER#following#alice#3","SK":"COUNTER"}],"target":{"PK":"USER#alice","SK":"PROFILE"}}}
        "#]],
    );
}

#[test]
fn unfollow_deletes_the_reverse_edge_and_moves_both_counters() {
    check(
        social_service(),
        json!({"kind": "REMOVE", "pk": "USER#alice", "sk": "FOLLOWS#bob",
               "old": {"followedAt": "2024-05-01T10:00:00Z"}}),
        expect![[r#"
            {"key":{"PK":"USER#bob","SK":"FOLLOWED_BY#alice"},"op":"delete-if-exists","projection":"followed-by","uncounted_from":[{"counter":"followers","key":{"PK":"COUNTER#followers#bob#3","SK":"COUNTER"}},{"counter":"following","key":{"PK":"COUNTER#following#alice#3","SK":"COUNTER"}}]}
            {"key":{"PK":"USER#bob","SK":"PROFILE"},"op":"recompute","projection":"followers-count","reads":{"consistent":true,"items":[{"PK":"COUNTER#followers#bob#0","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#1","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#2","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#3","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#4","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#5","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#6","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#7","SK":"COUNTER"}],"target":{"PK":"USER#bob","SK":"PROFILE"}}}
            {"key":{"PK":"USER#alice","SK":"PROFILE"},"op":"recompute","projection":"following-count","reads":{"consistent":true,"items":[{"PK":"COUNTER#following#alice#0","SK":"COUNTER"},{"PK":"COUNTER#following#alice#1","SK":"COUNTER"},{"PK":"COUNTER#following#alice#2","SK":"COUNTER"},{"PK":"COUNTER#following#alice#3","SK":"COUNTER"}],"target":{"PK":"USER#alice","SK":"PROFILE"}}}
        "#]],
    );
}

#[test]
fn ttl_expiry_of_a_follow_is_an_unfollow() {
    let spec = social_service();
    let unfollow = json!({"kind": "REMOVE", "pk": "USER#alice", "sk": "FOLLOWS#bob",
                          "old": {"followedAt": "2024-05-01T10:00:00Z"}});
    let mut expired = unfollow.clone();
    expired["ttl"] = json!(true);
    let expired = record(expired);
    assert!(expired.ttl_expiry);
    assert_eq!(
        render_plan(spec, &expired, None),
        render_plan(spec, &record(unfollow), None)
    );
}

#[test]
fn unfollow_on_a_keys_only_stream_still_plans() {
    check(
        social_service(),
        json!({"kind": "REMOVE", "pk": "USER#alice", "sk": "FOLLOWS#bob", "view": "KEYS_ONLY"}),
        expect![[r#"
            {"key":{"PK":"USER#bob","SK":"FOLLOWED_BY#alice"},"op":"delete-if-exists","projection":"followed-by","uncounted_from":[{"counter":"followers","key":{"PK":"COUNTER#followers#bob#3","SK":"COUNTER"}},{"counter":"following","key":{"PK":"COUNTER#following#alice#3","SK":"COUNTER"}}]}
            {"key":{"PK":"USER#bob","SK":"PROFILE"},"op":"recompute","projection":"followers-count","reads":{"consistent":true,"items":[{"PK":"COUNTER#followers#bob#0","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#1","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#2","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#3","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#4","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#5","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#6","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#7","SK":"COUNTER"}],"target":{"PK":"USER#bob","SK":"PROFILE"}}}
            {"key":{"PK":"USER#alice","SK":"PROFILE"},"op":"recompute","projection":"following-count","reads":{"consistent":true,"items":[{"PK":"COUNTER#following#alice#0","SK":"COUNTER"},{"PK":"COUNTER#following#alice#1","SK":"COUNTER"},{"PK":"COUNTER#following#alice#2","SK":"COUNTER"},{"PK":"COUNTER#following#alice#3","SK":"COUNTER"}],"target":{"PK":"USER#alice","SK":"PROFILE"}}}
        "#]],
    );
}

#[test]
fn follow_insert_on_a_keys_only_stream_cannot_copy() {
    check(
        social_service(),
        json!({"kind": "INSERT", "pk": "USER#alice", "sk": "FOLLOWS#bob", "view": "KEYS_ONLY"}),
        expect![[r#"
            error: projection `followed-by`: the record has no new image (stream view type KEYS_ONLY); this projection needs NEW_AND_OLD_IMAGES or NEW_IMAGE
        "#]],
    );
}

#[test]
fn follow_modify_of_the_copied_attribute_updates_the_reverse_edge() {
    check(
        social_service(),
        json!({"kind": "MODIFY", "pk": "USER#alice", "sk": "FOLLOWS#bob",
               "old": {"followedAt": "2024-05-01T10:00:00Z"},
               "new": {"followedAt": "2024-06-01T10:00:00Z"}}),
        expect![[r#"
            {"counted_in":[{"counter":"followers","key":{"PK":"COUNTER#followers#bob#3","SK":"COUNTER"}},{"counter":"following","key":{"PK":"COUNTER#following#alice#3","SK":"COUNTER"}}],"item":{"PK":"USER#bob","SK":"FOLLOWED_BY#alice","followedAt":"2024-06-01T10:00:00Z"},"key":{"PK":"USER#bob","SK":"FOLLOWED_BY#alice"},"op":"put-if-changed","projection":"followed-by"}
            {"key":{"PK":"USER#bob","SK":"PROFILE"},"op":"recompute","projection":"followers-count","reads":{"consistent":true,"items":[{"PK":"COUNTER#followers#bob#0","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#1","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#2","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#3","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#4","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#5","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#6","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#7","SK":"COUNTER"}],"target":{"PK":"USER#bob","SK":"PROFILE"}}}
            {"key":{"PK":"USER#alice","SK":"PROFILE"},"op":"recompute","projection":"following-count","reads":{"consistent":true,"items":[{"PK":"COUNTER#following#alice#0","SK":"COUNTER"},{"PK":"COUNTER#following#alice#1","SK":"COUNTER"},{"PK":"COUNTER#following#alice#2","SK":"COUNTER"},{"PK":"COUNTER#following#alice#3","SK":"COUNTER"}],"target":{"PK":"USER#alice","SK":"PROFILE"}}}
        "#]],
    );
}

#[test]
fn follow_modify_without_its_old_image_may_create_the_edge_and_count_it() {
    // NEW_IMAGE: nothing says the follow existed, so the edge must be there
    // (created and counted if it was not), not only refreshed.
    check(
        social_service(),
        json!({"kind": "MODIFY", "pk": "USER#alice", "sk": "FOLLOWS#bob", "view": "NEW_IMAGE",
               "new": {"followedAt": "2024-06-01T10:00:00Z"}}),
        expect![[r#"
            {"counted_in":[{"counter":"followers","key":{"PK":"COUNTER#followers#bob#3","SK":"COUNTER"}},{"counter":"following","key":{"PK":"COUNTER#following#alice#3","SK":"COUNTER"}}],"item":{"PK":"USER#bob","SK":"FOLLOWED_BY#alice","followedAt":"2024-06-01T10:00:00Z"},"key":{"PK":"USER#bob","SK":"FOLLOWED_BY#alice"},"op":"put-if-changed","projection":"followed-by"}
            {"key":{"PK":"USER#bob","SK":"PROFILE"},"op":"recompute","projection":"followers-count","reads":{"consistent":true,"items":[{"PK":"COUNTER#followers#bob#0","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#1","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#2","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#3","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#4","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#5","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#6","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#7","SK":"COUNTER"}],"target":{"PK":"USER#bob","SK":"PROFILE"}}}
            {"key":{"PK":"USER#alice","SK":"PROFILE"},"op":"recompute","projection":"following-count","reads":{"consistent":true,"items":[{"PK":"COUNTER#following#alice#0","SK":"COUNTER"},{"PK":"COUNTER#following#alice#1","SK":"COUNTER"},{"PK":"COUNTER#following#alice#2","SK":"COUNTER"},{"PK":"COUNTER#following#alice#3","SK":"COUNTER"}],"target":{"PK":"USER#alice","SK":"PROFILE"}}}
        "#]],
    );
}

#[test]
fn follow_modify_of_an_unrelated_attribute_plans_nothing() {
    check(
        social_service(),
        json!({"kind": "MODIFY", "pk": "USER#alice", "sk": "FOLLOWS#bob",
               "old": {"followedAt": "2024-05-01T10:00:00Z"},
               "new": {"followedAt": "2024-05-01T10:00:00Z", "muted": true}}),
        expect![[r#"
            skip: Unchanged("follow"): change to `follow` touches nothing a projection reads
        "#]],
    );
}

#[test]
fn reverse_edges_and_counter_shards_feed_nothing_back() {
    // The projector's own writes come back through the stream.
    check(
        social_service(),
        json!({"kind": "INSERT", "pk": "USER#bob", "sk": "FOLLOWED_BY#alice",
               "new": {"followedAt": "2024-05-01T10:00:00Z"}}),
        expect![[r#"
            skip: NotProjected("followed_by"): no projection reads entity `followed_by`
        "#]],
    );
    check(
        social_service(),
        json!({"kind": "MODIFY", "pk": "COUNTER#followers#bob#3", "sk": "COUNTER",
               "old": {"count": 1}, "new": {"count": 2}}),
        expect![[r#"
            skip: NoEntity: key matches no entity of the spec
        "#]],
    );
}

// inverse-edge with a condition, and a counter that shares its marker

const FRIENDS: &str = r#"
service = "friends"

[table]
name = "Friends"

[entities.request]
pk = "USER#{from}"
sk = "REQUEST#{to}"

[entities.friend]
pk = "USER#{to}"
sk = "FRIEND#{from}"

[[projections]]
name = "friend-of"
kind = "inverse-edge"
source = "request"
target = "friend"
when = { status = "ACCEPTED" }
copy = { since = "{acceptedAt}", from = "{from}" }

[[projections]]
name = "friends"
kind = "counter"
source = "request"
of = { userId = "{to}" }
when = { status = "ACCEPTED" }
shards = 2
"#;

#[test]
fn conditional_edge_insert_outside_the_condition_plans_nothing() {
    check(
        &inline_spec(FRIENDS),
        json!({"kind": "INSERT", "pk": "USER#ann", "sk": "REQUEST#ben",
               "new": {"status": "PENDING"}}),
        expect![[r#"
            skip: Unchanged("request"): change to `request` touches nothing a projection reads
        "#]],
    );
}

#[test]
fn conditional_edge_entering_the_condition_counts_through_the_edge() {
    check(
        &inline_spec(FRIENDS),
        json!({"kind": "MODIFY", "pk": "USER#ann", "sk": "REQUEST#ben",
               "old": {"status": "PENDING"},
               "new": {"status": "ACCEPTED", "acceptedAt": 1714557600}}),
        expect![[r#"
            {"counted_in":[{"counter":"friends","key":{"PK":"COUNTER#friends#ben#1","SK":"COUNTER"}}],"item":{"PK":"USER#ben","SK":"FRIEND#ann","from":"ann","since":1714557600},"key":{"PK":"USER#ben","SK":"FRIEND#ann"},"op":"put-if-changed","projection":"friend-of"}
        "#]],
    );
}

#[test]
fn conditional_edge_leaving_the_condition() {
    check(
        &inline_spec(FRIENDS),
        json!({"kind": "MODIFY", "pk": "USER#ann", "sk": "REQUEST#ben",
               "old": {"status": "ACCEPTED", "acceptedAt": 1714557600},
               "new": {"status": "REVOKED", "acceptedAt": 1714557600}}),
        expect![[r#"
            {"key":{"PK":"USER#ben","SK":"FRIEND#ann"},"op":"delete-if-exists","projection":"friend-of","uncounted_from":[{"counter":"friends","key":{"PK":"COUNTER#friends#ben#1","SK":"COUNTER"}}]}
        "#]],
    );
}

#[test]
fn conditional_edge_staying_outside_the_condition() {
    // The marker is re-asserted absent: harmless, and it heals a marker
    // left behind by a dead-lettered record.
    check(
        &inline_spec(FRIENDS),
        json!({"kind": "MODIFY", "pk": "USER#ann", "sk": "REQUEST#ben",
               "old": {"status": "PENDING"}, "new": {"status": "DECLINED"}}),
        expect![[r#"
            {"key":{"PK":"USER#ben","SK":"FRIEND#ann"},"op":"delete-if-exists","projection":"friend-of","uncounted_from":[{"counter":"friends","key":{"PK":"COUNTER#friends#ben#1","SK":"COUNTER"}}]}
        "#]],
    );
}

#[test]
fn counter_with_the_condition_of_an_edge_uses_it_as_marker() {
    let summary = inline_spec(FRIENDS).summary();
    let line = summary.lines().find(|l| l.contains("counter")).unwrap();
    expect![[r#"
        friends                      counter       count request when status = "ACCEPTED" of userId = {to} in 2 shards, marked by friend-of
    "#]]
    .assert_eq(&format!("{}\n", line.trim()));
}

// ---------------------------------------------------------------------------
// counters with their own marker

const LIKES: &str = r#"
service = "likes"

[table]
name = "Likes"

[entities.post]
pk = "POST#{postId}"
sk = "META"

[entities.like]
pk = "POST#{postId}"
sk = "LIKE#{userId}"

[[projections]]
name = "likes"
kind = "counter"
source = "like"
of = { postId = "{postId}" }
shards = 2

[[projections]]
name = "active-likes"
kind = "counter"
source = "like"
of = { postId = "{postId}" }
when = { active = true }
shards = 1
"#;

#[test]
fn own_marker_counter_counts_an_insert() {
    check(
        &inline_spec(LIKES),
        json!({"kind": "INSERT", "pk": "POST#p1", "sk": "LIKE#u1", "new": {"active": false}}),
        expect![[r#"
            {"counted_in":[{"counter":"likes","key":{"PK":"COUNTER#likes#p1#1","SK":"COUNTER"}}],"item":{"PK":"_ddbp#count#likes#POST#p1","SK":"LIKE#u1"},"key":{"PK":"_ddbp#count#likes#POST#p1","SK":"LIKE#u1"},"op":"put-if-changed","projection":"likes"}
        "#]],
    );
}

#[test]
fn own_marker_counter_entering_its_condition() {
    check(
        &inline_spec(LIKES),
        json!({"kind": "MODIFY", "pk": "POST#p1", "sk": "LIKE#u1",
               "old": {"active": false}, "new": {"active": true}}),
        expect![[r#"
            {"counted_in":[{"counter":"active-likes","key":{"PK":"COUNTER#active-likes#p1#0","SK":"COUNTER"}}],"item":{"PK":"_ddbp#count#active-likes#POST#p1","SK":"LIKE#u1"},"key":{"PK":"_ddbp#count#active-likes#POST#p1","SK":"LIKE#u1"},"op":"put-if-changed","projection":"active-likes"}
        "#]],
    );
}

#[test]
fn own_marker_counter_leaving_its_condition() {
    check(
        &inline_spec(LIKES),
        json!({"kind": "MODIFY", "pk": "POST#p1", "sk": "LIKE#u1",
               "old": {"active": true}, "new": {"active": false}}),
        expect![[r#"
            {"key":{"PK":"_ddbp#count#active-likes#POST#p1","SK":"LIKE#u1"},"op":"delete-if-exists","projection":"active-likes","uncounted_from":[{"counter":"active-likes","key":{"PK":"COUNTER#active-likes#p1#0","SK":"COUNTER"}}]}
        "#]],
    );
}

#[test]
fn own_marker_counter_ignores_unrelated_changes() {
    check(
        &inline_spec(LIKES),
        json!({"kind": "MODIFY", "pk": "POST#p1", "sk": "LIKE#u1",
               "old": {"active": true, "emoji": "+1"}, "new": {"active": true, "emoji": "heart"}}),
        expect![[r#"
            skip: Unchanged("like"): change to `like` touches nothing a projection reads
        "#]],
    );
}

#[test]
fn own_marker_counter_uncounts_a_remove() {
    check(
        &inline_spec(LIKES),
        json!({"kind": "REMOVE", "pk": "POST#p1", "sk": "LIKE#u1", "old": {"active": true}}),
        expect![[r#"
            {"key":{"PK":"_ddbp#count#likes#POST#p1","SK":"LIKE#u1"},"op":"delete-if-exists","projection":"likes","uncounted_from":[{"counter":"likes","key":{"PK":"COUNTER#likes#p1#1","SK":"COUNTER"}}]}
            {"key":{"PK":"_ddbp#count#active-likes#POST#p1","SK":"LIKE#u1"},"op":"delete-if-exists","projection":"active-likes","uncounted_from":[{"counter":"active-likes","key":{"PK":"COUNTER#active-likes#p1#0","SK":"COUNTER"}}]}
        "#]],
    );
}

#[test]
fn own_markers_are_reserved_items() {
    let spec = inline_spec(LIKES);
    let plan = plan_record(
        &spec,
        &record(json!({"kind": "INSERT", "pk": "POST#p1", "sk": "LIKE#u1"})),
        None,
    );
    let marker = match &plan.effects[0].op {
        ddb_projector::plan::Op::Membership { marker, .. } => marker.clone(),
        other => panic!("not a membership: {other:?}"),
    };
    check(
        &spec,
        json!({"kind": "INSERT", "pk": marker.pk, "sk": marker.sk}),
        expect![[r#"
            skip: Reserved: projector bookkeeping item
        "#]],
    );
}

// ---------------------------------------------------------------------------
// records that match nothing, or cannot be planned at all

#[test]
fn unknown_entity_is_skipped() {
    check(
        user_service(),
        json!({"kind": "INSERT", "pk": "ORDER#o1", "sk": "LINE#1", "new": {"qty": 2}}),
        expect![[r#"
            skip: NoEntity: key matches no entity of the spec
        "#]],
    );
}

#[test]
fn reserved_prefix_is_skipped() {
    check(
        user_service(),
        json!({"kind": "INSERT", "pk": "_ddbp#dead-letter#email-gsi1-keys", "sk": "EMAIL#e1",
               "new": {"email": "sam@x.org"}}),
        expect![[r#"
            skip: Reserved: projector bookkeeping item
        "#]],
    );
}

#[test]
fn numeric_partition_key_is_a_bad_key() {
    check(
        user_service(),
        json!({"kind": "INSERT", "keys": {"PK": 42, "SK": "PROFILE"}}),
        expect![[r#"
            error: key attribute `PK` is missing or not a string: the record's keys are `PK` (N), `SK` (S), the spec's table is UserServiceTable (keys PK, SK, strings)
        "#]],
    );
}

#[test]
fn missing_sort_key_is_a_bad_key() {
    check(
        user_service(),
        json!({"kind": "INSERT", "pk": "USER#u1"}),
        expect![[r#"
            error: key attribute `SK` is missing or not a string: the record's keys are `PK` (S), the spec's table is UserServiceTable (keys PK, SK, strings)
        "#]],
    );
}

// ---------------------------------------------------------------------------
// selection: only the named projections plan

#[test]
fn selection_of_the_denormalize_only() {
    check_selected(
        user_service(),
        &["profile-primary-email"],
        json!({"kind": "INSERT", "pk": "USER#u1", "sk": "EMAIL#e1",
               "new": {"email": "sam@x.org", "isPrimary": true}}),
        expect![[r#"
            {"key":{"PK":"USER#u1","SK":"PROFILE"},"op":"recompute","projection":"profile-primary-email","reads":{"query":{"consistent":true,"pk":"USER#u1","sk_begins_with":"EMAIL#"},"target":{"PK":"USER#u1","SK":"PROFILE"}}}
        "#]],
    );
}

#[test]
fn selection_of_the_index_keys_only() {
    check_selected(
        user_service(),
        &["email-gsi1-keys"],
        json!({"kind": "INSERT", "pk": "USER#u1", "sk": "EMAIL#e1",
               "new": {"email": "sam@x.org", "isPrimary": true}}),
        expect![[r#"
            {"if":{"email":"sam@x.org"},"key":{"PK":"USER#u1","SK":"EMAIL#e1"},"op":"set","projection":"email-gsi1-keys","set":{"GSI1PK":"EMAIL#sam@x.org","GSI1SK":"USER#u1"}}
        "#]],
    );
}

#[test]
fn selection_that_no_projection_of_the_entity_is_in() {
    check_selected(
        user_service(),
        &["email-gsi1-keys"],
        json!({"kind": "INSERT", "pk": "USER#u1", "sk": "PROFILE", "new": {"firstName": "Sam"}}),
        expect![[r#"
            skip: NotProjected("profile"): no projection reads entity `profile`
        "#]],
    );
}

/// The counters riding on an edge keep their records on its items: a
/// replay or backfill of the edge alone writes the item whole, and the
/// applier moves a counter only by the records it actually adds or removes.
#[test]
fn selection_of_the_edge_alone_keeps_the_records_its_items_carry() {
    check_selected(
        social_service(),
        &["followed-by"],
        json!({"kind": "INSERT", "pk": "USER#alice", "sk": "FOLLOWS#bob",
               "new": {"followedAt": "2024-05-01T10:00:00Z"}}),
        expect![[r#"
            {"counted_in":[{"counter":"followers","key":{"PK":"COUNTER#followers#bob#3","SK":"COUNTER"}},{"counter":"following","key":{"PK":"COUNTER#following#alice#3","SK":"COUNTER"}}],"item":{"PK":"USER#bob","SK":"FOLLOWED_BY#alice","followedAt":"2024-05-01T10:00:00Z"},"key":{"PK":"USER#bob","SK":"FOLLOWED_BY#alice"},"op":"put-if-changed","projection":"followed-by"}
            {"key":{"PK":"USER#bob","SK":"PROFILE"},"op":"recompute","projection":"followers-count","reads":{"consistent":true,"items":[{"PK":"COUNTER#followers#bob#0","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#1","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#2","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#3","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#4","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#5","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#6","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#7","SK":"COUNTER"}],"target":{"PK":"USER#bob","SK":"PROFILE"}}}
            {"key":{"PK":"USER#alice","SK":"PROFILE"},"op":"recompute","projection":"following-count","reads":{"consistent":true,"items":[{"PK":"COUNTER#following#alice#0","SK":"COUNTER"},{"PK":"COUNTER#following#alice#1","SK":"COUNTER"},{"PK":"COUNTER#following#alice#2","SK":"COUNTER"},{"PK":"COUNTER#following#alice#3","SK":"COUNTER"}],"target":{"PK":"USER#alice","SK":"PROFILE"}}}
        "#]],
    );
}

#[test]
fn selection_of_a_counter_alone_plans_its_marker_edge() {
    check_selected(
        social_service(),
        &["followers"],
        json!({"kind": "INSERT", "pk": "USER#alice", "sk": "FOLLOWS#bob",
               "new": {"followedAt": "2024-05-01T10:00:00Z"}}),
        expect![[r#"
            {"counted_in":[{"counter":"followers","key":{"PK":"COUNTER#followers#bob#3","SK":"COUNTER"}},{"counter":"following","key":{"PK":"COUNTER#following#alice#3","SK":"COUNTER"}}],"item":{"PK":"USER#bob","SK":"FOLLOWED_BY#alice","followedAt":"2024-05-01T10:00:00Z"},"key":{"PK":"USER#bob","SK":"FOLLOWED_BY#alice"},"op":"put-if-changed","projection":"followed-by"}
            {"key":{"PK":"USER#bob","SK":"PROFILE"},"op":"recompute","projection":"followers-count","reads":{"consistent":true,"items":[{"PK":"COUNTER#followers#bob#0","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#1","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#2","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#3","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#4","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#5","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#6","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#7","SK":"COUNTER"}],"target":{"PK":"USER#bob","SK":"PROFILE"}}}
            {"key":{"PK":"USER#alice","SK":"PROFILE"},"op":"recompute","projection":"following-count","reads":{"consistent":true,"items":[{"PK":"COUNTER#following#alice#0","SK":"COUNTER"},{"PK":"COUNTER#following#alice#1","SK":"COUNTER"},{"PK":"COUNTER#following#alice#2","SK":"COUNTER"},{"PK":"COUNTER#following#alice#3","SK":"COUNTER"}],"target":{"PK":"USER#alice","SK":"PROFILE"}}}
        "#]],
    );
}

#[test]
fn selection_of_both_counters_plans_the_edge_once() {
    check_selected(
        social_service(),
        &["following", "followers"],
        json!({"kind": "REMOVE", "pk": "USER#alice", "sk": "FOLLOWS#bob"}),
        expect![[r#"
            {"key":{"PK":"USER#bob","SK":"FOLLOWED_BY#alice"},"op":"delete-if-exists","projection":"followed-by","uncounted_from":[{"counter":"followers","key":{"PK":"COUNTER#followers#bob#3","SK":"COUNTER"}},{"counter":"following","key":{"PK":"COUNTER#following#alice#3","SK":"COUNTER"}}]}
            {"key":{"PK":"USER#bob","SK":"PROFILE"},"op":"recompute","projection":"followers-count","reads":{"consistent":true,"items":[{"PK":"COUNTER#followers#bob#0","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#1","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#2","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#3","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#4","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#5","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#6","SK":"COUNTER"},{"PK":"COUNTER#followers#bob#7","SK":"COUNTER"}],"target":{"PK":"USER#bob","SK":"PROFILE"}}}
            {"key":{"PK":"USER#alice","SK":"PROFILE"},"op":"recompute","projection":"following-count","reads":{"consistent":true,"items":[{"PK":"COUNTER#following#alice#0","SK":"COUNTER"},{"PK":"COUNTER#following#alice#1","SK":"COUNTER"},{"PK":"COUNTER#following#alice#2","SK":"COUNTER"},{"PK":"COUNTER#following#alice#3","SK":"COUNTER"}],"target":{"PK":"USER#alice","SK":"PROFILE"}}}
        "#]],
    );
}

// ---------------------------------------------------------------------------
// counter shards

#[test]
fn shard_for_is_stable() {
    let pinned: Vec<String> = [
        (ItemKey::new("USER#alice", "FOLLOWS#bob"), 8),
        (ItemKey::new("USER#alice", "FOLLOWS#bob"), 4),
        (ItemKey::new("USER#bob", "FOLLOWS#alice"), 8),
        (ItemKey::new("POST#p1", "LIKE#u1"), 100),
        (
            ItemKey {
                pk: "USER#alice".into(),
                sk: None,
            },
            8,
        ),
        (ItemKey::new("USER#alice", "FOLLOWS#bob"), 1),
    ]
    .iter()
    .map(|(key, shards)| format!("{key} in {shards}: {}", shard_for(key, *shards)))
    .collect();
    expect![[r#"
        USER#alice / FOLLOWS#bob in 8: 3
        USER#alice / FOLLOWS#bob in 4: 3
        USER#bob / FOLLOWS#alice in 8: 3
        POST#p1 / LIKE#u1 in 100: 89
        USER#alice in 8: 7
        USER#alice / FOLLOWS#bob in 1: 0
    "#]]
    .assert_eq(&(pinned.join("\n") + "\n"));
}

#[test]
fn shard_for_spreads_keys_over_every_shard() {
    let mut counts = [0u32; 8];
    for n in 0..1000 {
        let key = ItemKey::new(format!("USER#user-{n}"), "FOLLOWS#celebrity");
        let shard = shard_for(&key, 8);
        assert!(shard < 8);
        counts[shard as usize] += 1;
    }
    // Every shard gets a fair part: 125 each on average.
    assert!(counts.iter().all(|&c| c >= 60), "{counts:?}");
}
