use super::*;

const PROFILES: &str = r#"
service = "profiles"
[table]
name = "Shared"
[[table.gsi]]
name = "GSI1"
partition_key = "GSI1PK"
sort_key = "GSI1SK"
[entities.profile]
pk = "USER#{userId}"
sk = "PROFILE"
[entities.email]
pk = "USER#{userId}"
sk = "EMAIL#{emailId}"
[[projections]]
name = "primary-email"
kind = "denormalize"
source = "email"
target = "profile"
when = { isPrimary = true }
copy = { email = "{address}" }
"#;

const SOCIAL: &str = r#"
service = "social"
[table]
name = "Shared"
[entities.profile]
pk = "USER#{userId}"
sk = "PROFILE"
[entities.follow]
pk = "USER#{followerId}"
sk = "FOLLOWS#{followeeId}"
[entities.followed_by]
pk = "USER#{followeeId}"
sk = "FOLLOWED_BY#{followerId}"
[[projections]]
name = "followed-by"
kind = "inverse-edge"
source = "follow"
target = "followed_by"
[[projections]]
name = "followers"
kind = "counter"
source = "follow"
of = { userId = "{followeeId}" }
[[projections]]
name = "followers-count"
kind = "rollup"
counter = "followers"
target = "profile"
attribute = "followersCount"
"#;

fn texts(files: &[(&str, &str)]) -> Vec<(String, String)> {
    files
        .iter()
        .map(|(label, text)| (label.to_string(), text.to_string()))
        .collect()
}

fn errors(files: &[(&str, &str)]) -> String {
    SpecSet::from_texts(&texts(files))
        .expect_err("the specs conflict")
        .to_string()
}

#[test]
fn two_specs_of_one_table_compose_into_one() {
    let set = SpecSet::from_texts(&texts(&[("p.toml", PROFILES), ("s.toml", SOCIAL)])).unwrap();
    let [spec] = set.specs() else {
        panic!("one table, one spec: {:?}", set.specs().len())
    };
    assert_eq!(spec.service, "profiles+social");
    assert_eq!(spec.file, "p.toml + s.toml");
    let names: Vec<&str> = spec.projections.iter().map(|p| p.name.as_str()).collect();
    for name in [
        "primary-email",
        "followed-by",
        "followers",
        "followers-count",
    ] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    assert_eq!(spec.service_of("primary-email"), "profiles");
    assert_eq!(spec.service_of("followers"), "social");
    assert_eq!(spec.service_of("followers~0"), "social");
    assert_eq!(spec.services.file_of("followers"), Some("s.toml"));
    assert_eq!(spec.entities.len(), 4, "the shared `profile` is one entity");
    assert_eq!(spec.table.gsis.len(), 1);
}

#[test]
fn composing_keeps_each_projections_fingerprint() {
    let alone = Spec::from_toml(SOCIAL, "s.toml").unwrap();
    let set = SpecSet::from_texts(&texts(&[("p.toml", PROFILES), ("s.toml", SOCIAL)])).unwrap();
    let composed = &set.specs()[0];
    for projection in &alone.projections {
        let id = composed.projection_id(&projection.name).unwrap();
        assert_eq!(
            composed.projections[id].fingerprint, projection.fingerprint,
            "{}: a lease taken alone must stand composed",
            projection.name
        );
    }
}

#[test]
fn specs_of_other_tables_are_routed_by_table() {
    let other = SOCIAL.replace("name = \"Shared\"", "name = \"Social\"");
    let set = SpecSet::from_texts(&texts(&[("p.toml", PROFILES), ("s.toml", &other)])).unwrap();
    assert_eq!(set.specs().len(), 2);
    assert_eq!(set.for_table("Social").unwrap().service, "social");
    assert_eq!(set.for_table("Shared").unwrap().service, "profiles");
    assert!(set.for_table("Elsewhere").is_none());
    let error = set.select(None).unwrap_err();
    assert!(
        error.contains("`Shared` (profiles)") && error.contains("--table"),
        "{error}"
    );
    assert!(set
        .select(Some("Elsewhere"))
        .unwrap_err()
        .contains("no spec for table `Elsewhere`"));
    // A registry serves the tables its specs name, even with one spec: a
    // stream of another table must not be projected with it.
    let registry = SpecSet::from_texts(&texts(&[("s.toml", SOCIAL)])).unwrap();
    assert!(registry.for_table("test-1234").is_none());
    assert_eq!(registry.for_table("Shared").unwrap().service, "social");
    // A single spec file serves the table it is pointed at.
    let single = SpecSet::of(Spec::from_toml(SOCIAL, "s.toml").unwrap());
    assert_eq!(single.for_table("test-1234").unwrap().service, "social");
}

#[test]
fn a_table_described_twice_with_other_keys_names_both_files() {
    let other = SOCIAL.replace(
        "[table]\nname = \"Shared\"",
        "[table]\nname = \"Shared\"\nsort_key = \"sk\"",
    );
    let text = errors(&[("p.toml", PROFILES), ("s.toml", &other)]);
    assert!(
        text.contains("s.toml: table:") && text.contains("in p.toml"),
        "{text}"
    );
}

#[test]
fn a_ttl_attribute_named_by_one_spec_serves_both_and_two_must_agree() {
    let with_ttl = SOCIAL.replace(
        "[table]\nname = \"Shared\"",
        "[table]\nname = \"Shared\"\nttl_attribute = \"ttl\"",
    );
    let set = SpecSet::from_texts(&texts(&[("p.toml", PROFILES), ("s.toml", &with_ttl)])).unwrap();
    assert_eq!(set.specs()[0].table.ttl_attribute.as_deref(), Some("ttl"));
    let other = PROFILES.replace(
        "[table]\nname = \"Shared\"",
        "[table]\nname = \"Shared\"\nttl_attribute = \"expires\"",
    );
    let text = errors(&[("p.toml", &other), ("s.toml", &with_ttl)]);
    assert!(text.contains("s.toml: table: table `Shared` has the TTL attribute `ttl` here, but `expires` in p.toml"), "{text}");
}

#[test]
fn an_entity_meaning_two_things_names_both_files() {
    let other = SOCIAL.replace(
        "[entities.profile]\npk = \"USER#{userId}\"",
        "[entities.profile]\npk = \"USER#{id}\"",
    );
    let text = errors(&[("p.toml", PROFILES), ("s.toml", &other)]);
    assert!(
        text.contains("s.toml: entity `profile`: means `USER#{id}`") && text.contains("in p.toml"),
        "{text}"
    );
}

#[test]
fn two_names_for_the_same_keys_name_both_files() {
    let other = SOCIAL
        .replace("[entities.profile]", "[entities.user]")
        .replace("target = \"profile\"", "target = \"user\"");
    let text = errors(&[("p.toml", PROFILES), ("s.toml", &other)]);
    assert!(
        text.contains("can match the same keys")
            && text.contains("`profile` in p.toml")
            && text.contains("`user` in s.toml"),
        "{text}"
    );
}

#[test]
fn a_name_defined_twice_names_both_files() {
    let other = SOCIAL
        .replace("name = \"followers\"", "name = \"primary-email\"")
        .replace("counter = \"followers\"", "counter = \"primary-email\"");
    let text = errors(&[("p.toml", PROFILES), ("s.toml", &other)]);
    assert!(
        text.contains("s.toml: projection `primary-email`: the name `primary-email` is also defined in p.toml"),
        "{text}"
    );
    let twice = errors(&[
        ("p.toml", PROFILES),
        ("q.toml", &PROFILES.replace("profiles", "q")),
    ]);
    assert!(
        twice.contains("q.toml: projection `primary-email`: the name `primary-email` is also defined in p.toml"),
        "{twice}"
    );
}

#[test]
fn two_specs_deriving_one_attribute_name_both_files() {
    let other = format!(
        "{SOCIAL}\n{}",
        r#"
[entities.email]
pk = "USER#{userId}"
sk = "EMAIL#{emailId}"
[[projections]]
name = "any-email"
kind = "denormalize"
source = "email"
target = "profile"
copy = { email = "{address}" }
"#
    );
    let text = errors(&[("p.toml", PROFILES), ("s.toml", &other)]);
    assert!(
        text.contains("write `email` on entity `profile`")
            && text.contains("`primary-email` in p.toml")
            && text.contains("`any-email` in s.toml"),
        "{text}"
    );
}

#[test]
fn a_loop_across_specs_names_both_files() {
    // p copies a profile's attribute onto a `card`; s copies the card's
    // back onto the profile: each one's output is the other's input.
    let p = r#"
service = "profiles"
[table]
name = "Shared"
[entities.profile]
pk = "USER#{userId}"
sk = "PROFILE"
[entities.card]
pk = "USER#{userId}"
sk = "CARD"
[[projections]]
name = "card-name"
kind = "denormalize"
source = "profile"
target = "card"
copy = { name = "{name}" }
"#;
    let s = r#"
service = "cards"
[table]
name = "Shared"
[entities.profile]
pk = "USER#{userId}"
sk = "PROFILE"
[entities.card]
pk = "USER#{userId}"
sk = "CARD"
[[projections]]
name = "profile-title"
kind = "denormalize"
source = "card"
target = "profile"
copy = { title = "{title}" }
"#;
    let text = errors(&[("p.toml", p), ("s.toml", s)]);
    assert!(
        text.contains("form a loop")
            && text.contains("`card-name` in p.toml")
            && text.contains("`profile-title` in s.toml"),
        "{text}"
    );
}

#[test]
fn a_file_without_a_service_is_refused() {
    let text = errors(&[
        ("p.toml", PROFILES),
        (
            "q.toml",
            &SOCIAL.replace("service = \"social\"", "service = \"\""),
        ),
    ]);
    assert!(text.contains("q.toml: `service` must name"), "{text}");
}

#[test]
fn the_same_service_in_two_files_is_refused() {
    let text = errors(&[
        ("p.toml", PROFILES),
        ("q.toml", &SOCIAL.replace("\"social\"", "\"profiles\"")),
    ]);
    assert!(
        text.contains("q.toml: service: service `profiles` is also registered by p.toml"),
        "{text}"
    );
}

#[test]
fn a_directory_loads_its_toml_files_and_names_a_broken_one() {
    let dir = std::env::temp_dir().join(format!("ddbp-set-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let empty = SpecSet::load(&dir).unwrap_err().to_string();
    assert!(empty.contains("holds no spec files"), "{empty}");
    std::fs::write(dir.join("profiles.toml"), PROFILES).unwrap();
    std::fs::write(dir.join("social.toml"), SOCIAL).unwrap();
    std::fs::write(dir.join("README.md"), "not a spec").unwrap();
    std::fs::write(dir.join(".hidden.toml"), "not = [a spec").unwrap();
    let set = SpecSet::load(&dir).unwrap();
    assert_eq!(set.specs()[0].service, "profiles+social");
    std::fs::write(dir.join("broken.toml"), "service = ").unwrap();
    let text = SpecSet::load(&dir).unwrap_err().to_string();
    assert!(text.contains("broken.toml: invalid spec TOML"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_counter_rides_on_an_edge_of_its_own_service_only() {
    // The social team counts follows; another team keeps the reverse
    // edges. Composed, the counter keeps its own markers: its definition
    // (and where its records are) is what it is alone.
    let counts = r#"
service = "counts"
[table]
name = "Shared"
[entities.follow]
pk = "USER#{followerId}"
sk = "FOLLOWS#{followeeId}"
[[projections]]
name = "followers"
kind = "counter"
source = "follow"
of = { userId = "{followeeId}" }
"#;
    let edges = r#"
service = "edges"
[table]
name = "Shared"
[entities.follow]
pk = "USER#{followerId}"
sk = "FOLLOWS#{followeeId}"
[entities.followed_by]
pk = "USER#{followeeId}"
sk = "FOLLOWED_BY#{followerId}"
[[projections]]
name = "followed-by"
kind = "inverse-edge"
source = "follow"
target = "followed_by"
"#;
    let alone = Spec::from_toml(counts, "c.toml").unwrap();
    let set = SpecSet::from_texts(&texts(&[("c.toml", counts), ("e.toml", edges)])).unwrap();
    let composed = &set.specs()[0];
    let id = composed.counter_id("followers").unwrap();
    let crate::spec::ProjectionKind::Counter(counter) = &composed.projections[id].kind else {
        panic!("a counter")
    };
    assert_eq!(counter.marker, crate::spec::Marker::Own);
    assert_eq!(
        composed.projections[id].fingerprint,
        alone.projections[alone.counter_id("followers").unwrap()].fingerprint
    );
    // In one file, the same counter rides on the edge.
    let one = format!("{edges}\n[[projections]]\nname = \"followers\"\nkind = \"counter\"\nsource = \"follow\"\nof = {{ userId = \"{{followeeId}}\" }}\n");
    let single = Spec::from_toml(&one, "one.toml").unwrap();
    let id = single.counter_id("followers").unwrap();
    assert!(matches!(
        &single.projections[id].kind,
        crate::spec::ProjectionKind::Counter(c) if matches!(c.marker, crate::spec::Marker::Edge(_))
    ));
}

#[test]
fn tables_named_otherwise_are_routed_by_their_actual_names() {
    let other = SOCIAL.replace("name = \"Shared\"", "name = \"Social\"");
    let mut set = SpecSet::from_texts(&texts(&[("p.toml", PROFILES), ("s.toml", &other)])).unwrap();
    set.rename_tables("Social=Social-prod, Shared = Shared-prod")
        .unwrap();
    assert_eq!(set.for_table("Social-prod").unwrap().service, "social");
    assert_eq!(set.for_table("Shared-prod").unwrap().service, "profiles");
    assert!(set.for_table("Social").is_none());
    let error = set.rename_tables("Nope=x").unwrap_err();
    assert!(
        error.contains("`Nope` is no table") && error.contains("`Social-prod`"),
        "{error}"
    );
    assert!(set
        .rename_tables("Social-prod")
        .unwrap_err()
        .contains("SPEC_TABLE=ACTUAL_TABLE"));
}
