//! The offline commands, run as the built binary: `check` and `plan`.

use std::path::Path;
use std::process::{Command, Output};

use ddb_projector::spec::Spec;
use expect_test::expect;
use serde_json::Value;

use super::util::repo_path;

/// Runs `ddb-projector ARGS` in the repository root.
fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ddb-projector"))
        .args(args)
        .current_dir(repo_path(""))
        .env_remove("RUST_LOG")
        .output()
        .expect("the binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).unwrap()
}

fn temp_file(contents: &str, suffix: &str) -> tempfile::NamedTempFile {
    let file = tempfile::Builder::new().suffix(suffix).tempfile().unwrap();
    std::fs::write(file.path(), contents).unwrap();
    file
}

/// Replaces a temporary path with `TMP` so that messages can be snapshots.
fn scrub(text: &str, path: &Path) -> String {
    text.replace(&path.display().to_string(), "TMP")
}

// ---------------------------------------------------------------------------
// check

#[test]
fn check_summarizes_each_shipped_spec() {
    for name in ["user-service", "social-service", "ads-platform"] {
        let relative = format!("projections/{name}.toml");
        let output = run(&["check", "--spec", &relative]);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let spec = Spec::from_file(&repo_path(&relative)).unwrap();
        assert_eq!(
            stdout(&output),
            format!("{relative}: ok\n{}", spec.summary())
        );
    }
}

#[test]
fn check_reports_a_broken_spec() {
    let text = std::fs::read_to_string(repo_path("projections/user-service.toml"))
        .unwrap()
        .replace("source = \"email\"", "source = \"emails\"")
        .replace("{lower(trim(email))}", "{lower(trim(email)}");
    let spec = temp_file(&text, ".toml");
    let output = run(&["check", "--spec", spec.path().to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(stdout(&output), "");
    expect![[r#"
        TMP: projection `email-gsi1-keys`: set `GSI1PK` = `EMAIL#{lower(trim(email)}`: bad expression `{lower(trim(email)}`: missing `)`
        TMP: projection `profile-primary-email`: unknown source entity `emails` (did you mean `email`?)
        (2 problems)
    "#]]
    .assert_eq(&scrub(&stderr(&output), spec.path()));
}

#[test]
fn check_reports_a_missing_file() {
    let output = run(&["check", "--spec", "projections/no-such-service.toml"]);
    assert_eq!(output.status.code(), Some(1));
    expect![[r#"
        projections/no-such-service.toml: cannot read the spec file: No such file or directory (os error 2)
    "#]]
    .assert_eq(&stderr(&output));
}

// ---------------------------------------------------------------------------
// plan

/// `plan`'s JSON lines, each reduced to what it says about which record.
fn plan_summary(stdout: &str) -> String {
    let mut out = String::new();
    for line in stdout.lines() {
        let line: Value = serde_json::from_str(line)
            .unwrap_or_else(|error| panic!("not a JSON line ({error}): {line}"));
        let record = &line["record"];
        let seq = record["sequenceNumber"].as_str().unwrap_or("?");
        let what = if let Some(skipped) = line["skipped"].as_str() {
            format!("skipped: {skipped}")
        } else if let Some(error) = line["error"].as_str() {
            format!("error: {error}")
        } else {
            format!(
                "{} {} {} / {}",
                line["projection"].as_str().unwrap(),
                line["op"].as_str().unwrap(),
                line["key"]["PK"].as_str().unwrap(),
                line["key"]["SK"].as_str().unwrap(),
            )
        };
        out.push_str(&format!(
            "{} {seq}: {what}\n",
            record["eventName"].as_str().unwrap_or("-")
        ));
    }
    out
}

#[test]
fn plan_prints_effects_as_json_lines() {
    let output = run(&[
        "plan",
        "--spec",
        "projections/user-service.toml",
        "--event",
        "tests/fixtures/lambda-event.json",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let out = stdout(&output);
    expect![[r#"
        INSERT 000000000000000000001: profile-primary-email recompute USER#u1 / PROFILE
        INSERT 000000000000000000002: email-gsi1-keys set USER#u1 / EMAIL#e1
        INSERT 000000000000000000002: profile-primary-email recompute USER#u1 / PROFILE
        INSERT 000000000000000000003: email-gsi1-keys set USER#u1 / EMAIL#e2
        MODIFY 000000000000000000004: email-gsi1-keys set USER#u1 / EMAIL#e1
        MODIFY 000000000000000000004: profile-primary-email recompute USER#u1 / PROFILE
        MODIFY 000000000000000000005: email-gsi1-keys set USER#u1 / EMAIL#e2
        MODIFY 000000000000000000005: profile-primary-email recompute USER#u1 / PROFILE
        REMOVE 000000000000000000006: skipped: change to `email` touches nothing a projection reads
    "#]]
    .assert_eq(&plan_summary(&out));
    // Each effect names its record and carries what the applier needs.
    let first: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(
        first["record"]["eventID"],
        "e8f0cbbf-5012-4d90-989c-042337d9ec0a"
    );
    let set: Value = serde_json::from_str(out.lines().nth(1).unwrap()).unwrap();
    assert_eq!(set["set"]["GSI1PK"], "EMAIL#alice@example.com");
    assert_eq!(set["if"]["email"], "alice@example.com");
    expect![[r#"
        6 records: 8 effects, 1 skipped, 0 could not be planned
    "#]]
    .assert_eq(&stderr(&output));
}

#[test]
fn plan_reads_the_event_from_stdin() {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_ddb-projector"))
        .args([
            "plan",
            "--spec",
            "projections/user-service.toml",
            "--event",
            "-",
        ])
        .current_dir(repo_path(""))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let event = std::fs::read(repo_path("tests/fixtures/lambda-event-ttl.json")).unwrap();
    child.stdin.take().unwrap().write_all(&event).unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    expect![[r#"
        REMOVE 000000000000000000006: skipped: change to `email` touches nothing a projection reads
    "#]]
    .assert_eq(&plan_summary(&stdout(&output)));
}

#[test]
fn plan_with_a_malformed_event_names_the_file() {
    let event = temp_file(r#"{"Records": [{"eventID": "1",}]}"#, ".json");
    let output = run(&[
        "plan",
        "--spec",
        "projections/user-service.toml",
        "--event",
        event.path().to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(stdout(&output), "");
    expect![[r#"
        error: TMP: the event is not valid JSON: trailing comma at line 1 column 30
    "#]]
    .assert_eq(&scrub(&stderr(&output), event.path()));
}

#[test]
fn plan_of_another_tables_event_names_both_tables_and_their_keys() {
    // AWS's sample event (`sam local generate-event dynamodb update`):
    // table ExampleTableWithStream, key `Id` (a number).
    let output = run(&[
        "plan",
        "--spec",
        "projections/user-service.toml",
        "--event",
        "tests/fixtures/sam-dynamodb-update.json",
    ]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let lines: Vec<Value> = stdout(&output)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    expect![[r#"
        key attribute `PK` is missing or not a string: the record's keys are `Id` (N), the spec's table is UserServiceTable (keys PK, SK, strings); the record comes from table ExampleTableWithStream (its eventSourceARN): an event of another table, or a spec of another service?"#]]
    .assert_eq(lines[0]["error"].as_str().unwrap());
}

#[test]
fn plan_with_a_missing_event_file() {
    let output = run(&[
        "plan",
        "--spec",
        "projections/user-service.toml",
        "--event",
        "tests/fixtures/no-such-event.json",
    ]);
    assert_eq!(output.status.code(), Some(2));
    expect![[r#"
        error: cannot read the event file tests/fixtures/no-such-event.json: No such file or directory (os error 2)
    "#]]
    .assert_eq(&stderr(&output));
}

#[test]
fn plan_with_a_record_that_cannot_be_planned() {
    // The fixture's second record (the primary email) without its address,
    // and its third with a record-level problem.
    let mut event: Value = serde_json::from_slice(
        &std::fs::read(repo_path("tests/fixtures/lambda-event.json")).unwrap(),
    )
    .unwrap();
    let records = event["Records"].as_array_mut().unwrap();
    records.truncate(3);
    records[1]["dynamodb"]["NewImage"]
        .as_object_mut()
        .unwrap()
        .remove("email");
    records[2]["eventName"] = Value::from("UPSERT");
    let event = temp_file(&event.to_string(), ".json");
    let output = run(&[
        "plan",
        "--spec",
        "projections/user-service.toml",
        "--event",
        event.path().to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    expect![[r#"
        INSERT 000000000000000000001: profile-primary-email recompute USER#u1 / PROFILE
        INSERT 000000000000000000002: profile-primary-email recompute USER#u1 / PROFILE
        INSERT 000000000000000000002: error: projection `email-gsi1-keys`: attribute `email` is missing
        - 000000000000000000003: error: unknown eventName `UPSERT`: this version knows INSERT, MODIFY and REMOVE
    "#]]
    .assert_eq(&plan_summary(&stdout(&output)));
    expect![[r#"
        3 records: 2 effects, 0 skipped, 2 could not be planned
    "#]]
    .assert_eq(&stderr(&output));
}

/// `backfill`'s segment flags are checked before anything is read or
/// connected: no table, no endpoint, no credentials are needed to be
/// told, and the exit code is 2.
#[test]
fn backfill_refuses_bad_segment_flags_before_any_io() {
    let spec = "projections/social-service.toml";
    let refused = |args: &[&str]| {
        let mut all = vec!["backfill", "--spec", spec, "--table", "NoSuchTable"];
        all.extend_from_slice(args);
        let output = Command::new(env!("CARGO_BIN_EXE_ddb-projector"))
            .args(&all)
            .current_dir(repo_path(""))
            .env_remove("RUST_LOG")
            // Nothing listens here: a command that connected would fail
            // with another message.
            .env("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "x")
            .env("AWS_SECRET_ACCESS_KEY", "x")
            .output()
            .expect("the binary runs");
        assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
        stderr(&output)
    };
    let out_of_range = refused(&["--segment", "5", "--total-segments", "2", "--run", "r"]);
    assert!(
        out_of_range.contains("--segment 5 is out of range for --total-segments 2"),
        "{out_of_range}"
    );
    let unnamed = refused(&["--segment", "0", "--total-segments", "2"]);
    assert!(unnamed.contains("--segment needs --run NAME"), "{unnamed}");
    // clap's own rules still hold on the flattened flags.
    let alone = refused(&["--segment", "0"]);
    assert!(alone.contains("--total-segments"), "{alone}");
    let both = refused(&["--all", "--projection", "followers"]);
    assert!(both.contains("cannot be used with"), "{both}");
}

/// Every leaf subcommand, with its path (`counter get`) and its command.
fn leaves(command: &clap::Command, path: &str, out: &mut Vec<(String, clap::Command)>) {
    let mut any = false;
    for sub in command
        .get_subcommands()
        .filter(|sub| sub.get_name() != "help")
    {
        any = true;
        let name = format!("{path} {}", sub.get_name()).trim().to_string();
        leaves(sub, &name, out);
    }
    if !any {
        out.push((path.to_string(), command.clone()));
    }
}

/// The CLI's grammar, walked through every subcommand's `--help`: the
/// shared flags mean one thing wherever they apply.
#[test]
fn every_subcommand_takes_the_shared_flags_where_they_apply() {
    use clap::CommandFactory;
    let mut root = ddb_projector::cli::Cli::command();
    root.build();
    let mut all = Vec::new();
    leaves(&root, "", &mut all);
    assert!(all.len() >= 20, "{} subcommands", all.len());
    let longs = |command: &clap::Command| -> Vec<String> {
        command
            .get_arguments()
            .filter_map(|a| a.get_long().map(str::to_string))
            .collect()
    };
    let mut problems = Vec::new();
    for (path, mut command) in all {
        let help = command.render_long_help().to_string();
        let flags = longs(&command);
        let has = |flag: &str| flags.iter().any(|f| f == flag);
        // `--log` everywhere, as a global flag.
        if !help.contains("--log <LOG>") {
            problems.push(format!("{path}: no --log in its help"));
        }
        // A command on a table takes the whole target: the spec, the table,
        // the consumer and the home region, under those names.
        // The registry's commands are the exceptions, each for its reason:
        // registrations are served by the table's unnamed consumer (no
        // --consumer); `unregister` and `specs` name a service, not a spec
        // file; `specs` only reads, so any region may answer it.
        let not_here: &[&str] = match path.as_str() {
            "register" => &["consumer"],
            "unregister" => &["consumer", "spec"],
            "specs" => &["consumer", "spec", "home-region"],
            _ => &[],
        };
        if has("table") {
            for flag in ["spec", "consumer", "home-region"] {
                if !has(flag) && !not_here.contains(&flag) {
                    problems.push(format!("{path}: --table without --{flag}"));
                }
            }
        }
        // `--projection` is repeatable wherever it is taken.
        for arg in command.get_arguments() {
            if arg.get_long() == Some("projection")
                && !matches!(arg.get_action(), clap::ArgAction::Append)
            {
                problems.push(format!("{path}: --projection is not repeatable"));
            }
            // `--format` is text or json wherever it is taken.
            if arg.get_long() == Some("format") {
                let values: Vec<String> = arg
                    .get_possible_values()
                    .iter()
                    .map(|v| v.get_name().to_string())
                    .collect();
                if values != ["text", "json"] {
                    problems.push(format!("{path}: --format takes {values:?}"));
                }
            }
        }
        // Keys are given as `--key NAME=VALUE` (`wait`, `counter get`).
        if ["wait", "counter get"].contains(&path.as_str()) && !has("key") {
            problems.push(format!("{path}: no --key"));
        }
        // The commands that scan the table keep under a read rate.
        if ["backfill", "audit", "prune"].contains(&path.as_str()) && !has("max-rcu") {
            problems.push(format!("{path}: scans, but takes no --max-rcu"));
        }
        // Every command that prints takes --format: all but `lambda`,
        // which serves invocations and prints nothing of its own.
        if path != "lambda" && !has("format") {
            problems.push(format!("{path}: prints, but takes no --format"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// `--format json` and `--format text` on the offline commands: `check`
/// gives the tables it compiled or every problem as one object; `plan`
/// and `filters` keep JSON as their default and tell it as text.
#[test]
fn the_offline_commands_print_json_or_text_as_asked() {
    let ok = run(&["check", "--spec", "projections", "--format", "json"]);
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    let answer: Value = serde_json::from_str(stdout(&ok).trim()).expect("one JSON object");
    assert_eq!(answer["ok"], true);
    let tables = answer["tables"].as_array().unwrap();
    assert_eq!(tables.len(), 3, "{answer}");
    let users = tables
        .iter()
        .find(|t| t["service"] == "user-service")
        .expect("user-service's table");
    assert!(users["projections"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["name"] == "email-gsi1-keys" && p["kind"] == "index-keys"));
    assert!(users["entities"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e == "email"));

    let broken = temp_file(
        &std::fs::read_to_string(repo_path("projections/user-service.toml"))
            .unwrap()
            .replace("entity = \"email\"", "entity = \"emial\""),
        ".toml",
    );
    let path = broken.path().to_str().unwrap();
    let bad = run(&["check", "--spec", path, "--format", "json"]);
    assert_eq!(bad.status.code(), Some(1), "{}", stderr(&bad));
    let answer: Value = serde_json::from_str(stdout(&bad).trim()).expect("one JSON object");
    assert_eq!(answer["ok"], false);
    let problems = answer["problems"].as_array().unwrap();
    assert!(
        problems
            .iter()
            .any(|p| p["problem"].as_str().unwrap().contains("emial")
                && p["file"].as_str().unwrap() == path),
        "{answer}"
    );

    let event = "tests/fixtures/lambda-event.json";
    let json = run(&[
        "plan",
        "--spec",
        "projections/user-service.toml",
        "--event",
        event,
    ]);
    let text = run(&[
        "plan",
        "--spec",
        "projections/user-service.toml",
        "--event",
        event,
        "--format",
        "text",
    ]);
    assert_eq!(json.status.code(), text.status.code());
    let json_lines = stdout(&json).lines().count();
    let text = stdout(&text);
    assert_eq!(
        text.lines().count(),
        json_lines,
        "one line of text per JSON line:\n{text}"
    );
    assert!(
        text.lines().any(|l| l
            .contains("email-gsi1-keys: set USER#u1 / EMAIL#e1 GSI1PK=EMAIL#alice@example.com")),
        "{text}"
    );

    let filters = run(&[
        "filters",
        "--spec",
        "projections/user-service.toml",
        "--format",
        "text",
    ]);
    let text = stdout(&filters);
    let criteria: Value = serde_json::from_str(&stdout(&run(&[
        "filters",
        "--spec",
        "projections/user-service.toml",
    ])))
    .unwrap();
    let patterns = criteria["Filters"].as_array().unwrap().len();
    assert!(
        text.starts_with(&format!("UserServiceTable: {patterns} filter patterns\n")),
        "{text}"
    );
    assert_eq!(text.lines().count(), patterns + 1, "{text}");
}
