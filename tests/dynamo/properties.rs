//! Property tests of the guarantees on DynamoDB Local: random histories of
//! writes to the source items of every shipped spec, turned into the stream
//! they produce (per-item order kept) and delivered through the real planner
//! and applier with random interleavings across items, random batch
//! boundaries, invocations that crash part way and are bisected as Lambda
//! does, batches delivered again from the lowest failed record, checkpoints
//! lost (a tail of the stream delivered again) and a final full replay.
//!
//! After every case the table must hold exactly what the spec computes from
//! the final source items (the oracle in `model.rs`, written apart from the
//! planner), counters exact; nothing is dead-lettered; a full replay changes
//! nothing; the online invariant checks recorded exactly the violations a
//! full audit finds; and the audit finds no drift.
//!
//! proptest shrinks a failing case to a small history and delivery and saves
//! its seed under `tests/dynamo/properties/`; saved seeds run first on every
//! later run (commit them: they are the regression cases).
//! `PROPTEST_CASES` sets the number of cases per spec.

use std::collections::BTreeSet;
use std::sync::Arc;

use aws_sdk_dynamodb::types::AttributeValue as Av;
use ddb_projector::apply::{Applier, ApplyConfig};
use ddb_projector::audit::{audit, AuditOptions, Problem};
use ddb_projector::control;
use ddb_projector::spec::Spec;
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};

use super::delivery::{apply, deliver, delivery, runtime, snapshot, Delivery, Writer};
use super::model::{achievement, attrs, campaign, check_derived, Attrs, History};
use super::support::{self, s};

/// Cases per spec unless `PROPTEST_CASES` says otherwise.
const CASES: u32 = 10;

// ------------------------------------------------------------ histories ---

/// One writer's action. Indexes are small so that actions collide on the
/// same items and partitions.
#[derive(Debug, Clone)]
enum Op {
    /// Follow `b` (user 0 is the hot one); when already followed, unfollow
    /// or follow again (a new `followedAt`).
    Follow {
        a: u8,
        b: u8,
        unfollow: bool,
    },
    Achieve {
        user: u8,
        badge: u8,
        tier: u8,
        score: u16,
    },
    DropAchievement {
        user: u8,
        badge: u8,
    },
    /// A new email, not primary.
    AddEmail {
        user: u8,
        email: u8,
        address: u8,
        verified: bool,
    },
    /// Switch the primary: two plain writes, in either order (so that for a
    /// while there are two primaries, or none).
    SwitchPrimary {
        user: u8,
        email: u8,
        old_first: bool,
    },
    /// Set `isPrimary` without clearing the old primary (a buggy writer:
    /// a violation that stays).
    AlsoPrimary {
        user: u8,
        email: u8,
    },
    /// Change an address (from a pool shared by all users, so that two
    /// users may hold one address).
    Address {
        user: u8,
        email: u8,
        address: u8,
    },
    DropEmail {
        user: u8,
        email: u8,
    },
    /// A writer puts the whole profile again (without the copied email).
    Profile {
        user: u8,
        name: u8,
    },
    Campaign {
        id: u8,
        profile: u8,
        status: u8,
    },
    DropCampaign {
        id: u8,
    },
}

fn social_op() -> impl Strategy<Value = Op> {
    let user = 0u8..6;
    let followee = prop_oneof![1 => Just(0u8), 2 => 0u8..6];
    prop_oneof![
        6 => (user.clone(), followee, any::<bool>())
            .prop_map(|(a, b, unfollow)| Op::Follow { a, b, unfollow }),
        2 => (user.clone(), 0u8..2, 0u8..3, 0u16..10_000)
            .prop_map(|(user, badge, tier, score)| Op::Achieve { user, badge, tier, score }),
        1 => (user, 0u8..2).prop_map(|(user, badge)| Op::DropAchievement { user, badge }),
    ]
}

fn user_op() -> impl Strategy<Value = Op> {
    let user = 0u8..3;
    let email = 0u8..3;
    prop_oneof![
        3 => (user.clone(), email.clone(), 0u8..6, any::<bool>()).prop_map(
            |(user, email, address, verified)| Op::AddEmail { user, email, address, verified }
        ),
        4 => (user.clone(), email.clone(), any::<bool>())
            .prop_map(|(user, email, old_first)| Op::SwitchPrimary { user, email, old_first }),
        1 => (user.clone(), email.clone()).prop_map(|(user, email)| Op::AlsoPrimary { user, email }),
        3 => (user.clone(), email.clone(), 0u8..6)
            .prop_map(|(user, email, address)| Op::Address { user, email, address }),
        2 => (user.clone(), email).prop_map(|(user, email)| Op::DropEmail { user, email }),
        1 => (user, 0u8..3).prop_map(|(user, name)| Op::Profile { user, name }),
    ]
}

fn campaign_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..4, 0u8..3, 0u8..3)
            .prop_map(|(id, profile, status)| Op::Campaign { id, profile, status }),
        1 => (0u8..4).prop_map(|id| Op::DropCampaign { id }),
    ]
}

fn user_name(user: u8) -> String {
    format!("u{user}")
}

/// Addresses from a shared pool, in the forms writers send (case, spaces).
fn address(index: u8) -> String {
    [
        "sam@x.org",
        " Sam@X.org",
        "kim@y.net ",
        "KIM@y.net",
        "lee@z.io",
        "ann@z.io",
    ][index as usize % 6]
        .to_string()
}

fn email_item(user: &str, id: u8, address: &str, primary: bool, verified: bool) -> Attrs {
    attrs(&[
        ("PK", s(&format!("USER#{user}"))),
        ("SK", s(&format!("EMAIL#e{id}"))),
        ("userId", s(user)),
        ("emailId", s(&format!("e{id}"))),
        ("email", s(address)),
        ("isPrimary", Av::Bool(primary)),
        ("isVerified", Av::Bool(verified)),
    ])
}

fn set(item: &Attrs, name: &str, value: Av) -> Attrs {
    let mut item = item.clone();
    item.insert(name.to_string(), value);
    item
}

/// The writes `ops` make, as a [`History`] (its records are the stream).
fn history(ops: &[Op]) -> History {
    let mut history = History::default();
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Follow { a, b, unfollow } => {
                if a == b {
                    continue;
                }
                let (a, b) = (user_name(a), user_name(b));
                let (pk, sk) = (format!("USER#{a}"), format!("FOLLOWS#{b}"));
                let exists = history.get(&pk, &sk).is_some();
                if exists && unfollow {
                    history.delete(&pk, &sk);
                } else {
                    history.put(super::model::follow(&a, &b, &format!("t{step}")));
                }
            }
            Op::Achieve {
                user,
                badge,
                tier,
                score,
            } => history.put(achievement(
                &user_name(user),
                &format!("b{badge}"),
                ["gold", "silver", "bronze"][tier as usize],
                support::n(score.into()),
            )),
            Op::DropAchievement { user, badge } => history.delete(
                &format!("USER#{}", user_name(user)),
                &format!("ACHIEVEMENT#b{badge}"),
            ),
            Op::AddEmail {
                user,
                email,
                address: a,
                verified,
            } => {
                let user = user_name(user);
                if history.get(&format!("USER#{user}"), "PROFILE").is_none() {
                    history.put(profile(&user, 0));
                }
                let sk = format!("EMAIL#e{email}");
                if history.get(&format!("USER#{user}"), &sk).is_none() {
                    history.put(email_item(&user, email, &address(a), false, verified));
                }
            }
            Op::SwitchPrimary {
                user,
                email,
                old_first,
            } => {
                let pk = format!("USER#{}", user_name(user));
                let Some(new) = history.get(&pk, &format!("EMAIL#e{email}")).cloned() else {
                    continue;
                };
                let old: Vec<Attrs> = emails(&history, &pk)
                    .into_iter()
                    .filter(|item| is_primary(item) && History::key(item) != History::key(&new))
                    .collect();
                let on = set(&new, "isPrimary", Av::Bool(true));
                if !old_first {
                    history.put(on.clone());
                }
                for item in old {
                    history.put(set(&item, "isPrimary", Av::Bool(false)));
                }
                if old_first {
                    history.put(on);
                }
            }
            Op::AlsoPrimary { user, email } => {
                let pk = format!("USER#{}", user_name(user));
                if let Some(item) = history.get(&pk, &format!("EMAIL#e{email}")).cloned() {
                    history.put(set(&item, "isPrimary", Av::Bool(true)));
                }
            }
            Op::Address {
                user,
                email,
                address: a,
            } => {
                let pk = format!("USER#{}", user_name(user));
                if let Some(item) = history.get(&pk, &format!("EMAIL#e{email}")).cloned() {
                    history.put(set(&item, "email", s(&address(a))));
                }
            }
            Op::DropEmail { user, email } => history.delete(
                &format!("USER#{}", user_name(user)),
                &format!("EMAIL#e{email}"),
            ),
            Op::Profile { user, name } => history.put(profile(&user_name(user), name)),
            Op::Campaign {
                id,
                profile,
                status,
            } => history.put(campaign(
                &format!("c{id}"),
                &format!("p{profile}"),
                ["ENABLED", "PAUSED", "ARCHIVED"][status as usize],
            )),
            Op::DropCampaign { id } => history.delete(&format!("CAMPAIGN#c{id}"), "METADATA"),
        }
    }
    history
}

fn profile(user: &str, name: u8) -> Attrs {
    attrs(&[
        ("PK", s(&format!("USER#{user}"))),
        ("SK", s("PROFILE")),
        ("userId", s(user)),
        ("firstName", s(["Sam", "Kim", "Lee"][name as usize % 3])),
    ])
}

fn emails(history: &History, pk: &str) -> Vec<Attrs> {
    history
        .items
        .iter()
        .filter(|((p, sk), _)| p == pk && sk.starts_with("EMAIL#"))
        .map(|(_, item)| item.clone())
        .collect()
}

fn is_primary(item: &Attrs) -> bool {
    item.get("isPrimary") == Some(&Av::Bool(true))
}

// ------------------------------------------------------------- checking ---

/// Violations by invariant and the items involved (the audit names an
/// `implies` violation by its item, the store by its partition).
type ViolationSet = BTreeSet<(String, Vec<String>)>;

async fn recorded(applier: &Applier) -> Result<ViolationSet, TestCaseError> {
    let recorded = applier
        .recorded_violations()
        .await
        .map_err(|error| TestCaseError::fail(format!("list violations: {error}")))?;
    Ok(recorded
        .into_iter()
        .map(|v| {
            let mut keys = v.keys;
            keys.sort();
            (v.invariant, keys)
        })
        .collect())
}

/// One case: a fresh table, the history delivered as `plan` says, then
/// every check.
async fn case(spec: Arc<Spec>, ops: &[Op], plan: &Delivery) -> Result<(), TestCaseError> {
    let client = support::client().await;
    let table = support::fresh_table(&client, &spec, "prop").await;
    let applier = control::applier(client.clone(), spec.clone(), &table, ApplyConfig::default());
    let history = history(ops);
    let mut writer = Writer {
        client: &client,
        table: &table,
        history: &history,
        written: 0,
    };
    let result = async {
        deliver(&applier, &mut writer, 0, plan).await?;
        let problems = check_derived(&client, &table, &spec, &[]).await;
        prop_assert!(
            problems.is_empty(),
            "{} records; differences:\n  {}",
            history.records.len(),
            problems.join("\n  ")
        );
        let letters = applier.dead_letter_store().list().await.expect("list");
        prop_assert!(letters.is_empty(), "dead letters: {letters:#?}");

        // Online checks recorded what a full audit finds; no drift.
        let report = audit(
            &applier,
            &AuditOptions {
                progress: false,
                ..AuditOptions::default()
            },
        )
        .await
        .map_err(|error| TestCaseError::fail(format!("audit: {error}")))?;
        let drift: Vec<_> = report
            .findings
            .iter()
            .filter(|f| f.problem != Problem::Violation)
            .collect();
        prop_assert!(drift.is_empty(), "the audit found drift: {drift:#?}");
        let mut audited = ViolationSet::new();
        for finding in report
            .findings
            .iter()
            .filter(|f| f.problem == Problem::Violation)
        {
            let mut keys = finding.items.clone();
            keys.sort();
            audited.insert((finding.rule.clone(), keys));
        }
        let online = recorded(&applier).await?;
        prop_assert_eq!(
            &online,
            &audited,
            "recorded violations differ from the audit's"
        );

        // A full replay in one go changes nothing.
        let before = snapshot(&client, &table).await;
        apply(&applier, &history.records).await?;
        let after = snapshot(&client, &table).await;
        prop_assert!(before == after, "a full replay changed the table");
        prop_assert_eq!(
            recorded(&applier).await?,
            online,
            "a replay changed the violations"
        );
        Ok(())
    }
    .await;
    // Small tables, but DynamoDB Local slows down as tables pile up.
    let _ = client.delete_table().table_name(&table).send().await;
    result
}

fn check_spec(name: &str, file: &'static str, ops: impl Strategy<Value = Op>, max_ops: usize) {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CASES);
    let config = Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(file))),
        max_shrink_iters: 200,
        max_shrink_time: 300_000,
        ..Config::default()
    };
    let spec = support::shipped_spec(name);
    let mut runner = TestRunner::new(config);
    let strategy = (prop::collection::vec(ops, 1..max_ops), delivery());
    let started = std::time::Instant::now();
    let result = runner.run(&strategy, |(ops, plan)| {
        runtime().block_on(case(spec.clone(), &ops, &plan))
    });
    eprintln!(
        "timing: {name}: {cases} cases took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if let Err(error) = result {
        panic!("{name}: {error}");
    }
}

#[test]
fn social_histories_converge_under_any_delivery() {
    check_spec(
        "social-service.toml",
        "tests/dynamo/properties/social.txt",
        social_op(),
        60,
    );
}

#[test]
fn user_histories_converge_under_any_delivery() {
    check_spec(
        "user-service.toml",
        "tests/dynamo/properties/user.txt",
        user_op(),
        40,
    );
}

#[test]
fn campaign_histories_converge_under_any_delivery() {
    check_spec(
        "ads-platform.toml",
        "tests/dynamo/properties/campaign.txt",
        campaign_op(),
        30,
    );
}
