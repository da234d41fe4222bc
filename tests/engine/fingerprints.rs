//! The fingerprints of projections, pinned: the lifecycle registry stores
//! them, so a definition that did not change must keep its fingerprint
//! across releases and reorganizations of the code. Each is the FNV-1a of
//! the canonical JSON of the raw projection (with what it reads and where
//! it is stored mixed in), so the JSON a raw projection serializes to is
//! pinned here too, and the TOML the registry keeps of a spec.

use std::sync::Arc;

use ddb_projector::plan::{CustomOp, CustomProjection, EntityChange};
use ddb_projector::spec::raw::RawSpec;
use ddb_projector::spec::{Spec, SpecSet};
use expect_test::{expect, Expect};

use super::util::repo_path;

/// A spec using every kind and every option a kind has: templates with
/// transforms, conditions of every value type, counters riding on edges
/// and with markers of their own, a counter of no variables, a counter
/// rebuilt beside its old version, rollups, an aggregate of every
/// function, and the TTL attribute and indexes of the table.
const EVERY_KIND: &str = r#"
service = "every-kind"

[table]
name = "EveryKind"
partition_key = "PK"
sort_key = "SK"
ttl_attribute = "expiresAt"

[[table.gsi]]
name = "GSI1"
partition_key = "GSI1PK"
sort_key = "GSI1SK"

[[table.gsi]]
name = "GSI2"
partition_key = "GSI2PK"

[entities.user]
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

[entities.member]
pk = "GROUP#{groupId}"
sk = "MEMBER#{userId}"

[entities.membership]
pk = "USER#{userId}"
sk = "GROUP#{groupId}"

[entities.group]
pk = "GROUP#{groupId}"
sk = "META"

[entities.post]
pk = "POST#{postId}"
sk = "META"

[entities.like]
pk = "POST#{postId}"
sk = "LIKE#{userId}"

[entities.campaign]
pk = "CAMPAIGN#{campaignId}"
sk = "METADATA"

[entities.perf]
pk = "CAMPAIGN#{campaignId}"
sk = "PERF#{date}"

[[projections]]
name = "email-keys"
kind = "index-keys"
entity = "email"
set = { GSI1PK = "EMAIL#{lower(trim(address))}", GSI1SK = "USER#{userId}", GSI2PK = "RANK#{pad(rank, 6)}#{upper(domain)}" }

[[projections]]
name = "primary-email"
kind = "denormalize"
source = "email"
target = "user"
when = { isPrimary = true }
copy = { email = "{address}", emailId = "{emailId}", label = "{lower(address)} <{userId}>" }

[[projections]]
name = "followed-by"
kind = "inverse-edge"
source = "follow"
target = "followed_by"
copy = { followedAt = "{followedAt}" }

[[projections]]
name = "memberships"
kind = "inverse-edge"
source = "member"
target = "membership"
when = { active = true }

[[projections]]
name = "followers"
kind = "counter"
source = "follow"
of = { userId = "{followeeId}" }
shards = 8

[[projections]]
name = "following"
kind = "counter"
source = "follow"
of = { userId = "{followerId}" }

[[projections]]
name = "active-members"
kind = "counter"
source = "member"
of = { groupId = "{groupId}" }
when = { active = true }
shards = 2

[[projections]]
name = "likes"
kind = "counter"
source = "like"
of = { postId = "{postId}" }
when = { kind = "up", weight = 1, score = 1.5, counted = true }
shards = 3
storage = "likes~2"

[[projections]]
name = "likes~1"
kind = "counter"
source = "like"
of = { postId = "{postId}" }
when = { kind = "up", weight = 1 }
shards = 3
storage = "likes~1"

[[projections]]
name = "all-likes"
kind = "counter"
source = "like"
of = {}
shards = 1

[[projections]]
name = "followers-count"
kind = "rollup"
counter = "followers"
target = "user"
attribute = "followersCount"

[[projections]]
name = "member-count"
kind = "rollup"
counter = "active-members"
target = "group"
attribute = "members"

[[projections]]
name = "likes-count"
kind = "rollup"
counter = "likes"
target = "post"
attribute = "likeCount"

[[projections]]
name = "campaign-totals"
kind = "aggregate"
source = "perf"
target = "campaign"
when = { valid = true, source = "api" }
set = { spend = "sum(spend)", days = "count()", first = "min(date)", last = "max(date)", top = "max(clicks)", low = "min(cost)" }
"#;

/// A table without a sort key: keys and counter shards have none.
const NO_SORT_KEY: &str = r#"
service = "flat"

[table]
name = "Flat"
partition_key = "id"
sort_key = ""

[entities.user]
pk = "USER#{userId}"

[entities.settings]
pk = "SETTINGS#{userId}"

[entities.vote]
pk = "VOTE#{pollId}#{userId}"

[[projections]]
name = "user-keys"
kind = "index-keys"
entity = "user"
set = { byName = "NAME#{name}" }

[[projections]]
name = "user-theme"
kind = "denormalize"
source = "settings"
target = "user"
copy = { theme = "{theme}" }

[[projections]]
name = "votes"
kind = "counter"
source = "vote"
of = { pollId = "{pollId}" }
when = { yes = true }
"#;

/// Two services on one table: a counter rides only on an edge of its own
/// service, so `followers` keeps markers of its own here.
const EDGES: &str = r#"
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

const COUNTS: &str = r#"
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

/// A projection written in Rust: its fingerprint covers its name, source
/// entity and version.
#[derive(Debug)]
struct Stamp;

impl CustomProjection for Stamp {
    fn name(&self) -> &str {
        "post-stamp"
    }
    fn source_entity(&self) -> &str {
        "post"
    }
    fn plan(&self, _change: &EntityChange<'_>) -> Result<Vec<CustomOp>, String> {
        Ok(Vec::new())
    }
    fn version(&self) -> u32 {
        3
    }
}

/// Every projection's fingerprint and the spec's, one per line.
fn fingerprints(spec: &Spec) -> String {
    let mut out = format!(
        "{}: {:016x}\n",
        spec.file.rsplit('/').next().unwrap_or(&spec.file),
        spec.projections_fingerprint()
    );
    for projection in &spec.projections {
        out.push_str(&format!(
            "  {} {:016x}\n",
            projection.name, projection.fingerprint
        ));
    }
    out
}

fn check(spec: &Spec, expect: Expect) {
    expect.assert_eq(&fingerprints(spec));
}

#[test]
fn shipped_specs_keep_their_fingerprints() {
    let mut out = String::new();
    for name in ["ads-platform", "social-service", "user-service"] {
        let path = repo_path(&format!("projections/{name}.toml"));
        out.push_str(&fingerprints(&Spec::from_file(&path).expect("compiles")));
    }
    expect![[r#"
        ads-platform.toml: a6bfed491de17812
          campaign-gsi1-keys 0744d3b9bcb1e8c6
          campaign-totals 38b471ed788e6695
        social-service.toml: 49c9f1a51569d9ef
          followed-by 77b5a745abf81084
          followers d7ea6e65bfd4b8e3
          following 3774f441ecfc71a1
          followers-count b30f32839dec8138
          following-count 86763dd09f7fb897
          achievement-leaderboard-keys bb6a3b71846d4721
        user-service.toml: 8e8321165d60ae6c
          email-gsi1-keys 6add413aa714eaaf
          profile-primary-email 8535c2da664516d3
    "#]]
    .assert_eq(&out);
}

#[test]
fn every_kind_and_option_keeps_its_fingerprint() {
    let raw: RawSpec = toml::from_str(EVERY_KIND).expect("parses");
    let spec = Spec::compile(raw, "every-kind.toml", vec![Arc::new(Stamp)]).expect("compiles");
    check(
        &spec,
        expect![[r#"
        every-kind.toml: 2aba649d41778260
          email-keys 5fcf0fe51e8c7c42
          primary-email 88f45ae78c6f6b52
          followed-by 77b5a745abf81084
          memberships ec289258782d8995
          followers d7ea6e65bfd4b8e3
          following 3774f441ecfc71a1
          active-members dfa376c9dc96d75e
          likes 1a9753a464c6f1a9
          likes~1 84affba256b274cb
          all-likes 47139fbf6e7f7679
          followers-count bf7ec440959e5632
          member-count 11f214e197022d27
          likes-count 57c4608d6a655916
          campaign-totals 67c6f5d289d101a5
          post-stamp 7bde3a2e0f4b7341
    "#]],
    );
    let spec = Spec::from_toml(NO_SORT_KEY, "flat.toml").expect("compiles");
    check(
        &spec,
        expect![[r#"
        flat.toml: c51a4db43895f4f7
          user-keys 7fa6869376a73d55
          user-theme 67fc08c4ed9d01f8
          votes 4f0991c3f7b2c34a
    "#]],
    );
}

#[test]
fn composed_specs_keep_their_fingerprints() {
    let set = SpecSet::from_texts(&[
        ("edges.toml".to_string(), EDGES.to_string()),
        ("counts.toml".to_string(), COUNTS.to_string()),
    ])
    .expect("composes");
    check(
        &set.specs()[0],
        expect![[r#"
        edges.toml + counts.toml: 258eb3dda3ff4cba
          followed-by 800e4bface5b30e7
          followers 75cf1dc61533f43d
    "#]],
    );
}

/// What the fingerprints hash: each raw projection's canonical JSON, and
/// the TOML the registry keeps of a spec.
#[test]
fn raw_projections_serialize_as_before() {
    let raw: RawSpec = toml::from_str(EVERY_KIND).expect("parses");
    let json: Vec<String> = raw
        .projections
        .iter()
        .map(|p| serde_json::to_string(p).expect("serializes"))
        .collect();
    expect![[r#"
        {"kind":"index-keys","name":"email-keys","entity":"email","set":{"GSI1PK":"EMAIL#{lower(trim(address))}","GSI1SK":"USER#{userId}","GSI2PK":"RANK#{pad(rank, 6)}#{upper(domain)}"}}
        {"kind":"denormalize","name":"primary-email","source":"email","target":"user","when":{"isPrimary":true},"copy":{"email":"{address}","emailId":"{emailId}","label":"{lower(address)} <{userId}>"}}
        {"kind":"inverse-edge","name":"followed-by","source":"follow","target":"followed_by","when":{},"copy":{"followedAt":"{followedAt}"}}
        {"kind":"inverse-edge","name":"memberships","source":"member","target":"membership","when":{"active":true},"copy":{}}
        {"kind":"counter","name":"followers","source":"follow","of":{"userId":"{followeeId}"},"when":{},"shards":8}
        {"kind":"counter","name":"following","source":"follow","of":{"userId":"{followerId}"},"when":{},"shards":4}
        {"kind":"counter","name":"active-members","source":"member","of":{"groupId":"{groupId}"},"when":{"active":true},"shards":2}
        {"kind":"counter","name":"likes","source":"like","of":{"postId":"{postId}"},"when":{"counted":true,"kind":"up","score":1.5,"weight":1},"shards":3,"storage":"likes~2"}
        {"kind":"counter","name":"likes~1","source":"like","of":{"postId":"{postId}"},"when":{"kind":"up","weight":1},"shards":3,"storage":"likes~1"}
        {"kind":"counter","name":"all-likes","source":"like","of":{},"when":{},"shards":1}
        {"kind":"rollup","name":"followers-count","counter":"followers","target":"user","attribute":"followersCount"}
        {"kind":"rollup","name":"member-count","counter":"active-members","target":"group","attribute":"members"}
        {"kind":"rollup","name":"likes-count","counter":"likes","target":"post","attribute":"likeCount"}
        {"kind":"aggregate","name":"campaign-totals","source":"perf","target":"campaign","when":{"source":"api","valid":true},"set":{"days":"count()","first":"min(date)","last":"max(date)","low":"min(cost)","spend":"sum(spend)","top":"max(clicks)"}}"#]].assert_eq(&json.join("\n"));
    let definitions: Vec<String> = raw
        .projections
        .iter()
        .map(|p| serde_json::to_string(&p.definition()).expect("serializes"))
        .collect();
    expect![[r#"
        {"kind":"index-keys","name":"email-keys","entity":"email","set":{"GSI1PK":"EMAIL#{lower(trim(address))}","GSI1SK":"USER#{userId}","GSI2PK":"RANK#{pad(rank, 6)}#{upper(domain)}"}}
        {"kind":"denormalize","name":"primary-email","source":"email","target":"user","when":{"isPrimary":true},"copy":{"email":"{address}","emailId":"{emailId}","label":"{lower(address)} <{userId}>"}}
        {"kind":"inverse-edge","name":"followed-by","source":"follow","target":"followed_by","when":{},"copy":{"followedAt":"{followedAt}"}}
        {"kind":"inverse-edge","name":"memberships","source":"member","target":"membership","when":{"active":true},"copy":{}}
        {"kind":"counter","name":"followers","source":"follow","of":{"userId":"{followeeId}"},"when":{},"shards":8}
        {"kind":"counter","name":"following","source":"follow","of":{"userId":"{followerId}"},"when":{},"shards":4}
        {"kind":"counter","name":"active-members","source":"member","of":{"groupId":"{groupId}"},"when":{"active":true},"shards":2}
        {"kind":"counter","name":"likes","source":"like","of":{"postId":"{postId}"},"when":{"counted":true,"kind":"up","score":1.5,"weight":1},"shards":3}
        {"kind":"counter","name":"likes","source":"like","of":{"postId":"{postId}"},"when":{"kind":"up","weight":1},"shards":3}
        {"kind":"counter","name":"all-likes","source":"like","of":{},"when":{},"shards":1}
        {"kind":"rollup","name":"followers-count","counter":"followers","target":"user","attribute":"followersCount"}
        {"kind":"rollup","name":"member-count","counter":"active-members","target":"group","attribute":"members"}
        {"kind":"rollup","name":"likes-count","counter":"likes","target":"post","attribute":"likeCount"}
        {"kind":"aggregate","name":"campaign-totals","source":"perf","target":"campaign","when":{"source":"api","valid":true},"set":{"days":"count()","first":"min(date)","last":"max(date)","low":"min(cost)","spend":"sum(spend)","top":"max(clicks)"}}"#]].assert_eq(&definitions.join("\n"));
    expect![[r#"
        service = "every-kind"
        invariants = []

        [table]
        name = "EveryKind"
        partition_key = "PK"
        sort_key = "SK"
        ttl_attribute = "expiresAt"

        [[table.gsi]]
        name = "GSI1"
        partition_key = "GSI1PK"
        sort_key = "GSI1SK"

        [[table.gsi]]
        name = "GSI2"
        partition_key = "GSI2PK"

        [entities.campaign]
        pk = "CAMPAIGN#{campaignId}"
        sk = "METADATA"

        [entities.email]
        pk = "USER#{userId}"
        sk = "EMAIL#{emailId}"

        [entities.follow]
        pk = "USER#{followerId}"
        sk = "FOLLOWS#{followeeId}"

        [entities.followed_by]
        pk = "USER#{followeeId}"
        sk = "FOLLOWED_BY#{followerId}"

        [entities.group]
        pk = "GROUP#{groupId}"
        sk = "META"

        [entities.like]
        pk = "POST#{postId}"
        sk = "LIKE#{userId}"

        [entities.member]
        pk = "GROUP#{groupId}"
        sk = "MEMBER#{userId}"

        [entities.membership]
        pk = "USER#{userId}"
        sk = "GROUP#{groupId}"

        [entities.perf]
        pk = "CAMPAIGN#{campaignId}"
        sk = "PERF#{date}"

        [entities.post]
        pk = "POST#{postId}"
        sk = "META"

        [entities.user]
        pk = "USER#{userId}"
        sk = "PROFILE"

        [[projections]]
        kind = "index-keys"
        name = "email-keys"
        entity = "email"

        [projections.set]
        GSI1PK = "EMAIL#{lower(trim(address))}"
        GSI1SK = "USER#{userId}"
        GSI2PK = "RANK#{pad(rank, 6)}#{upper(domain)}"

        [[projections]]
        kind = "denormalize"
        name = "primary-email"
        source = "email"
        target = "user"

        [projections.when]
        isPrimary = true

        [projections.copy]
        email = "{address}"
        emailId = "{emailId}"
        label = "{lower(address)} <{userId}>"

        [[projections]]
        kind = "inverse-edge"
        name = "followed-by"
        source = "follow"
        target = "followed_by"

        [projections.when]

        [projections.copy]
        followedAt = "{followedAt}"

        [[projections]]
        kind = "inverse-edge"
        name = "memberships"
        source = "member"
        target = "membership"

        [projections.when]
        active = true

        [projections.copy]

        [[projections]]
        kind = "counter"
        name = "followers"
        source = "follow"
        shards = 8

        [projections.of]
        userId = "{followeeId}"

        [projections.when]

        [[projections]]
        kind = "counter"
        name = "following"
        source = "follow"
        shards = 4

        [projections.of]
        userId = "{followerId}"

        [projections.when]

        [[projections]]
        kind = "counter"
        name = "active-members"
        source = "member"
        shards = 2

        [projections.of]
        groupId = "{groupId}"

        [projections.when]
        active = true

        [[projections]]
        kind = "counter"
        name = "likes"
        source = "like"
        shards = 3
        storage = "likes~2"

        [projections.of]
        postId = "{postId}"

        [projections.when]
        counted = true
        kind = "up"
        score = 1.5
        weight = 1

        [[projections]]
        kind = "counter"
        name = "likes~1"
        source = "like"
        shards = 3
        storage = "likes~1"

        [projections.of]
        postId = "{postId}"

        [projections.when]
        kind = "up"
        weight = 1

        [[projections]]
        kind = "counter"
        name = "all-likes"
        source = "like"
        shards = 1

        [projections.of]

        [projections.when]

        [[projections]]
        kind = "rollup"
        name = "followers-count"
        counter = "followers"
        target = "user"
        attribute = "followersCount"

        [[projections]]
        kind = "rollup"
        name = "member-count"
        counter = "active-members"
        target = "group"
        attribute = "members"

        [[projections]]
        kind = "rollup"
        name = "likes-count"
        counter = "likes"
        target = "post"
        attribute = "likeCount"

        [[projections]]
        kind = "aggregate"
        name = "campaign-totals"
        source = "perf"
        target = "campaign"

        [projections.when]
        source = "api"
        valid = true

        [projections.set]
        days = "count()"
        first = "min(date)"
        last = "max(date)"
        low = "min(cost)"
        spend = "sum(spend)"
        top = "max(clicks)"
    "#]]
    .assert_eq(&toml::to_string(&raw).expect("serializes"));
}
