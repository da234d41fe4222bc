//! The deployed function's IAM policy allows every DynamoDB call the code
//! makes: a call the policy lacks is denied in AWS only, never on DynamoDB
//! Local (`BatchGetItem` was missing, though marker reads and invariant
//! checks used it).

use std::path::Path;

/// The SDK call (as written in the code) and the IAM action it needs.
const CALLS: &[(&str, &[&str])] = &[
    (".get_item()", &["dynamodb:GetItem"]),
    (".batch_get_item()", &["dynamodb:BatchGetItem"]),
    (".query()", &["dynamodb:Query"]),
    (".scan()", &["dynamodb:Scan"]),
    (".put_item()", &["dynamodb:PutItem"]),
    (".update_item()", &["dynamodb:UpdateItem"]),
    (".delete_item()", &["dynamodb:DeleteItem"]),
    (".batch_write_item()", &["dynamodb:BatchWriteItem"]),
    (".describe_table()", &["dynamodb:DescribeTable"]),
    // A transaction is authorized item by item.
    (
        ".transact_write_items()",
        &[
            "dynamodb:PutItem",
            "dynamodb:UpdateItem",
            "dynamodb:DeleteItem",
            "dynamodb:ConditionCheckItem",
        ],
    ),
];

fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).expect("read a source file");
            out.push((path.display().to_string(), text));
        }
    }
}

#[test]
fn the_stack_allows_every_dynamodb_call_the_code_makes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let template = std::fs::read_to_string(root.join("infra/template.yaml")).expect("template");
    // The function's table statement, up to its resource.
    let start = template
        .find("Sid: ReadAndWriteTheTable")
        .expect("the table statement");
    let statement = &template[start..start + template[start..].find("Resource:").unwrap()];
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    let mut missing = Vec::new();
    for (call, actions) in CALLS {
        let Some((file, _)) = files.iter().find(|(_, text)| text.contains(call)) else {
            continue;
        };
        for action in *actions {
            if !statement.contains(&format!("- {action}\n")) {
                missing.push(format!("{action} (for {call} in {file})"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "infra/template.yaml does not allow: {}",
        missing.join(", ")
    );
}

/// Every state the backfill and audit state machines name (`StartAt`,
/// `Next`, `Default`) is defined in it: Step Functions refuses the
/// definition otherwise, and only at deploy time (a removed `InvalidInput`
/// state once got past every check here).
#[test]
fn each_state_machine_defines_every_state_it_names() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let template = std::fs::read_to_string(root.join("infra/template.yaml")).expect("template");
    for (machine, file) in [
        (
            "BackfillStateMachine",
            "infra/statemachines/backfill.asl.yaml",
        ),
        ("AuditStateMachine", "infra/statemachines/audit.asl.yaml"),
    ] {
        // SAM's resource names its definition file.
        let start = template
            .find(&format!("  {machine}:"))
            .unwrap_or_else(|| panic!("the state machine {machine}"));
        let uri = file.trim_start_matches("infra/");
        assert!(
            template[start..]
                .lines()
                .take(30)
                .any(|l| l.trim() == format!("DefinitionUri: {uri}")),
            "{machine} does not name {file}"
        );
        let definition = std::fs::read_to_string(root.join(file)).expect("the definition file");
        let definition = definition.as_str();
        let defined: std::collections::BTreeSet<&str> = definition
            .lines()
            .filter_map(|line| {
                let name = line.trim().strip_suffix(':')?;
                (!name.is_empty()
                    && name.chars().all(|c| c.is_ascii_alphanumeric())
                    && name.starts_with(|c: char| c.is_ascii_uppercase()))
                .then_some(name)
            })
            .collect();
        let mut named = Vec::new();
        for line in definition.lines() {
            let line = line.trim();
            for key in ["StartAt: ", "Next: ", "Default: "] {
                if let Some(name) = line.strip_prefix(key) {
                    named.push(name.trim());
                }
            }
        }
        assert!(
            named.len() >= 8,
            "{machine}: the names were found: {named:?}"
        );
        let missing: Vec<&&str> = named.iter().filter(|n| !defined.contains(**n)).collect();
        assert!(
            missing.is_empty(),
            "{machine}: states named but not defined: {missing:?} (defined: {defined:?})"
        );
    }
}
