//! Fuzzing on stable: every committed corpus seed (`fuzz/corpus/<target>/`)
//! replayed through the fuzz targets' own code (`fuzz/src/lib.rs`, included
//! here as a module), and each input the fuzzer found a bug with, fed
//! through the public function it crashed, asserting the clear error that
//! replaced the panic.

use std::path::PathBuf;

use super::util::repo_path;

#[path = "../../fuzz/src/lib.rs"]
mod harness;

use harness::Outcome;

/// The corpus seeds of one target, by file name, in name order. Files
/// libFuzzer adds while fuzzing (named by their SHA-1, 40 hex digits; not
/// committed) are left out.
fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir: PathBuf = repo_path(&format!("fuzz/corpus/{target}"));
    let mut seeds: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.is_file())
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let bytes = std::fs::read(&path).expect("a readable seed");
            (name, bytes)
        })
        .filter(|(name, _)| !(name.len() == 40 && name.bytes().all(|b| b.is_ascii_hexdigit())))
        .collect();
    seeds.sort();
    assert!(
        seeds.len() >= 3,
        "{}: expected the committed seeds",
        dir.display()
    );
    seeds
}

/// Runs every seed of `target` and returns the outcomes by file name.
fn replay(target: &str, run: fn(&[u8]) -> Outcome) -> Vec<(String, Outcome)> {
    seeds(target)
        .into_iter()
        .map(|(name, bytes)| {
            let outcome = run(&bytes);
            (name, outcome)
        })
        .collect()
}

fn outcome<'a>(outcomes: &'a [(String, Outcome)], name: &str) -> &'a Outcome {
    &outcomes
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no seed {name}"))
        .1
}

/// Every stage is reached by some seed: a corpus that stops at the JSON
/// parser would fuzz nothing else.
fn assert_covers_every_stage(target: &str, outcomes: &[(String, Outcome)], plan_errors: bool) {
    let any = |f: fn(&Outcome) -> bool| outcomes.iter().any(|(_, o)| f(o));
    assert!(any(|o| o.refused), "{target}: no seed is refused");
    assert!(any(|o| o.records > 0), "{target}: no seed decodes");
    assert!(
        any(|o| o.problems > 0),
        "{target}: no seed has a bad record"
    );
    assert!(any(|o| o.effects > 0), "{target}: no seed plans an effect");
    if plan_errors {
        assert!(
            any(|o| o.plan_errors > 0),
            "{target}: no seed fails to plan: {outcomes:#?}"
        );
    }
}

#[test]
fn every_lambda_event_seed_runs_through_the_lambda_event_target() {
    let outcomes = replay("lambda_event", harness::lambda_event);
    assert_covers_every_stage("lambda_event", &outcomes, true);
    // The captured fixture: 6 records, all decoded, planned against
    // user-service (and no entity of the other two specs).
    let history = outcome(&outcomes, "user-service-history.json");
    assert_eq!((history.records, history.problems), (6, 0), "{history:?}");
    assert!(outcome(&outcomes, "not-an-event.json").refused);
    let social = outcome(&outcomes, "social-and-ads.json");
    assert_eq!(social.records, 4, "{social:?}");
    let plan_errors = outcome(&outcomes, "plan-errors.json");
    assert_eq!(plan_errors.records, 5, "{plan_errors:?}");
    let bad = outcome(&outcomes, "bad-records.json");
    assert!(bad.problems >= 7 && bad.records >= 1, "{bad:?}");
    // Found by the fast-versus-slow check: a number beyond f64 in a field
    // Lambda never writes. serde_json refuses the event, and so does the
    // fast way now (it refuses unknown fields; see the next seed).
    let huge = outcome(&outcomes, "number-beyond-f64-in-an-unknown-field.json");
    assert_eq!((huge.records, huge.refused), (0, true), "{huge:?}");
    // Found by fuzzing: sonic-rs skipped unknown values by unbounded
    // recursion, and 250 nested arrays overflowed the stack.
    let deep = outcome(&outcomes, "deeply-nested-unknown-field.json");
    assert_eq!((deep.records, deep.refused), (0, true), "{deep:?}");
    // ... and so did describing a wrong-typed array in an error: the fast
    // way now reads through `Guarded`, under which sonic-rs never skips
    // or describes a value (it refuses it where it stands).
    let deep = outcome(&outcomes, "deeply-nested-wrong-typed-field.json");
    assert_eq!((deep.records, deep.refused), (0, true), "{deep:?}");
}

#[test]
fn every_streams_record_seed_runs_through_the_streams_record_target() {
    let outcomes = replay("streams_record", harness::streams_record);
    // A GetRecords body the SDK cannot read never reaches the projector,
    // so no seed is refused here on purpose; the rest must be reached.
    let history = outcome(&outcomes, "user-service-history.json");
    assert_eq!((history.records, history.problems), (6, 0), "{history:?}");
    assert!(history.effects > 0, "{history:?}");
    assert!(outcome(&outcomes, "bad-records.json").problems > 0);
    assert_eq!(
        harness::streams_record(b"{\"Records\": 3}"),
        Outcome {
            refused: true,
            ..Outcome::default()
        }
    );
}

#[test]
fn every_spec_seed_runs_through_the_spec_target() {
    let outcomes = replay("spec", harness::spec);
    for (name, outcome) in &outcomes {
        // The shipped specs compile and plan the fixture; the broken ones
        // are refused with their problems.
        assert_eq!(outcome.refused, name.starts_with("broken-"), "{name}");
    }
    assert!(outcome(&outcomes, "user-service.toml").effects > 0);
}

#[test]
fn the_corpus_holds_the_shipped_specs_as_they_are() {
    for (label, text) in harness::SHIPPED_SPECS {
        let name = label.trim_start_matches("projections/");
        let seed = std::fs::read_to_string(repo_path(&format!("fuzz/corpus/spec/{name}")))
            .unwrap_or_else(|error| panic!("fuzz/corpus/spec/{name}: {error}"));
        assert_eq!(seed, text, "fuzz/corpus/spec/{name} differs from {label}");
    }
    assert_eq!(harness::shipped_specs().len(), 3);
}

// ---------------------------------------------------------------------------
// what fuzzing found

/// Runs `f` on a thread of its own and fails if it takes longer than
/// `seconds`, instead of hanging the test run.
fn within<T: Send + 'static>(seconds: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (send, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || send.send(f()));
    receive
        .recv_timeout(std::time::Duration::from_secs(seconds))
        .unwrap_or_else(|_| panic!("still running after {seconds} s"))
}

/// `streams_record`, in its first second: DynamoDB sends an attribute type
/// the SDK does not know (here `~`; a type added after this build), the SDK
/// reads it as `AttributeValue::Unknown`, and converting the image panicked
/// in `serde_dynamo` ("Unexpectedly did not match any possible data
/// types"), taking the stream runner down on every restart. It is now a
/// decode problem: the record is dead-lettered whole and the shard goes on.
#[test]
fn an_attribute_type_the_sdk_does_not_know_is_a_decode_problem_not_a_panic() {
    let body = br#"{"Records": [
        {"eventID": "k", "eventName": "REMOVE", "dynamodb": {
            "Keys": {"PK": {"~": "USER#u1"}, "SK": {"S": "EMAIL#e1"}},
            "SequenceNumber": "10", "StreamViewType": "KEYS_ONLY"}},
        {"eventID": "n", "eventName": "INSERT", "dynamodb": {
            "Keys": {"PK": {"S": "USER#u1"}, "SK": {"S": "EMAIL#e1"}},
            "NewImage": {"PK": {"S": "USER#u1"}, "SK": {"S": "EMAIL#e1"},
                "meta": {"M": {"tags": {"L": [{"S": "a"}, {"VECTOR": [1, 2]}]}}}},
            "SequenceNumber": "11", "StreamViewType": "NEW_IMAGE"}},
        {"eventName": "TRUNCATE", "dynamodb": {"Keys": {"PK": {"~": "x"}}}}
    ]}"#;
    let output = harness::get_records_output(body).expect("the SDK reads the body");
    let described: String = output
        .records()
        .iter()
        .enumerate()
        .map(|(index, record)| {
            match ddb_projector::decode::decode_stream_record(index, "shardId-1", record) {
                Ok(record) => format!("decoded {:?}\n", record.keys),
                Err(problem) => format!("{problem}\n  raw {}\n", problem.raw),
            }
        })
        .collect();
    expect_test::expect![[r#"
        record 0 (eventID k) (sequence number 10): Keys attribute `PK` has a DynamoDB type this build does not know (the SDK read it as `Unknown`); upgrade ddb-projector to decode it
          raw {"awsRegion":null,"dynamodb":{"ApproximateCreationDateTime":null,"Keys":{"PK":{"UNKNOWN":null},"SK":{"S":"EMAIL#e1"}},"NewImage":null,"OldImage":null,"SequenceNumber":"10","SizeBytes":null,"StreamViewType":"KEYS_ONLY"},"eventID":"k","eventName":"REMOVE","eventSource":null,"userIdentity":null}
        record 1 (eventID n) (sequence number 11): NewImage attribute `meta.tags[1]` has a DynamoDB type this build does not know (the SDK read it as `Unknown`); upgrade ddb-projector to decode it
          raw {"awsRegion":null,"dynamodb":{"ApproximateCreationDateTime":null,"Keys":{"PK":{"S":"USER#u1"},"SK":{"S":"EMAIL#e1"}},"NewImage":{"PK":{"S":"USER#u1"},"SK":{"S":"EMAIL#e1"},"meta":{"M":{"tags":{"L":[{"S":"a"},{"UNKNOWN":null}]}}}},"OldImage":null,"SequenceNumber":"11","SizeBytes":null,"StreamViewType":"NEW_IMAGE"},"eventID":"n","eventName":"INSERT","eventSource":null,"userIdentity":null}
        record 2: unknown eventName `TRUNCATE`: this version knows INSERT, MODIFY and REMOVE
          raw {"awsRegion":null,"dynamodb":{"ApproximateCreationDateTime":null,"Keys":{"PK":{"UNKNOWN":null}},"NewImage":null,"OldImage":null,"SequenceNumber":null,"SizeBytes":null,"StreamViewType":null},"eventID":null,"eventName":"TRUNCATE","eventSource":null,"userIdentity":null}
    "#]].assert_eq(&described);
    // The whole target runs it through planning and dead letters.
    let outcome = harness::streams_record(body);
    assert_eq!((outcome.records, outcome.problems), (0, 3), "{outcome:?}");
}

/// Ten index-keys projections of one entity, each reading every other's
/// output (a 1.4 KB spec): the loop check enumerated every path through
/// them, factorial time, over the spec target's 10 s timeout (nine took
/// 5 s). Each projection now reports the shortest loop through it.
#[test]
fn index_keys_that_all_read_each_other_are_reported_at_once() {
    let n = 10;
    let mut text = String::from(
        "service = \"s\"\n[table]\nname = \"T\"\n[entities.e]\npk = \"E#{id}\"\nsk = \"S#{sid}\"\n",
    );
    for i in 0..n {
        let reads: String = (0..n)
            .filter(|&j| j != i)
            .map(|j| format!("{{x{j}}}#"))
            .collect();
        text.push_str(&format!(
            "[[projections]]\nname = \"p{i}\"\nkind = \"index-keys\"\nentity = \"e\"\nset = {{ x{i} = \"{reads}\" }}\n"
        ));
    }
    let errors = within(30, move || {
        ddb_projector::spec::Spec::from_toml(&text, "loops.toml").unwrap_err()
    });
    expect_test::expect![[r#"
        loops.toml: projection `p0`: projections `p0` -> `p1` -> `p0` form a loop on entity `e`: each writes an attribute the next one reads, so writes would never stop
        loops.toml: projection `p2`: projections `p2` -> `p0` -> `p2` form a loop on entity `e`: each writes an attribute the next one reads, so writes would never stop
        loops.toml: projection `p3`: projections `p3` -> `p0` -> `p3` form a loop on entity `e`: each writes an attribute the next one reads, so writes would never stop
        loops.toml: projection `p4`: projections `p4` -> `p0` -> `p4` form a loop on entity `e`: each writes an attribute the next one reads, so writes would never stop
        loops.toml: projection `p5`: projections `p5` -> `p0` -> `p5` form a loop on entity `e`: each writes an attribute the next one reads, so writes would never stop
        loops.toml: projection `p6`: projections `p6` -> `p0` -> `p6` form a loop on entity `e`: each writes an attribute the next one reads, so writes would never stop
        loops.toml: projection `p7`: projections `p7` -> `p0` -> `p7` form a loop on entity `e`: each writes an attribute the next one reads, so writes would never stop
        loops.toml: projection `p8`: projections `p8` -> `p0` -> `p8` form a loop on entity `e`: each writes an attribute the next one reads, so writes would never stop
        loops.toml: projection `p9`: projections `p9` -> `p0` -> `p9` form a loop on entity `e`: each writes an attribute the next one reads, so writes would never stop
        (9 problems)"#]].assert_eq(&errors.to_string());
}

/// Transforms nested thousands deep (`{lower(lower(...(email)...))}`):
/// parsing took time quadratic in the template's length, one level of
/// recursion per call (140 KB: 40 s). Transforms now nest at most 8 deep.
#[test]
fn deeply_nested_transforms_are_refused_quickly() {
    let depth = 20_000;
    let template = format!("{}email{}", "lower(".repeat(depth), ")".repeat(depth));
    let text = harness::SHIPPED_SPECS[0]
        .1
        .replace("{lower(trim(email))}", &format!("{{{template}}}"));
    assert_ne!(text, harness::SHIPPED_SPECS[0].1);
    let errors = within(30, move || {
        ddb_projector::spec::Spec::from_toml(&text, "deep.toml").unwrap_err()
    });
    let message = errors.to_string();
    assert!(
        message.contains("transforms nest at most 8 deep"),
        "{}",
        &message[..message.len().min(300)]
    );
    // Eight deep is still fine.
    let eight = format!("{}email{}", "lower(".repeat(8), ")".repeat(8));
    let text = harness::SHIPPED_SPECS[0]
        .1
        .replace("{lower(trim(email))}", &format!("{{{eight}}}"));
    ddb_projector::spec::Spec::from_toml(&text, "eight.toml").unwrap();
}

/// Found by fuzzing `spec`: an entity pattern that does not compile made
/// the projections before a rollup's counter drop out of the compiled
/// list, and the rollup's fingerprint read its counter at the raw
/// position, out of bounds. Now the problems are reported.
#[test]
fn a_rollup_after_projections_that_did_not_compile_is_an_error_not_a_panic() {
    let text = r#"
service = "s"

[table]
name = "T"

[entities.follow]
pk = "USER#{f/llowerId}"
sk = "FOLLOWS#{followeeId}"

[entities.profile]
pk = "USER#{userId}"
sk = "PROFILE"

[[projections]]
name = "followers"
kind = "counter"
source = "follow"
of = { userId = "{followeeId}" }

[[projections]]
name = "following"
kind = "counter"
source = "follow"
of = { userId = "{followerId}" }

[[projections]]
name = "following-count"
kind = "rollup"
counter = "following"
target = "profile"
attribute = "followingCount"
"#;
    let errors = within(10, move || {
        ddb_projector::spec::Spec::from_toml(text, "rollup.toml").unwrap_err()
    })
    .to_string();
    assert!(errors.contains("entity `follow`"), "{errors}");
}
