//! Bad inputs the planner sees (docs/operations.md, "Bad input, and what you see"):
//! keys that match an entity pattern only partly.
//!
//! A variable takes at least one character and every literal must match
//! exactly, so a partial match is no match: the record is skipped with
//! `Skip::NoEntity` and nothing is written.

use expect_test::{expect, Expect};
use serde_json::{json, Value};

use super::util::{record, render_plan, user_service};

fn check(desc: Value, expect: Expect) {
    expect.assert_eq(&render_plan(user_service(), &record(desc), None));
}

fn email_insert(pk: &str, sk: Option<&str>) -> Value {
    let mut desc = json!({"kind": "INSERT", "pk": pk,
                          "new": {"email": "sam@x.org", "isPrimary": true}});
    if let Some(sk) = sk {
        desc["sk"] = json!(sk);
    }
    desc
}

#[test]
fn a_key_that_matches_an_entity_pattern_only_partly_is_skipped_as_no_entity() {
    // `email` is `USER#{userId}` / `EMAIL#{emailId}`; `profile` is
    // `USER#{userId}` / `PROFILE`.
    for (pk, sk) in [
        ("USER#u1", Some("EMAIL")),      // the sort key lacks the id
        ("USER#u1", Some("EMAIL#")),     // an empty emailId
        ("USER#", Some("EMAIL#e1")),     // an empty userId
        ("USER#", Some("PROFILE")),      // an empty userId on a profile
        ("USERS#u1", Some("EMAIL#e1")),  // a different literal
        ("user#u1", Some("EMAIL#e1")),   // literals are case-sensitive
        ("USER#u1", Some("PROFILE#v2")), // a literal sort key with a suffix
    ] {
        let plan = render_plan(user_service(), &record(email_insert(pk, sk)), None);
        assert_eq!(
            plan, "skip: NoEntity: key matches no entity of the spec\n",
            "PK {pk:?} SK {sk:?}"
        );
    }
    check(
        email_insert("USER#", Some("EMAIL#e1")),
        expect![[r#"
            skip: NoEntity: key matches no entity of the spec
        "#]],
    );
}

#[test]
fn a_key_without_its_sort_key_is_an_error_not_a_skip() {
    // The table has a sort key: a record without one is malformed, and the
    // applier dead-letters it rather than skipping it.
    check(
        email_insert("USER#u1", None),
        expect![[r#"
            error: key attribute `SK` is missing or not a string: the record's keys are `PK` (S), the spec's table is UserServiceTable (keys PK, SK, strings)
        "#]],
    );
}

#[test]
fn a_variable_takes_the_rest_of_the_key_including_separators() {
    // The last variable of a pattern takes everything after its literal,
    // `#` included: this key is an email of user `u1#x`, not a mismatch.
    check(
        email_insert("USER#u1#x", Some("EMAIL#e1")),
        expect![[r#"
            {"if":{"email":"sam@x.org"},"key":{"PK":"USER#u1#x","SK":"EMAIL#e1"},"op":"set","projection":"email-gsi1-keys","set":{"GSI1PK":"EMAIL#sam@x.org","GSI1SK":"USER#u1#x"}}
            {"key":{"PK":"USER#u1#x","SK":"PROFILE"},"op":"recompute","projection":"profile-primary-email","reads":{"query":{"consistent":true,"pk":"USER#u1#x","sk_begins_with":"EMAIL#"},"target":{"PK":"USER#u1#x","SK":"PROFILE"}}}
        "#]],
    );
}
