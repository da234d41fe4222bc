//! Throughput of decoding Lambda events and planning their records.
//!
//! Events of 1,000 and 10,000 records are generated over the shipped specs:
//! a realistic mix of email inserts and primary switches, profile edits,
//! follows and unfollows (some by TTL), achievements, campaigns, and items
//! no projection reads (the projector's own writes coming back, counter
//! shards, ad performance rows). Each table's records form one event, as a
//! Lambda event source mapping delivers them.
//!
//! Three benchmarks per event size: `decode`, `decode+plan` (the pipeline:
//! each event decoded, then its records planned), and `plan` alone over
//! records decoded once before timing. `plan` reads records that decoding
//! left in cache no more (10,000 records are about 10 MB), so it costs more
//! per record than the difference between the other two; it isolates
//! planning from decoding's noise when comparing planner changes.
//!
//! Each benchmark runs twice: `plan/...` in wall-clock time and `plan-cpu/...`
//! in the CPU time of the benchmarking thread, which is what one core does
//! when the machine is busy with other work (a 2-core CI box building).
//!
//! A third group, `plan-floor/...` (CPU time, 10,000 records), measures
//! what any decoder built on `serde_json` pays on the same events, to show
//! how far the record model is from the parser's limit:
//!
//! - `json-skip`: reading the event without keeping anything;
//! - `borrowed-images`: records whose images are lists of (name, value)
//!   pairs borrowed from the event, no map and no owned string: the cost of
//!   a zero-copy record model before any planning.
//!
//! `cargo bench --bench plan -- --warm-up-time 1 --measurement-time 5`

use std::hint::black_box;
use std::path::Path;

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ddb_projector::decode::decode_lambda_event;
use ddb_projector::plan::plan_record;
use ddb_projector::spec::Spec;
use serde_json::{json, Map, Value};

/// A small deterministic generator (64-bit LCG), so every run plans the
/// same events without a dependency.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn s(value: impl Into<String>) -> Value {
    json!({ "S": value.into() })
}

fn n(value: impl ToString) -> Value {
    json!({ "N": value.to_string() })
}

fn b(value: bool) -> Value {
    json!({ "BOOL": value })
}

fn image(pk: &str, sk: &str, attributes: &[(&str, Value)]) -> Value {
    let mut map = Map::new();
    map.insert("PK".into(), s(pk));
    map.insert("SK".into(), s(sk));
    for (name, value) in attributes {
        map.insert((*name).into(), value.clone());
    }
    Value::Object(map)
}

/// Builds the Lambda records of one table.
struct EventWriter {
    table: &'static str,
    records: Vec<Value>,
    seq: u64,
}

impl EventWriter {
    fn new(table: &'static str) -> EventWriter {
        EventWriter {
            table,
            records: Vec::new(),
            seq: 0,
        }
    }

    fn push(&mut self, name: &str, old: Option<Value>, new: Option<Value>, ttl: bool) {
        self.seq += 1;
        let any = new.as_ref().or(old.as_ref()).expect("an image");
        let keys = json!({ "PK": any["PK"], "SK": any["SK"] });
        let mut change = json!({
            "ApproximateCreationDateTime": 1_795_326_360,
            "Keys": keys,
            "SequenceNumber": format!("49668{:016}", self.seq),
            "SizeBytes": 180,
            "StreamViewType": "NEW_AND_OLD_IMAGES",
        });
        if let Some(old) = old {
            change["OldImage"] = old;
        }
        if let Some(new) = new {
            change["NewImage"] = new;
        }
        let mut record = json!({
            "eventID": format!("{:032x}", self.seq),
            "eventName": name,
            "eventVersion": "1.1",
            "eventSource": "aws:dynamodb",
            "awsRegion": "eu-west-1",
            "dynamodb": change,
            "eventSourceARN": format!(
                "arn:aws:dynamodb:eu-west-1:123456789012:table/{}/stream/2026-01-01T00:00:00.000",
                self.table
            ),
        });
        if ttl {
            record["userIdentity"] =
                json!({ "type": "Service", "principalId": "dynamodb.amazonaws.com" });
        }
        self.records.push(record);
    }

    fn bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&json!({ "Records": self.records })).unwrap()
    }
}

fn email(user: u64, id: u64, primary: bool, extra: &[(&str, Value)]) -> Value {
    let address = format!("User.{user}.{id}@Example.com");
    let mut attributes = vec![
        ("userId", s(format!("u{user}"))),
        ("emailId", s(format!("e{id}"))),
        ("email", s(address.clone())),
        ("isPrimary", b(primary)),
        ("isVerified", b(true)),
        ("createdAt", s("2026-01-15T09:30:00.000Z")),
        ("GSI1PK", s(format!("EMAIL#{}", address.to_lowercase()))),
        ("GSI1SK", s(format!("USER#u{user}"))),
    ];
    attributes.extend_from_slice(extra);
    image(
        &format!("USER#u{user}"),
        &format!("EMAIL#e{id}"),
        &attributes,
    )
}

fn user_service_records(out: &mut EventWriter, rng: &mut Lcg, count: usize) {
    while out.records.len() < count {
        let user = rng.below(100_000);
        let id = rng.below(5);
        match rng.below(10) {
            // A new address, primary one time in three.
            0 | 1 => {
                let mut new = email(user, id, rng.below(3) == 0, &[]);
                let map = new.as_object_mut().unwrap();
                map.remove("GSI1PK");
                map.remove("GSI1SK");
                out.push("INSERT", None, Some(new), false);
            }
            // A primary switch: two updates.
            2 | 3 => {
                let other = (id + 1) % 5;
                out.push(
                    "MODIFY",
                    Some(email(user, id, true, &[])),
                    Some(email(user, id, false, &[])),
                    false,
                );
                out.push(
                    "MODIFY",
                    Some(email(user, other, false, &[])),
                    Some(email(user, other, true, &[])),
                    false,
                );
            }
            // Verification: nothing a projection reads.
            4 => out.push(
                "MODIFY",
                Some(email(user, id, false, &[])),
                Some(email(
                    user,
                    id,
                    false,
                    &[("verifiedAt", s("2026-03-01T10:00:00Z"))],
                )),
                false,
            ),
            5 => out.push(
                "REMOVE",
                Some(email(user, id, rng.below(4) == 0, &[])),
                None,
                false,
            ),
            // Profile edits; one in four overwrites the denormalized email.
            _ => {
                let profile = |first: &str, address: &str| {
                    image(
                        &format!("USER#u{user}"),
                        "PROFILE",
                        &[
                            ("userId", s(format!("u{user}"))),
                            ("firstName", s(first)),
                            ("lastName", s("Smith")),
                            ("status", s("ACTIVE")),
                            ("version", n(3)),
                            ("email", s(address)),
                            ("updatedAt", s("2026-02-01T08:00:00.000Z")),
                        ],
                    )
                };
                let address = if rng.below(4) == 0 {
                    "typo@example.com"
                } else {
                    "user@example.com"
                };
                out.push(
                    "MODIFY",
                    Some(profile("Alice", "user@example.com")),
                    Some(profile("Alicia", address)),
                    false,
                );
            }
        }
    }
    out.records.truncate(count);
}

fn social_service_records(out: &mut EventWriter, rng: &mut Lcg, count: usize) {
    while out.records.len() < count {
        let a = rng.below(50_000);
        // A few celebrities get most follows.
        let b_user = if rng.below(2) == 0 {
            rng.below(20)
        } else {
            rng.below(50_000)
        };
        let follow = |at: &str| {
            image(
                &format!("USER#u{a}"),
                &format!("FOLLOWS#u{b_user}"),
                &[
                    ("followerId", s(format!("u{a}"))),
                    ("followeeId", s(format!("u{b_user}"))),
                    ("followedAt", s(at)),
                    ("ttl", n(1_900_000_000)),
                ],
            )
        };
        match rng.below(10) {
            0..=2 => out.push("INSERT", None, Some(follow("2026-03-01T10:00:00Z")), false),
            3 => out.push("REMOVE", Some(follow("2026-03-01T10:00:00Z")), None, false),
            4 => out.push("REMOVE", Some(follow("2026-03-01T10:00:00Z")), None, true),
            5 => out.push(
                "MODIFY",
                Some(follow("2026-03-01T10:00:00Z")),
                Some(follow("2026-03-02T10:00:00Z")),
                false,
            ),
            6 | 7 => {
                let score = rng.below(10_000);
                let achievement = |score: u64, derived: bool| {
                    let mut attributes = vec![
                        ("userId", s(format!("u{a}"))),
                        ("badgeId", s("streak-30")),
                        ("tier", s("GOLD")),
                        ("score", n(score)),
                        ("earnedAt", s("2026-03-01T10:00:00Z")),
                    ];
                    if derived {
                        attributes.push(("GSI1PK", s("TIER#GOLD")));
                        attributes.push(("GSI1SK", s(format!("SCORE#{score:04}"))));
                    }
                    image(&format!("USER#u{a}"), "ACHIEVEMENT#streak-30", &attributes)
                };
                if rng.below(2) == 0 {
                    out.push("INSERT", None, Some(achievement(score, false)), false);
                } else {
                    out.push(
                        "MODIFY",
                        Some(achievement(score / 2, true)),
                        Some(achievement(score, true)),
                        false,
                    );
                }
            }
            // The projector's own writes coming back through the stream.
            8 => out.push(
                "INSERT",
                None,
                Some(image(
                    &format!("USER#u{b_user}"),
                    &format!("FOLLOWED_BY#u{a}"),
                    &[("followedAt", s("2026-03-01T10:00:00Z"))],
                )),
                false,
            ),
            _ => {
                let shard = |count: u64| {
                    image(
                        &format!("COUNTER#followers#u{b_user}#{}", a % 8),
                        "COUNTER",
                        &[("count", n(count))],
                    )
                };
                out.push("MODIFY", Some(shard(41)), Some(shard(42)), false);
            }
        }
    }
    out.records.truncate(count);
}

fn ads_platform_records(out: &mut EventWriter, rng: &mut Lcg, count: usize) {
    const STATUSES: [&str; 3] = ["ENABLED", "PAUSED", "ARCHIVED"];
    while out.records.len() < count {
        let campaign = rng.below(20_000);
        let profile = campaign / 10;
        let status = STATUSES[rng.below(3) as usize];
        let metadata = |status: &str, derived: bool| {
            let mut attributes = vec![
                ("campaignId", s(format!("c{campaign}"))),
                ("profileId", s(format!("p{profile}"))),
                ("status", s(status)),
                ("name", s("Spring sale")),
                ("budget", n(2500)),
            ];
            if derived {
                attributes.push(("GSI1PK", s(format!("PROFILE#p{profile}"))));
                attributes.push(("GSI1SK", s(format!("STATUS#{status}#CAMPAIGN#c{campaign}"))));
            }
            image(&format!("CAMPAIGN#c{campaign}"), "METADATA", &attributes)
        };
        match rng.below(6) {
            0 => out.push("INSERT", None, Some(metadata(status, false)), false),
            1 | 2 => out.push(
                "MODIFY",
                Some(metadata("ENABLED", true)),
                Some(metadata(status, true)),
                false,
            ),
            3 => out.push(
                "MODIFY",
                Some(image(
                    &format!("CAMPAIGN#c{campaign}"),
                    &format!("ADGROUP#g{}", rng.below(5)),
                    &[("bid", n(120))],
                )),
                Some(image(
                    &format!("CAMPAIGN#c{campaign}"),
                    &format!("ADGROUP#g{}", rng.below(5)),
                    &[("bid", n(140))],
                )),
                false,
            ),
            _ => out.push(
                "INSERT",
                None,
                Some(image(
                    &format!("CAMPAIGN#c{campaign}"),
                    &format!("PERF#2026-03-{:02}", 1 + rng.below(28)),
                    &[
                        ("impressions", n(rng.below(100_000))),
                        ("clicks", n(rng.below(1_000))),
                        ("spend", n("123.45")),
                    ],
                )),
                false,
            ),
        }
    }
    out.records.truncate(count);
}

fn spec(name: &str) -> Spec {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("projections/{name}.toml"));
    Spec::from_file(&path).unwrap_or_else(|errors| panic!("{errors}"))
}

/// `total` records as three events: (spec, event bytes) per table.
fn workload(total: usize) -> Vec<(Spec, Vec<u8>)> {
    let mut rng = Lcg(0x5eed_0000 + total as u64);
    let (users, social) = (total / 2, total * 7 / 20);
    let ads = total - users - social;
    let mut user_event = EventWriter::new("UserServiceTable");
    user_service_records(&mut user_event, &mut rng, users);
    let mut social_event = EventWriter::new("SocialServiceTable");
    social_service_records(&mut social_event, &mut rng, social);
    let mut ads_event = EventWriter::new("ads-platform");
    ads_platform_records(&mut ads_event, &mut rng, ads);
    vec![
        (spec("user-service"), user_event.bytes()),
        (spec("social-service"), social_event.bytes()),
        (spec("ads-platform"), ads_event.bytes()),
    ]
}

/// Checks once that the workload decodes and plans cleanly, and says what
/// it contains.
fn describe(total: usize, events: &[(Spec, Vec<u8>)]) {
    let (mut effects, mut skipped, mut bytes) = (0, 0, 0);
    for (spec, event) in events {
        bytes += event.len();
        for record in decode_lambda_event(event).unwrap() {
            let record = record.unwrap_or_else(|problem| panic!("{problem}"));
            let plan = plan_record(spec, &record, None);
            assert!(plan.errors.is_empty(), "{:?}", plan.errors);
            effects += plan.effects.len();
            skipped += usize::from(plan.skip.is_some());
        }
    }
    eprintln!(
        "workload {total}: {} KiB of events, {effects} effects, {skipped} records skipped",
        bytes / 1024
    );
}

/// CPU time of the calling thread, in nanoseconds
/// (`CLOCK_THREAD_CPUTIME_ID`; the scheduler's `schedstat` counter moves
/// only at ticks, and read a 2 ms iteration as zero).
struct ThreadCpuTime;

fn thread_cpu_ns() -> u64 {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `time` is a valid timespec for the call to fill.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut time) };
    assert_eq!(status, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    time.tv_sec as u64 * 1_000_000_000 + time.tv_nsec as u64
}

impl Measurement for ThreadCpuTime {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        thread_cpu_ns()
    }

    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns().saturating_sub(start)
    }

    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }

    fn zero(&self) -> u64 {
        0
    }

    fn to_f64(&self, value: &u64) -> f64 {
        *value as f64
    }

    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuFormatter
    }
}

/// Formats CPU nanoseconds like criterion formats wall time.
struct CpuFormatter;

impl ValueFormatter for CpuFormatter {
    fn scale_values(&self, ns: f64, values: &mut [f64]) -> &'static str {
        let (factor, unit) = match ns {
            ns if ns < 1e3 => (1.0, "ns cpu"),
            ns if ns < 1e6 => (1e-3, "µs cpu"),
            ns if ns < 1e9 => (1e-6, "ms cpu"),
            _ => (1e-9, "s cpu"),
        };
        values.iter_mut().for_each(|v| *v *= factor);
        unit
    }

    fn scale_throughputs(
        &self,
        ns: f64,
        throughput: &Throughput,
        values: &mut [f64],
    ) -> &'static str {
        let per = match throughput {
            Throughput::Elements(n) | Throughput::ElementsAndBytes { elements: n, .. } => *n,
            Throughput::Bytes(n) | Throughput::BytesDecimal(n) => *n,
            Throughput::Bits(n) => *n,
        } as f64;
        let rate = per * 1e9 / ns;
        let (factor, unit) = if rate >= 1e6 {
            (1e-6, "Melem/s cpu")
        } else {
            (1e-3, "Kelem/s cpu")
        };
        values.iter_mut().for_each(|v| *v = per * 1e9 / *v * factor);
        unit
    }

    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

fn bench_in<M: Measurement>(c: &mut Criterion<M>, name: &str) {
    let mut group = c.benchmark_group(name);
    for total in [1_000, 10_000] {
        let events = workload(total);
        describe(total, &events);
        group.throughput(Throughput::Elements(total as u64));
        group.bench_with_input(BenchmarkId::new("decode", total), &events, |b, events| {
            b.iter(|| {
                for (_, event) in events {
                    black_box(decode_lambda_event(black_box(event)).unwrap());
                }
            });
        });
        // Planning alone, over records decoded once (see the module
        // documentation for how it compares with the other two).
        let decoded: Vec<_> = events
            .iter()
            .map(|(spec, event)| {
                let records: Vec<_> = decode_lambda_event(event)
                    .unwrap()
                    .into_iter()
                    .map(Result::unwrap)
                    .collect();
                (spec, records)
            })
            .collect();
        group.bench_with_input(BenchmarkId::new("plan", total), &decoded, |b, decoded| {
            b.iter(|| {
                for (spec, records) in decoded {
                    for record in records {
                        black_box(plan_record(spec, black_box(record), None));
                    }
                }
            });
        });
        group.bench_with_input(
            BenchmarkId::new("decode+plan", total),
            &events,
            |b, events| {
                b.iter(|| {
                    for (spec, event) in events {
                        for record in decode_lambda_event(black_box(event)).unwrap() {
                            let record = record.unwrap();
                            black_box(plan_record(spec, &record, None));
                        }
                    }
                });
            },
        );
    }
    group.finish();
}

fn wall(c: &mut Criterion<WallTime>) {
    bench_in(c, "plan");
}

fn cpu(c: &mut Criterion<ThreadCpuTime>) {
    bench_in(c, "plan-cpu");
}

/// The parser's limit; see the module documentation.
mod floor {
    use std::borrow::Cow;
    use std::fmt;

    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
    use serde::Deserialize;

    use super::*;

    #[derive(Deserialize)]
    struct Event<'a> {
        #[serde(rename = "Records", borrow)]
        records: Vec<Record<'a>>,
    }

    #[derive(Deserialize)]
    struct Record<'a> {
        #[serde(rename = "eventID", borrow)]
        event_id: Cow<'a, str>,
        #[serde(rename = "eventName", borrow)]
        event_name: Cow<'a, str>,
        #[serde(borrow)]
        dynamodb: Change<'a>,
    }

    #[derive(Deserialize)]
    struct Change<'a> {
        #[serde(rename = "Keys", borrow)]
        keys: Image<'a>,
        #[serde(rename = "NewImage", borrow, default)]
        new_image: Option<Image<'a>>,
        #[serde(rename = "OldImage", borrow, default)]
        old_image: Option<Image<'a>>,
        #[serde(rename = "SequenceNumber", borrow)]
        sequence_number: Cow<'a, str>,
    }

    /// The workload's attribute types; `M` and `L` would nest the same way.
    #[derive(Deserialize)]
    enum Value<'a> {
        S(#[serde(borrow)] Cow<'a, str>),
        N(#[serde(borrow)] Cow<'a, str>),
        #[serde(rename = "BOOL")]
        Bool(bool),
    }

    struct Image<'a>(Vec<(Cow<'a, str>, Value<'a>)>);

    impl Image<'_> {
        /// Touches every name and value, as a planner reading it would.
        fn weight(&self) -> usize {
            let value = |value: &Value| match value {
                Value::S(text) | Value::N(text) => text.len(),
                Value::Bool(flag) => usize::from(*flag),
            };
            self.0.iter().map(|(name, v)| name.len() + value(v)).sum()
        }
    }

    impl<'de: 'a, 'a> Deserialize<'de> for Image<'a> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct ImageVisitor;
            impl<'de> Visitor<'de> for ImageVisitor {
                type Value = Image<'de>;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("an image")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Image<'de>, A::Error> {
                    let mut pairs = Vec::with_capacity(12);
                    while let Some(name) = map.next_key()? {
                        pairs.push((name, map.next_value()?));
                    }
                    Ok(Image(pairs))
                }
            }
            deserializer.deserialize_map(ImageVisitor)
        }
    }

    pub fn bench(c: &mut Criterion<ThreadCpuTime>) {
        let mut group = c.benchmark_group("plan-floor");
        let events = workload(10_000);
        group.throughput(Throughput::Elements(10_000));
        group.bench_function("json-skip", |b| {
            b.iter(|| {
                for (_, event) in &events {
                    black_box(serde_json::from_slice::<IgnoredAny>(event).unwrap());
                }
            });
        });
        group.bench_function("borrowed-images", |b| {
            b.iter(|| {
                for (_, event) in &events {
                    let event: Event = serde_json::from_slice(event).unwrap();
                    for record in &event.records {
                        black_box((&record.event_id, &record.event_name));
                        let change = &record.dynamodb;
                        black_box((change.keys.weight(), &change.sequence_number));
                        let images = [&change.new_image, &change.old_image];
                        black_box(
                            images
                                .iter()
                                .flat_map(|i| i.iter())
                                .map(Image::weight)
                                .sum::<usize>(),
                        );
                    }
                }
            });
        });
        group.finish();
    }
}

criterion_group!(wall_time, wall);
criterion_group! {
    name = cpu_time;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = cpu
}
criterion_group! {
    name = floor_time;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = floor::bench
}
criterion_main!(wall_time, cpu_time, floor_time);
